"""Real TextWorld games (the ``textworld`` package) as an agent-rl text environment.

TextWorld ships a generator (``coin_collector``, ``treasure_hunter`` challenges and custom quests)
and a Z-machine runtime (Jericho). Generation costs seconds per game, so games are generated on
first use and cached on disk; a reset only restarts an already loaded interpreter (milliseconds).

The cache lives under ``$AGENT_RL_CACHE/textworld`` or, without that variable, under
``platformdirs.user_cache_dir("agent-rl")/textworld``. One folder per game, named by a hash of every
generation parameter plus the textworld version, holds the compiled ``game.z8`` and its ``game.json``.

Training seeds play a pool of games; evaluation seeds play a held-out pool of the same size, generated
with other internal seeds, in which every game differs from every training game (``game_identity``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass, replace
from hashlib import blake2b
from pathlib import Path
from typing import Any

import jericho
import platformdirs
import textworld
from filelock import FileLock
from textworld.challenges import coin_collector, treasure_hunter
from textworld.generator import QuestGenerationError, compile_game, make_game
from textworld.generator.game import GameOptions

from agent_rl.envs.base import TextEnv, Transition

KINDS = ("coin_collector", "treasure_hunter", "custom")
CUSTOM_LIMITS = {"world_size": (1, 100, 3), "nb_objects": (0, 100, 3), "quest_length": (1, 20, 3)}
"""(lowest, highest, default) of each knob of a custom game; generation time grows fast with quest_length."""
GENERATION_TRIES = 8
"""Internal seeds tried per game before giving up when TextWorld cannot build a quest."""
HELDOUT_TRIES = 16
"""Candidates generated per held-out game before giving up on one that equals no training game."""
INTERPRETER_SEED = 20240611
"""Fixed seed of the Z-machine's random generator, so replies never depend on the wall clock."""
CACHE_FORMAT = 1
"""Bumped when the cached layout changes, so that old entries are never read."""

REQUEST_INFOS = textworld.EnvInfos(
    admissible_commands=True, policy_commands=True, facts=True, objective=True, won=True, lost=True
)
# Commands that talk to the interpreter instead of the game world. They are never admissible, so
# they are never sent; naming them gets a clearer message than "not a command you can use here".
META_COMMANDS = frozenset(
    "again brief fullscore g help hint notify oops pronouns q quit restart restore save score script "
    "superbrief transcript undo unscript verbose version".split()
)
_PROMPT_OR_STATUS = re.compile(r"^\s*>")  # the input prompt, followed by the status line (room, score)
_END_OF_GAME_MENU = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"


def cache_dir() -> Path:
    """Where generated games are stored: ``$AGENT_RL_CACHE/textworld`` or the user cache dir."""
    root = os.environ.get("AGENT_RL_CACHE") or platformdirs.user_cache_dir("agent-rl")
    return Path(root) / "textworld"


@dataclass(frozen=True)
class GameSpec:
    """Every parameter that determines one generated game; its hash names the cache entry."""

    kind: str
    """``coin_collector``, ``treasure_hunter`` or ``custom``."""
    level: int
    """Challenge level (0 for ``custom``)."""
    world_size: int
    """Rooms of a ``custom`` game (0 for the challenges, whose level sets it)."""
    nb_objects: int
    """Objects of a ``custom`` game (0 for the challenges)."""
    quest_length: int
    """Actions in the quest of a ``custom`` game (0 for the challenges)."""
    game_seed: int
    """Seed of the whole pool of games."""
    index: int
    """Position of this game in the pool."""
    split: str = "train"
    """``train``, or ``eval`` for the held-out pool, which draws its own internal seeds."""
    redraw: int = 0
    """Held-out games only: how many earlier candidates for this position equalled a training game."""

    def __post_init__(self) -> None:
        if self.split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {self.split!r}")

    def key(self) -> str:
        payload = {**asdict(self), "textworld": textworld.__version__, "format": CACHE_FORMAT}
        return blake2b(json.dumps(payload, sort_keys=True).encode(), digest_size=16).hexdigest()

    def internal_seed(self, attempt: int) -> int:
        """The generator seed of the ``attempt``-th try: a fixed sequence per (game_seed, index), and
        another one per held-out (game_seed, index, redraw)."""
        pool = (
            f"{self.game_seed}:{self.index}"
            if self.split == "train"
            else f"eval:{self.game_seed}:{self.index}:{self.redraw}"
        )
        digest = blake2b(f"{pool}:{attempt}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "little") % (2**31 - 1)


def make_textworld_game(spec: GameSpec, options: GameOptions) -> textworld.Game:
    """Run TextWorld's generator for ``spec`` (raises ``QuestGenerationError`` when it finds no quest)."""
    if spec.kind == "coin_collector":
        return coin_collector.make({"level": spec.level}, options)
    if spec.kind == "treasure_hunter":
        return treasure_hunter.make({"level": spec.level}, options)
    options.nb_rooms = spec.world_size
    options.nb_objects = spec.nb_objects
    options.quest_length = spec.quest_length
    return make_game(options)


def ensure_game(spec: GameSpec) -> Path:
    """Path of the compiled game for ``spec``, generating it first if the cache lacks it.

    Safe under concurrent use: one process generates under a file lock, into a temporary folder that
    is renamed into place atomically, so readers never see a half-written game.
    """
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    key = spec.key()
    final = root / key
    game_file = final / "game.z8"
    if game_file.is_file():
        return game_file
    with FileLock(str(root / f"{key}.lock")):
        if game_file.is_file():
            return game_file
        shutil.rmtree(final, ignore_errors=True)  # a foreign, incomplete entry
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        try:
            with warnings.catch_warnings():  # the generators replay their walkthrough in Jericho, which warns
                warnings.simplefilter("ignore", jericho.UnsupportedGameWarning)
                _generate(spec, staging / "game.z8")
            (staging / "spec.json").write_text(json.dumps(asdict(spec), indent=2))
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return game_file


def _generate(spec: GameSpec, path: Path) -> None:
    failures = []
    for attempt in range(GENERATION_TRIES):
        options = GameOptions()
        options.seeds = spec.internal_seed(attempt)
        options.path = str(path)
        options.force_recompile = True
        try:
            game = make_textworld_game(spec, options)
        except QuestGenerationError as exc:
            failures.append(f"seed {options.seeds}: {exc}")
            continue
        compile_game(game, options)
        return
    raise RuntimeError(
        f"TextWorld could not build a quest for {spec} after {GENERATION_TRIES} internal seeds; "
        f"try other parameters (e.g. a shorter quest_length or a larger world_size). Failures: {failures}"
    )


def game_identity(spec: GameSpec) -> str:
    """What makes the game of ``spec`` itself, whatever its file: a hash of its world facts, every entity
    by name, and of its quests' winning commands. The objective text, a random paraphrase, is left out."""
    path = ensure_game(spec).with_name("game.json")
    try:
        game = textworld.Game.load(str(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RuntimeError(f"corrupt cached TextWorld game {path}: {exc}; delete its folder to regenerate it") from exc
    names = {entity: info.name or entity for entity, info in game.infos.items()}
    facts = sorted(
        f"{fact.name}({', '.join(names.get(arg.name, arg.name) for arg in fact.arguments)})"
        for fact in game.world.facts
    )
    quests = [list(quest.commands) for quest in game.quests]
    return blake2b(json.dumps([facts, quests]).encode(), digest_size=16).hexdigest()


def clean_feedback(text: str) -> str:
    """Game text without the ASCII-art banner, the input prompt/status line and the end-of-game menu."""
    lines = [line.strip() for line in text.replace(_END_OF_GAME_MENU, "").split("\n")]
    lines = [line for line in lines if not _PROMPT_OR_STATUS.match(line)]
    first_words = next((i for i, line in enumerate(lines) if any(ch.isalpha() for ch in line)), len(lines))
    body = "\n".join(lines[first_words:])
    return re.sub(r"\n{3,}", "\n\n", body).strip()


class TextWorldEnv(TextEnv):
    """TextWorld games, generated offline and played through TextWorld's own interpreter.

    Knobs:
        kind: ``"coin_collector"`` (a chain of rooms, take the coin at the end; level 1-300: quest
            length ``(level-1) % 100 + 1``, levels above 100 add dead-end rooms, at most 100 rooms),
            ``"treasure_hunter"`` (find and take the named object; level 1-30: 1-10 easy with 5 open
            rooms, 11-20 closed doors and containers in 10 rooms, 21-30 locked ones in 20 rooms) or
            ``"custom"`` (TextWorld's generic quest generator).
        level: challenge level (default 1); not allowed for ``custom``.
        world_size, nb_objects, quest_length: rooms, objects and quest actions of a ``custom`` game
            (defaults 3, 3, 3; at most 100 rooms, 100 objects and 20 quest actions, since generation
            time grows quickly with the quest length); not allowed for the challenges.
        game_seed: seed of the pool of generated games (default 0).
        n_games: size of the pool (default 8). ``reset(seed=s)`` picks the game
            ``self.np_random.integers(n_games)``, so every group member with seed ``s`` plays the same
            game from the same start. Each game is generated the first time it is picked. Evaluation
            seeds (from ``EVAL_SEED_BASE`` on) pick from the held-out pool instead (``eval_spec``);
            resolving it generates the whole training pool once, to compare games.
        max_steps and the reward knobs: see ``TextEnv``.

    Commands: only commands in TextWorld's admissible set (``info["admissible_actions"]``, lower-cased
    like every action after ``normalize_action``) reach the interpreter. Anything else, including the
    interpreter's meta commands (quit, restart, save, undo, ...) that could end or rewind the game
    behind the environment's back, is answered by the environment itself with
    ``action_valid=False`` and leaves the state unchanged.

    Anchor: blake2b of the game's key and its sorted world facts. Oracle: TextWorld's
    ``policy_commands``, a winning command sequence computed from the current state.
    """

    split_by_instance_key = False  # the two pools are disjoint by construction

    def __init__(
        self,
        *,
        kind: str = "coin_collector",
        level: int | None = None,
        world_size: int | None = None,
        nb_objects: int | None = None,
        quest_length: int | None = None,
        game_seed: int = 0,
        n_games: int = 8,
        max_steps: int = 50,
        **reward_and_render: Any,
    ) -> None:
        super().__init__(max_steps=max_steps, **reward_and_render)
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if n_games < 1:
            raise ValueError(f"n_games must be >= 1, got {n_games}")
        if kind == "custom":
            if level is not None:
                raise ValueError(
                    "level applies to coin_collector/treasure_hunter; use world_size/nb_objects/quest_length"
                )
            given = {"world_size": world_size, "nb_objects": nb_objects, "quest_length": quest_length}
            sizes = {}
            for name, (low, high, default) in CUSTOM_LIMITS.items():
                value = default if given[name] is None else int(given[name])
                if not low <= value <= high:
                    raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
                sizes[name] = value
            level = 0
        else:
            if (world_size, nb_objects, quest_length) != (None, None, None):
                raise ValueError(f"world_size/nb_objects/quest_length apply to kind='custom' only, not {kind!r}")
            level = 1 if level is None else level
            high = 300 if kind == "coin_collector" else 30
            if not 1 <= level <= high:
                raise ValueError(f"level of {kind} must be in [1, {high}], got {level}")
            if kind == "coin_collector" and ((level - 1) // 100 + 1) * ((level - 1) % 100 + 1) > 100:
                raise ValueError(f"coin_collector level {level} needs more than the 100 rooms TextWorld supports")
            sizes = {"world_size": 0, "nb_objects": 0, "quest_length": 0}
        self.specs = [
            GameSpec(kind=kind, level=level, game_seed=int(game_seed), index=i, **sizes) for i in range(n_games)
        ]
        self._eval_specs: dict[int, GameSpec] = {}
        self._identities: dict[GameSpec, str] = {}
        self._interpreters: dict[GameSpec, textworld.Environment] = {}
        self._spec = self.specs[0]
        self._game: textworld.Environment | None = None
        self._key = ""
        self._state: textworld.GameState | None = None
        self._anchor = ""
        self._admissible: dict[str, str] = {}

    def _new_game(self, options: dict[str, Any] | None) -> str:
        index = int(self.np_random.integers(len(self.specs)))
        spec = self.specs[index] if self.split == "train" else self.eval_spec(index)
        if spec not in self._interpreters:
            with warnings.catch_warnings():  # Jericho warns that it lacks its own walkthrough data
                warnings.simplefilter("ignore", jericho.UnsupportedGameWarning)
                game = textworld.start(str(ensure_game(spec)), REQUEST_INFOS)
            game.seed(INTERPRETER_SEED)
            self._interpreters[spec] = game
        self._spec = spec
        self._game = self._interpreters[spec]
        self._key = spec.key()
        self._set_state(self._game.reset())
        self.task = self._state["objective"]
        return clean_feedback(self._state.feedback)

    def eval_spec(self, index: int) -> GameSpec:
        """Game ``index`` of the held-out pool: the first candidate, generated with evaluation seeds,
        whose game equals no game of the training pool."""
        if index not in self._eval_specs:
            training = {self._identity(spec) for spec in self.specs}
            for redraw in range(HELDOUT_TRIES):
                candidate = replace(self.specs[index], split="eval", redraw=redraw)
                if self._identity(candidate) not in training:
                    self._eval_specs[index] = candidate
                    break
            else:
                raise RuntimeError(
                    f"TextWorld: {HELDOUT_TRIES} candidates for held-out game {index} all equal a game of the "
                    f"training pool of {len(self.specs)} ({self.specs[index]}); this configuration has too few "
                    "distinct games: use a higher level, larger custom quests or a smaller n_games"
                )
        return self._eval_specs[index]

    def _identity(self, spec: GameSpec) -> str:
        if spec not in self._identities:
            self._identities[spec] = game_identity(spec)
        return self._identities[spec]

    def _set_state(self, state: textworld.GameState) -> None:
        self._state = state
        # Actions arrive lower-cased (TextEnv.normalize_action); names like "type F locker" do not.
        self._admissible = {command.lower(): command for command in state["admissible_commands"]}
        facts = "\n".join(sorted(map(str, state["facts"])))
        self._anchor = blake2b(f"{self._key}\n{facts}".encode(), digest_size=16).hexdigest()

    def _apply(self, command: str) -> Transition:
        if not command:
            return self._reject("Please type a command.")
        if command in self._admissible:
            state, _, _ = self._game.step(self._admissible[command])
            self._set_state(state)
            return Transition(clean_feedback(state.feedback), terminated=bool(state["lost"]))
        if command.split()[0] in META_COMMANDS or command.startswith("tw-") or not command[0].isalpha():
            return self._reject(f"'{command}' is an interpreter command; it is disabled in this environment.")
        return self._reject(f"'{command}' is not a command you can use here.")

    def _reject(self, message: str) -> Transition:
        return Transition(f"{message} Admissible commands: {', '.join(self._admissible)}.", valid=False, error=message)

    def admissible_actions(self) -> list[str]:
        return list(self._admissible)

    def anchor(self) -> str:
        return self._anchor

    def oracle(self) -> list[str]:
        return [command.lower() for command in self._state["policy_commands"]]

    def instance_key(self) -> str:
        """The identity of the game being played (``game_identity``)."""
        return self._identity(self._spec)

    def is_won(self) -> bool:
        return bool(self._state["won"])

    def close(self) -> None:
        for game in self._interpreters.values():
            game.close()
        self._interpreters.clear()
        super().close()
