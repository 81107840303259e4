"""Chat prompts for multi-turn text environments, and action parsers for model completions.

``PromptFormat`` holds every choice about prompts (parser, history, system prompt, admissible
actions, token budget). A prompt is a system message (how to answer) and one user message: the task, the last K turns
(observation, action), the current observation and, where the environment has a finite action set,
the admissible actions. It is rendered with the tokenizer's own chat template, so the embedded model
and any local instruct model share this code. Rendering is deterministic. When the prompt exceeds
its token budget, the oldest history turns go first, then the head of the current observation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence

SYSTEM_FIRST_LINE = (
    "You are an agent in a text environment. Read the task and the observation, then act. "
    "Reply with exactly one action on one line and nothing else."
)
SYSTEM_ACTION_TAG = (
    "You are an agent in a text environment. Read the task and the observation, then act. "
    "You may think briefly first. Then give exactly one action inside <action></action> tags, "
    "for example <action>go north</action>."
)
SYSTEM_ADMISSIBLE = (
    "You are an agent in a text game. Read the task and the observation, then choose one of the admissible "
    "actions. Reply with that action, written exactly as listed, and nothing else."
)
TRUNCATION_MARK = "..."


@dataclass(frozen=True)
class Turn:
    """One past turn of the episode, as shown in the history section of the prompt."""

    observation: str
    """The observation the action was chosen on."""
    action: str
    """The action sent to the environment."""


def parse_first_line(text: str) -> tuple[str, bool]:
    """The first non-empty line of ``text``, stripped; ``("", False)`` when there is none."""
    for line in text.splitlines():
        if line.strip():
            return line.strip(), True
    return "", False


_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)


def parse_action_tag(text: str) -> tuple[str, bool]:
    """The content of the first ``<action>...</action>`` tag (first line of it, stripped);
    ``("", False)`` when the completion has no closed tag."""
    match = _ACTION_TAG.search(text)
    if match is None:
        return "", False
    action, found = parse_first_line(match.group(1))
    return action, found


def _words(text: str) -> str:
    """Lower-case words separated by single spaces, padded with one space on each side."""
    return " " + " ".join(re.findall(r"[a-z0-9]+", text.lower())) + " "


def parse_admissible(text: str, admissible_actions: Sequence[str] | None) -> tuple[str, bool]:
    """The admissible action the reply names first, for instruct models that answer in sentences.

    The reply (the content of its first ``<action>`` tag when it has one) names an action when the
    action's words occur in it as whole words, in order and adjacent, ignoring case and punctuation:
    "I go north." names ``go north``, "I will take the key." does not name ``take key``. When several
    are named, the one that starts first wins, the longer on a tie. A reply that names none is not
    mapped to anything: its first line goes to the environment as an invalid action (``found`` False).
    Without an admissible list (free-form actions) this is :func:`parse_first_line`."""
    tagged, has_tag = parse_action_tag(text)
    reply = tagged if has_tag else text
    if not admissible_actions:
        return parse_first_line(reply)
    words = _words(reply)
    named = [(words.find(_words(a)), -len(_words(a)), a) for a in admissible_actions if _words(a).strip()]
    named = [n for n in named if n[0] >= 0]
    if named:
        return min(named)[2], True
    return parse_first_line(reply)[0], False


PARSERS: dict[str, Callable[[str, Sequence[str] | None], tuple[str, bool]]] = {
    "first_line": lambda text, admissible_actions: parse_first_line(text),
    "action_tag": lambda text, admissible_actions: parse_action_tag(text),
    "admissible": parse_admissible,
}
SYSTEM_PROMPTS = {"first_line": SYSTEM_FIRST_LINE, "action_tag": SYSTEM_ACTION_TAG, "admissible": SYSTEM_ADMISSIBLE}


def render_user_message(
    task: str,
    history: Sequence[Turn],
    observation: str,
    admissible_actions: Sequence[str] | None,
    total_turns: int,
    history_observations: bool = True,
    max_admissible_actions: int = 0,
) -> str:
    """The user message: task, the given history turns, current observation, admissible actions.

    ``total_turns`` is how many turns the episode has had (it may exceed ``len(history)``).
    ``history_observations=False`` shows only the actions of the history turns.
    ``max_admissible_actions`` > 0 lists only the first that many actions, and says how many more there are."""
    parts = [f"Task: {task.strip() or '(none given)'}"]
    if history:
        first = total_turns - len(history) + 1
        parts.append(f"Your last {len(history)} of {total_turns} turns:")
        for offset, turn in enumerate(history):
            if history_observations:
                parts.append(f"[Observation {first + offset}]\n{turn.observation.strip()}")
            parts.append(f"[Action {first + offset}] {turn.action.strip() or '(empty)'}")
    parts.append(f"[Current observation]\n{observation.strip()}")
    if admissible_actions:
        listed = admissible_actions[:max_admissible_actions] if max_admissible_actions else admissible_actions
        more = f" | ... ({len(admissible_actions) - len(listed)} more)" if len(listed) < len(admissible_actions) else ""
        parts.append("Admissible actions: " + " | ".join(a.strip() for a in listed) + more)
    parts.append("Your action:")
    return "\n".join(parts)


def encode_messages(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` rendered with the chat template, ending with the assistant header."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # The template already writes any BOS it wants; adding special tokens again would double it.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class PromptFormat:
    """How a turn is shown to the policy and how its answer is read: one object for rollouts,
    evaluation and warm-start demonstrations, so all three build identical prompts. The fields mean
    what the ``rollout`` config fields of the same names mean (:meth:`from_rollout`)."""

    parser: str = "first_line"
    """Action parser (``PARSERS``); its instructions are the default system prompt."""
    history_turns: int = 2
    """Past turns shown."""
    history_observations: bool = True
    """Show the observations of the history turns; False shows only their actions."""
    system_prompt: str | None = None
    """None uses the parser's instructions; ``""`` sends no system message."""
    show_admissible_actions: bool = True
    """List the environment's admissible actions when it provides them."""
    max_admissible_actions: int = 0
    """List at most this many admissible actions, in the environment's order (0: all of them)."""
    max_prompt_tokens: int = 1024
    """Token budget; over it, history goes oldest first, then the head of the observation."""

    def __post_init__(self) -> None:
        if self.parser not in PARSERS:
            raise ValueError(f"unknown action parser {self.parser!r}; choose one of {sorted(PARSERS)}")
        if self.history_turns < 0:
            raise ValueError(f"history_turns must be >= 0, got {self.history_turns}")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if self.max_admissible_actions < 0:
            raise ValueError(f"max_admissible_actions must be >= 0, got {self.max_admissible_actions}")

    @classmethod
    def from_rollout(cls, rollout) -> PromptFormat:
        """The format a ``RolloutConfig`` describes."""
        return cls(
            parser=rollout.parser,
            history_turns=rollout.history_turns,
            history_observations=rollout.history_observations,
            system_prompt=rollout.system_prompt,
            show_admissible_actions=rollout.show_admissible_actions,
            max_admissible_actions=rollout.max_admissible_actions,
            max_prompt_tokens=rollout.max_prompt_tokens,
        )

    def parse(self, text: str, admissible_actions: Sequence[str] | None = None) -> tuple[str, bool]:
        """The action in a completion: ``(action, found)``. ``admissible_actions`` are the environment's
        (only the ``admissible`` parser reads them; it accepts all of them, listed in the prompt or not)."""
        return PARSERS[self.parser](text, admissible_actions)

    def response_text(self, action: str) -> str:
        """What the model should write to play ``action`` (the target of a demonstration)."""
        return f"<action>{action}</action>" if self.parser == "action_tag" else action

    def response_ids(self, tokenizer, action: str) -> list[int]:
        """The tokens of a reply that plays ``action``: :meth:`response_text`, then EOS, as the
        engines generate it."""
        return list(tokenizer(self.response_text(action), add_special_tokens=False)["input_ids"]) + [
            tokenizer.eos_token_id
        ]

    def messages(
        self, task: str, history: Sequence[Turn], observation: str, admissible_actions: Sequence[str] | None
    ) -> list[dict[str, str]]:
        """System + user chat messages showing the last ``history_turns`` turns of ``history``."""
        shown = list(history[len(history) - self.history_turns :]) if self.history_turns else []
        user = render_user_message(
            task,
            shown,
            observation,
            admissible_actions if self.show_admissible_actions else None,
            total_turns=len(history),
            history_observations=self.history_observations,
            max_admissible_actions=self.max_admissible_actions,
        )
        system = SYSTEM_PROMPTS[self.parser] if self.system_prompt is None else self.system_prompt
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]

    def prompt_ids(
        self, tokenizer, task: str, history: Sequence[Turn], observation: str, admissible_actions: Sequence[str] | None
    ) -> list[int]:
        """Prompt token ids within ``max_prompt_tokens``.

        Over budget, history turns are dropped oldest first; if the prompt with no history is still
        too long, the current observation keeps only its tail (the most recent text), marked with
        ``...``. Raises ValueError when even an empty observation does not fit."""
        for shown in range(min(self.history_turns, len(history)), -1, -1):
            ids = encode_messages(
                tokenizer, replace(self, history_turns=shown).messages(task, history, observation, admissible_actions)
            )
            if len(ids) <= self.max_prompt_tokens:
                return ids
        no_history = replace(self, history_turns=0)

        def encode_with_tail(n_chars: int) -> list[int]:
            tail = TRUNCATION_MARK + observation[len(observation) - n_chars :] if n_chars else TRUNCATION_MARK
            return encode_messages(tokenizer, no_history.messages(task, history, tail, admissible_actions))

        if len(encode_with_tail(0)) > self.max_prompt_tokens:
            raise ValueError(
                f"the prompt does not fit max_prompt_tokens={self.max_prompt_tokens} even with an empty observation "
                "(task or admissible actions too long); raise max_prompt_tokens"
            )
        # Binary search for the longest observation tail that fits.
        low, high = 0, len(observation)
        while low < high:
            mid = (low + high + 1) // 2
            if len(encode_with_tail(mid)) <= self.max_prompt_tokens:
                low = mid
            else:
                high = mid - 1
        return encode_with_tail(low)


def template_corpus() -> list[str]:
    """The fixed text of the prompts (for training the embedded tokenizer)."""
    example = render_user_message(
        "reach the goal", [Turn("You are in a room.", "go north")], "You see a door.", ["go north", "look"], 1
    )
    return [SYSTEM_FIRST_LINE, SYSTEM_ACTION_TAG, example, "<action>look</action>", TRUNCATION_MARK]
