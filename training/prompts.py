"""Chat prompts for multi-turn text environments, and action parsers for model completions.

A prompt is a system message (how to answer) and one user message: the task, the last K turns
(observation, action), the current observation and, where the environment has a finite action set,
the admissible actions. It is rendered with the tokenizer's own chat template, so the embedded model
and any local instruct model share this code. Rendering is deterministic. When the prompt exceeds
its token budget, the oldest history turns go first, then the head of the current observation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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


PARSERS: dict[str, Callable[[str], tuple[str, bool]]] = {
    "first_line": parse_first_line,
    "action_tag": parse_action_tag,
}
SYSTEM_PROMPTS = {"first_line": SYSTEM_FIRST_LINE, "action_tag": SYSTEM_ACTION_TAG}


def parse_action(text: str, parser: str) -> tuple[str, bool]:
    """Extract the action from a completion with the named parser: ``(action, found)``."""
    if parser not in PARSERS:
        raise ValueError(f"unknown action parser {parser!r}; choose one of {sorted(PARSERS)}")
    return PARSERS[parser](text)


def render_user_message(
    task: str,
    history: Sequence[Turn],
    observation: str,
    admissible_actions: Sequence[str] | None,
    total_turns: int,
    history_observations: bool = True,
) -> str:
    """The user message: task, the given history turns, current observation, admissible actions.

    ``total_turns`` is how many turns the episode has had (it may exceed ``len(history)``).
    ``history_observations=False`` shows only the actions of the history turns."""
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
        parts.append("Admissible actions: " + " | ".join(a.strip() for a in admissible_actions))
    parts.append("Your action:")
    return "\n".join(parts)


def build_messages(
    task: str,
    history: Sequence[Turn],
    observation: str,
    admissible_actions: Sequence[str] | None,
    *,
    parser: str,
    history_turns: int,
    history_observations: bool = True,
    system_prompt: str | None = None,
) -> list[dict[str, str]]:
    """System + user chat messages showing the last ``history_turns`` turns of ``history`` (their
    actions only when ``history_observations`` is False). ``system_prompt`` None uses the parser's
    instructions; ``""`` sends no system message."""
    if parser not in SYSTEM_PROMPTS:
        raise ValueError(f"unknown action parser {parser!r}; choose one of {sorted(SYSTEM_PROMPTS)}")
    if history_turns < 0:
        raise ValueError(f"history_turns must be >= 0, got {history_turns}")
    shown = list(history[len(history) - history_turns :]) if history_turns else []
    user = render_user_message(
        task, shown, observation, admissible_actions, total_turns=len(history), history_observations=history_observations
    )
    system = SYSTEM_PROMPTS[parser] if system_prompt is None else system_prompt
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def encode_messages(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` rendered with the chat template, ending with the assistant header."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # The template already writes any BOS it wants; adding special tokens again would double it.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_prompt_ids(
    tokenizer,
    task: str,
    history: Sequence[Turn],
    observation: str,
    admissible_actions: Sequence[str] | None,
    *,
    parser: str,
    history_turns: int,
    max_prompt_tokens: int,
    history_observations: bool = True,
    system_prompt: str | None = None,
) -> list[int]:
    """Prompt token ids within ``max_prompt_tokens``.

    Over budget, history turns are dropped oldest first; if the prompt with no history is still too
    long, the current observation keeps only its tail (the most recent text), marked with ``...``.
    Raises ValueError when even an empty observation does not fit."""
    for shown in range(min(history_turns, len(history)), -1, -1):
        ids = encode_messages(
            tokenizer,
            build_messages(
                task, history, observation, admissible_actions, parser=parser, history_turns=shown,
                history_observations=history_observations, system_prompt=system_prompt,
            ),
        )
        if len(ids) <= max_prompt_tokens:
            return ids

    def encode_with_tail(n_chars: int) -> list[int]:
        tail = TRUNCATION_MARK + observation[len(observation) - n_chars :] if n_chars else TRUNCATION_MARK
        messages = build_messages(
            task, history, tail, admissible_actions, parser=parser, history_turns=0, system_prompt=system_prompt
        )
        return encode_messages(tokenizer, messages)

    if len(encode_with_tail(0)) > max_prompt_tokens:
        raise ValueError(
            f"the prompt does not fit max_prompt_tokens={max_prompt_tokens} even with an empty observation "
            "(task or admissible actions too long); raise max_prompt_tokens"
        )
    # Binary search for the longest observation tail that fits.
    low, high = 0, len(observation)
    while low < high:
        mid = (low + high + 1) // 2
        if len(encode_with_tail(mid)) <= max_prompt_tokens:
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
