"""ScienceWorld (the ``scienceworld`` package: 30 elementary-science tasks simulated in Java) as an
agent-rl text environment, ``agent_rl/ScienceWorld-v0``.

One Java process per environment, started by the constructor through py4j (with constant identity
hash codes, see :data:`JAVA_OPTIONS`) and stopped by ``close()``; if it dies, the step raises and
the next reset starts a new one. A reset loads a task variation (tenths of a second to a few seconds, depending on the
task); a step is a few py4j round trips. Training seeds (< 2**31) play the task's *train*
variations, evaluation seeds play its *dev* (default) or *test* variations, so an evaluation seed
never reaches a training instance.

What reaches the simulator: ScienceWorld lists hundreds to thousands of valid actions per state,
and its own parser accepts many more phrasings of the same action (its gold action sequences use
such phrasings: ``focus on thermometer in inventory``, ``examine ...``, ``drop ...``). So a command
is passed to ScienceWorld's parser when it is lower-case ASCII words only, is not ``reset ...`` (the
one command that rewinds the task), and is either one of the listed valid actions or at least two
words long. The parser matches it against the action templates and the objects in view; input it
cannot match comes back invalid and leaves the state unchanged. Input it matches ambiguously gets
ScienceWorld's question ("enter the number for the action you intended"), whose numbers are then the
admissible actions; anything else cancels the question, as in ScienceWorld.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from hashlib import blake2b
from typing import Any

from agent_rl.envs.base import EnvUnavailableError, TextEnv, Transition

EVAL_SPLITS = ("dev", "test")
DEFAULT_TASK = "find-plant"
SIMPLIFICATIONS = (
    "easy",
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
)
ELECTRICAL_TASK_MARKERS = ("power-component", "conductivity")
"""Tasks whose names contain these need electrical actions (ScienceWorld refuses noElectricalAction)."""
JAVA_MISSING = (
    "ScienceWorld runs its simulator on Java (8 or newer), and no `java` executable was found on PATH. "
    "Install a Java runtime, e.g. `sudo apt-get install default-jre-headless` (Debian/Ubuntu), "
    "`sudo dnf install java-17-openjdk-headless` (Fedora), `brew install openjdk` (macOS) or "
    "`conda install -c conda-forge openjdk`, then check that `java -version` works in this shell."
)
JAVA_OPTIONS = ("-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2")
"""Constant identity hash codes: ScienceWorld names objects (and so its valid actions) while iterating
hash sets of objects, so with the JVM's default per-object hash codes the same state can list its
actions under different names from one load to the next (variations with several objects of one
kind, such as cups of paint, did); with a constant hash code, sets iterate in insertion order and
every load names alike."""
NO_MATCH_REPLIES = ("No known action matches that input.", "Unknown action.")
AMBIGUOUS_REPLY = "Ambiguous request"
ALWAYS_SHOWN = ("look around", "inventory", "wait1", "wait")
HIDDEN_TYPES = (
    "scienceworld.objects.agent.Agent",
    "scienceworld.objects.agent.InventoryContainer",
    "scienceworld.objects.substance.Air",
)
"""Object types whose actions are never shown: the player itself, its inventory (``move X to
inventory`` repeats ``pick up X``) and the air."""
ONE_OBJECT_LOOKS = ("look at ", "look in ")
VERB_ORDER = (
    "focus on",
    "pick up",
    "open",
    "close",
    "activate",
    "deactivate",
    "read",
    "use",
    "put down",
    "mix",
    "eat",
    "flush",
)
"""Order of the one-object actions within their tier: the verbs tasks need most come first."""
HIDDEN_ACTIONS = frozenset({"task", "reset task"})
"""``task`` repeats the task already in every prompt; ``reset task`` is never accepted."""
TASK_STOPWORDS = frozenset(
    "a an the your task is to of in on at it its for and or be by any also then first that this will "
    "with without which when you can cause take actions action thing things state focus move".split()
)
_WORD = re.compile(r"[a-z0-9]+")
_OPTION = re.compile(r"^\d+:\t", re.MULTILINE)
_SUBGOAL_FLAG = re.compile(r"^\d+\t(true|false)\t", re.MULTILINE)


def _type_ids(class_names: tuple[str, ...]) -> frozenset[int]:
    """ScienceWorld's numeric ids of these object classes (from the table it ships)."""
    from importlib.resources import files

    table = dict(
        line.split("\t")
        for line in files("scienceworld").joinpath("object_type_ids.tsv").read_text().splitlines()
        if "\t" in line
    )
    return frozenset(int(table[name]) for name in class_names)


def _tier(text: str, objects: list[str], task_words: set[str], held: set[str]) -> int:
    """Relevance tier of a valid action (lower is shown first); see ScienceWorldEnv.admissible_actions."""
    if text in ALWAYS_SHOWN:
        return 0
    if text.startswith(("teleport to ", "go to ")) and "door" not in objects[0].split():
        return 1
    if any(task_words & set(_WORD.findall(name)) for name in objects):
        return 2
    if objects and objects[0] in held:
        return 3
    if len(objects) == 1:
        return 5 if text.startswith(ONE_OBJECT_LOOKS) else 4
    return 6


def _verb_rank(text: str) -> int:
    return next((i for i, verb in enumerate(VERB_ORDER) if text.startswith(verb + " ")), len(VERB_ORDER))


def task_names() -> list[str]:
    """ScienceWorld's task names in its own numbering order (task ids 1-1, 1-2, ... 10-2)."""
    from scienceworld.constants import ID2TASK

    return list(ID2TASK.values())


def resolve_task(task: str | int) -> str:
    """A task name, ScienceWorld task id (``"4-3"``), paper name (``"Classification Find a plant"``)
    or index into :func:`task_names`, as ScienceWorld's canonical task name."""
    from scienceworld.utils import infer_task

    names = task_names()
    if isinstance(task, int) and not isinstance(task, bool):
        if 0 <= task < len(names):
            return names[task]
        raise ValueError(f"task index must be in [0, {len(names) - 1}], got {task}; tasks: {_numbered(names)}")
    if isinstance(task, str) and infer_task(task.strip()) in names:
        return infer_task(task.strip())
    raise ValueError(f"unknown ScienceWorld task {task!r}; valid tasks (name or index): {_numbered(names)}")


def _numbered(names: list[str]) -> str:
    return ", ".join(f"{i}={name}" for i, name in enumerate(names))


def check_simplifications(task: str, simplifications: str) -> str:
    """Validate ScienceWorld's comma-separated simplification string for ``task``."""
    if not isinstance(simplifications, str):
        raise ValueError(f"simplifications must be a comma-separated string, got {simplifications!r}")
    parts = [p.strip() for p in simplifications.split(",") if p.strip()]
    for part in parts:
        if part not in SIMPLIFICATIONS:
            raise ValueError(f"unknown ScienceWorld simplification {part!r}; valid: {', '.join(SIMPLIFICATIONS)}")
    if "easy" in parts and len(parts) > 1:
        raise ValueError("ScienceWorld's 'easy' preset cannot be combined; list the simplifications instead")
    if "noElectricalAction" in parts and any(marker in task for marker in ELECTRICAL_TASK_MARKERS):
        raise ValueError(f"task {task!r} needs electrical actions; drop noElectricalAction from simplifications")
    return ",".join(parts)


def find_java() -> str:
    """The ``java`` on PATH, which runs the simulator, or an error that says how to install one."""
    java = shutil.which("java")
    if java is None:
        raise EnvUnavailableError(JAVA_MISSING)
    return java


class ScienceWorldEnv(TextEnv):
    """ScienceWorld tasks through ScienceWorld's own Java simulator.

    Knobs:
        task: a task name (``"boil"``, ``"find-plant"``, ...), ScienceWorld task id (``"4-3"``) or
            index into :func:`task_names` (default ``"find-plant"``: short, and its gold path wins).
        simplifications: ScienceWorld's simplification string (default ``"easy"``, ScienceWorld's
            own preset: teleport to any room, doors start open, flower pots water themselves, and no
            electrical ``connect`` actions except on the four electrical tasks). Small models get
            short horizons and a valid-action list that is mostly about the task; ``""`` plays the
            full game; ``openContainers`` (not part of ``easy``, which cannot be combined with
            others) opens containers too.
        eval_split: ``"dev"`` (default) or ``"test"``: the variations evaluation seeds play.
        max_shown_actions: how many actions ``info["admissible_actions"]`` shows (default 50;
            ``None`` shows every valid action). See :meth:`admissible_actions` for the rule.
        max_steps: truncation (default 100).
        success_reward: extra reward on completion (default 0: the reward is the score).

    Reward: the change of ScienceWorld's score (0-100, clipped below at 0) divided by 100, so the
    rewards of an episode sum to (final score - score after the first look) / 100. ``won`` is
    ScienceWorld's task completion; a negative score (a failed task, e.g. focusing on the wrong
    object) terminates the episode without a win.
    """

    default_anchor_key = "state"
    split_by_instance_key = False  # training seeds play train variations, evaluation seeds dev/test ones

    def __init__(
        self,
        *,
        task: str | int = DEFAULT_TASK,
        simplifications: str = "easy",
        eval_split: str = "dev",
        max_shown_actions: int | None = 50,
        max_steps: int = 100,
        success_reward: float = 0.0,
        **reward_and_render: Any,
    ) -> None:
        super().__init__(max_steps=max_steps, success_reward=success_reward, **reward_and_render)
        self.task_name = resolve_task(task)
        self.simplifications = check_simplifications(self.task_name, simplifications)
        if eval_split not in EVAL_SPLITS:
            raise ValueError(f"eval_split must be one of {EVAL_SPLITS}, got {eval_split!r}")
        if max_shown_actions is not None and max_shown_actions < len(ALWAYS_SHOWN):
            raise ValueError(f"max_shown_actions must be None or >= {len(ALWAYS_SHOWN)}, got {max_shown_actions}")
        self.eval_split = eval_split
        self.max_shown_actions = max_shown_actions
        self._gateway = None  # py4j JavaGateway, owning the Java process
        self._server = None  # ScienceWorld's PythonInterface object on the Java side
        self.splits: dict[str, list[int]] = {}
        """ScienceWorld's train/dev/test variation indices of the task."""
        self._gold_paths: dict[int, list[str]] = {}
        self.variation = -1
        self._score = 0
        self._completed = False
        self._valid: dict[str, None] = {}  # ordered, with O(1) membership
        self._shown: list[str] = []
        self._anchor = ""
        self._question: tuple[str, int] | None = None  # (ambiguous command, number of options) awaiting an answer
        self._history: list[tuple[str, str, str]] = []  # (command, anchor before, anchor after) of executed commands
        self._hidden_type_ids = _type_ids(HIDDEN_TYPES)
        self._start()

    # ---- the Java process -------------------------------------------------------------------------
    def _start(self) -> None:
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
        from scienceworld.constants import BASEPATH, JAR_PATH

        port, process = launch_gateway(
            classpath=JAR_PATH,
            javaopts=list(JAVA_OPTIONS),
            java_path=find_java(),
            die_on_exit=True,
            cwd=BASEPATH,
            return_proc=True,
        )
        self._gateway = JavaGateway(
            gateway_parameters=GatewayParameters(port=port, auto_field=True), java_process=process
        )
        self._server = self._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        if not self.splits:
            self._call("load", self.task_name, 0, self.simplifications, False)
            self.splits = {
                "train": list(self._call("getVariationsTrain")),
                "dev": list(self._call("getVariationsDev")),
                "test": list(self._call("getVariationsTest")),
            }

    def _java_alive(self) -> bool:
        return self._gateway is not None and self._gateway.java_process.poll() is None

    def _stop(self) -> None:
        if self._gateway is None:
            return
        gateway, self._gateway, self._server = self._gateway, None, None
        process = gateway.java_process
        if process.poll() is None:
            gateway.shutdown()
            process.stdin.write(b"\n")  # the py4j gateway server exits on a line on its stdin
            process.stdin.flush()
            try:
                process.wait(timeout=5)
            except Exception:
                process.kill()
                process.wait()
        # Mark the client closed, so that proxies of Java objects collected later do not try to reach a
        # dead JVM (each try logs a traceback, from inside the garbage collector).
        gateway._gateway_client.is_connected = False
        gateway._gateway_client.close()

    def _call(self, method: str, *args: Any) -> Any:
        """Call ``method`` of the simulator's interface (or a static ``util.…`` method of its JVM); a
        dead Java process becomes a RuntimeError naming the way out."""
        from py4j.protocol import Py4JError

        try:
            target = self._gateway.jvm if method.startswith("util.") else self._server
            for name in method.split("."):
                target = getattr(target, name)
            return target(*args)
        except Py4JError as exc:
            alive = self._java_alive()
            self._stop()
            what = "failed" if alive else "stopped"
            raise RuntimeError(
                f"ScienceWorld's Java process {what} during {method}() (task {self.task_name}, variation "
                f"{self.variation}); this episode is lost, and the next reset() starts a new process"
            ) from exc

    # ---- the game -----------------------------------------------------------------------------------
    def _new_game(self, options: dict[str, Any] | None) -> str:
        if not self._java_alive():
            self._stop()
            self._start()
        variations = self.splits[self.eval_split if self.split == "eval" else "train"]
        variation = variations[int(self.np_random.integers(len(variations)))]
        return self._load(variation, gold=False)

    def _load(self, variation: int, gold: bool) -> str:
        self.variation = variation
        self._call("util.UniqueIdentifier.reset")  # equal object ids on every load of a variation
        self._call("load", self.task_name, variation, self.simplifications, gold)
        if gold:
            self._gold_paths[variation] = [str(a) for a in self._call("getGoldActionSequence")]
        observation = self._call("step", "look around")
        self.task = str(self._call("getTaskDescription"))
        self._history, self._question = [], None
        self._refresh()
        return observation

    def _refresh(self) -> None:
        """Read score, completion, valid actions and the anchor after a load or an executed command."""
        self._score = round(100 * float(self._call("getScore")))  # 0-100, as ScienceWorld's own API reports it
        self._completed = bool(self._call("getCompleted"))
        look = str(self._call("freeActionLook"))
        inventory = str(self._call("freeActionInventory"))
        progress = str(self._call("getGoalProgressStr"))
        valid = json.loads(self._call("getValidActionObjectCombinationsJSON"))["validActions"]
        names = json.loads(self._call("getPossibleObjectReferentLUTJSON"))
        self._valid = dict.fromkeys(entry["action"].lower() for entry in valid)
        self._shown = self._relevant_actions(valid, names, look, inventory)
        state = "\n".join(
            [
                self.task_name,
                str(self.variation),
                *sorted(_lines(look)),
                *sorted(_lines(inventory)),
                ",".join(_SUBGOAL_FLAG.findall(progress)),
            ]
        )
        self._anchor = blake2b(state.encode(), digest_size=16).hexdigest()

    def _relevant_actions(self, valid: list[dict], names: dict[str, str], look: str, inventory: str) -> list[str]:
        """The shown subset of the valid actions; see :meth:`admissible_actions`."""
        counts = Counter(entry["action"].lower() for entry in valid)
        referents = Counter(name.lower() for name in names.values())
        ambiguous = {name for name, n in referents.items() if n > 1}
        if look.count("A door to") > 1:  # ScienceWorld sometimes names several doors just "door"
            ambiguous.add("door")
        task_words = set(_WORD.findall(self.task.lower())) - TASK_STOPWORDS
        held = {_strip_article(line.lower()) for line in _lines(inventory)[1:]}
        ranked = []
        for entry in valid:
            text = entry["action"].lower()
            objects = [names.get(str(obj_id), "").lower() for obj_id in entry["obj_ids"]]
            hidden = self._hidden_type_ids.intersection(entry["type_ids"]) or ambiguous.intersection(objects)
            unparsable = not all(_WORD.fullmatch(word) for word in text.split())  # e.g. book titles in parentheses
            if text in HIDDEN_ACTIONS or counts[text] > 1 or hidden or unparsable:
                continue
            ranked.append((_tier(text, objects, task_words, held), _verb_rank(text), text))
        shown = [text for *_, text in sorted(set(ranked))]
        return shown if self.max_shown_actions is None else shown[: self.max_shown_actions]

    def _apply(self, command: str) -> Transition:
        rejection = self._gate(command)
        if rejection:
            return Transition(rejection, valid=False, error=rejection)
        before, previous, question = self.anchor(), self._score, self._question
        reply = str(self._call("step", command))
        if reply.startswith(NO_MATCH_REPLIES) and question is None:
            return Transition(
                f"'{command}' is not an action ScienceWorld understands here. {reply}", valid=False, error=reply
            )
        self._question = _question(command, reply)
        if self._question is None:
            self._refresh()  # also after a cancelled question: ScienceWorld counts that as a move
        self._history.append((command, before, self.anchor()))
        delta = (max(self._score, 0) - max(previous, 0)) / 100
        if question is not None and reply.startswith(NO_MATCH_REPLIES):
            message = f"That cancelled ScienceWorld's question: '{command}' is not one of its numbers. {reply}"
            return Transition(message, valid=False, error=reply, terminated=self._score < 0, reward=delta)
        return Transition(reply.replace(" (or blank to cancel)", ""), terminated=self._score < 0, reward=delta)

    def _gate(self, command: str) -> str | None:
        """Why ``command`` may not reach ScienceWorld's parser, or None when it may."""
        if not command:
            return "Please type a command."
        if self._question is not None and command in self.admissible_actions():
            return None
        if command.split()[0] == "reset":  # ScienceWorld lists "reset task" among the valid actions
            return "Resetting the task is disabled in this environment."
        if command in self._valid:
            return None
        if not all(_WORD.fullmatch(word) for word in command.split()):
            return f"'{command}' is not a ScienceWorld command: use lower-case letters, digits and spaces."
        if len(command.split()) < 2:
            return f"'{command}' is not a ScienceWorld action here; try one of: {', '.join(self._shown[:10])}."
        return None

    def admissible_actions(self) -> list[str]:
        """The actions the prompt shows: a capped, relevance-ordered subset of ScienceWorld's valid
        actions (any valid action, shown or not, is accepted).

        Dropped: ``task`` and ``reset task``; actions on the agent, its inventory or the air (by
        ScienceWorld object type); action strings ScienceWorld lists for more than one object
        combination, and actions on an object whose name several objects in view share (the parser
        would ask which one); actions with characters other than letters, digits and spaces (its
        parser rejects the book titles in parentheses that it lists). The rest are ordered by tier,
        then alphabetically: (0) ``look around``, ``inventory``, ``wait1``, ``wait``; (1) moving to
        a room (``teleport to`` / ``go to``, not to a door); (2) actions on an object whose name
        shares a word with the task description (stop words removed); (3) actions whose first
        object is in the inventory; (4) other one-object actions; (5) ``look at`` / ``look in`` an
        object; (6) other two-object actions. Within a tier, by verb (:data:`VERB_ORDER`: focus on,
        pick up, open, close, activate, ...), then alphabetically. The first ``max_shown_actions`` are shown.

        While ScienceWorld asks which of several matches an ambiguous action meant, the admissible
        actions are the numbers of its options.
        """
        if self._question is not None:
            return [str(i) for i in range(self._question[1])]
        return list(self._shown)

    def valid_actions(self) -> list[str]:
        """Every valid action ScienceWorld lists in the current state."""
        return list(self._valid)

    def anchor(self) -> str:
        """blake2b of the task, the variation, the sorted lines of the room description (location,
        objects in view and their states), the sorted inventory lines and the true/false flags of
        ScienceWorld's subgoals (and the pending ambiguous action, while ScienceWorld asks about
        one); never the step counter or the score text."""
        if self._question is None:
            return self._anchor
        return blake2b(f"{self._anchor}\n? {self._question[0]}".encode(), digest_size=16).hexdigest()

    def instance_key(self) -> str:
        """The task, its simplifications and the variation played."""
        return f"{self.task_name}|{self.simplifications}|{self.variation}"

    def is_won(self) -> bool:
        return self._completed

    def oracle(self) -> list[str]:
        """ScienceWorld's gold action sequence, continued from the current state.

        The gold path is a fixed plan from the start of the variation (generated on first use, by
        reloading the variation and replaying this episode's commands). While the commands taken so
        far are the gold path's first steps, interleaved with commands that left the anchor
        unchanged (looking, reading, ...), the rest of the gold path is returned. After any other
        command ScienceWorld cannot re-plan, and the whole gold path from the start is returned.
        """
        if self.variation not in self._gold_paths:
            self._regenerate_with_gold()
        gold = [step.lower() for step in self._gold_paths[self.variation]]
        position = 0
        for command, before, after in self._history:
            if position < len(gold) and command == gold[position]:
                position += 1
            elif before != after:
                return gold
        return gold[position:]

    def _regenerate_with_gold(self) -> None:
        """Reload the variation with its gold path and replay this episode's commands."""
        history, anchor, score = self._history, self.anchor(), self._score
        self._load(self.variation, gold=True)
        for command, _, _ in history:
            self._question = _question(command, str(self._call("step", command)))
        self._refresh()
        self._history = history
        if (self.anchor(), self._score) != (anchor, score):
            raise RuntimeError(
                f"replaying {len(history)} commands of variation {self.variation} did not reproduce the state"
            )

    def _info(self, valid: bool, error: str | None) -> dict[str, Any]:
        info = super()._info(valid, error)
        info["score"] = self._score
        info["variation"] = self.variation
        info["valid_action_count"] = len(self._valid)
        return info

    def close(self) -> None:
        self._stop()
        super().close()


def _question(command: str, reply: str) -> tuple[str, int] | None:
    """(command, number of options) when ScienceWorld answered ``command`` with its ambiguity question."""
    return (command, len(_OPTION.findall(reply))) if reply.startswith(AMBIGUOUS_REPLY) else None


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _strip_article(phrase: str) -> str:
    phrase = re.split(r"[,(]", phrase, maxsplit=1)[0].strip()
    for article in ("a ", "an ", "the "):
        if phrase.startswith(article):
            return phrase[len(article) :]
    return phrase
