"""Prompt rendering, history truncation and action parsing (training/models/prompts.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_rl.config import ACTION_PARSERS, RolloutConfig, check_rollout
from agent_rl.training.models.embedded import train_tokenizer
from agent_rl.training.models.prompts import (
    PARSERS,
    SYSTEM_ACTION_TAG,
    SYSTEM_FIRST_LINE,
    PromptFormat,
    Turn,
    template_corpus,
)


def build_messages(task, history, observation, admissible, **fields):
    return PromptFormat(**fields).messages(task, history, observation, admissible)


def build_prompt_ids(tokenizer, task, history, observation, admissible, **fields):
    return PromptFormat(**fields).prompt_ids(tokenizer, task, history, observation, admissible)


def parse_action(text, parser, admissible=None):
    return PromptFormat(parser=parser).parse(text, admissible)


@pytest.fixture(scope="module")
def tokenizer():
    corpus = template_corpus() + ["You are in the hall.", "go north", "take key"] * 20
    return train_tokenizer(corpus, vocab_size=400, min_frequency=1)


def test_messages_show_last_k_turns_task_and_admissible_actions():
    history = [Turn(f"room {i}", f"go {i}") for i in range(1, 6)]
    messages = build_messages(
        "find the key", history, "room 6", ["go north", "look"], parser="first_line", history_turns=2
    )
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_FIRST_LINE
    assert messages[1]["content"] == (
        "Task: find the key\n"
        "Your last 2 of 5 turns:\n"
        "[Observation 4]\nroom 4\n[Action 4] go 4\n"
        "[Observation 5]\nroom 5\n[Action 5] go 5\n"
        "[Current observation]\nroom 6\n"
        "Admissible actions: go north | look\n"
        "Your action:"
    )


def test_history_of_actions_only_drops_past_observations():
    history = [Turn(f"room {i}", f"go {i}") for i in range(1, 6)]
    messages = build_messages(
        "find the key", history, "room 6", None, parser="first_line", history_turns=2, history_observations=False
    )
    assert messages[1]["content"] == (
        "Task: find the key\n"
        "Your last 2 of 5 turns:\n"
        "[Action 4] go 4\n"
        "[Action 5] go 5\n"
        "[Current observation]\nroom 6\n"
        "Your action:"
    )


def test_messages_without_history_or_admissible_actions():
    messages = build_messages("t", [], "start", None, parser="action_tag", history_turns=3)
    assert messages[0]["content"] == SYSTEM_ACTION_TAG
    assert messages[1]["content"] == "Task: t\n[Current observation]\nstart\nYour action:"


@pytest.mark.parametrize("system_prompt, expected", [(None, SYSTEM_FIRST_LINE), ("Act.", "Act."), ("", None)])
def test_system_prompt_default_custom_or_none(system_prompt, expected):
    messages = build_messages("t", [], "start", None, parser="first_line", history_turns=0, system_prompt=system_prompt)
    assert [m["content"] for m in messages if m["role"] == "system"] == ([expected] if expected else [])
    assert messages[-1] == {"role": "user", "content": "Task: t\n[Current observation]\nstart\nYour action:"}


def test_bad_parser_and_history_are_rejected():
    with pytest.raises(ValueError, match="parser"):
        build_messages("t", [], "o", None, parser="regex", history_turns=1)
    with pytest.raises(ValueError, match="history_turns"):
        build_messages("t", [], "o", None, parser="first_line", history_turns=-1)
    with pytest.raises(ValueError, match="parser"):
        parse_action("go north", "json")
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        PromptFormat(max_prompt_tokens=0)


def test_the_config_names_exactly_the_parsers_there_are():
    assert tuple(PARSERS) == ACTION_PARSERS


def test_format_of_a_rollout_config_and_hidden_admissible_actions():
    rollout = RolloutConfig(
        history_turns=1,
        history_observations=False,
        system_prompt="Act.",
        parser="action_tag",
        show_admissible_actions=False,
        max_prompt_tokens=77,
    )
    fmt = PromptFormat.from_rollout(rollout)
    assert fmt == PromptFormat(
        parser="action_tag",
        history_turns=1,
        history_observations=False,
        system_prompt="Act.",
        show_admissible_actions=False,
        max_prompt_tokens=77,
    )
    messages = fmt.messages("t", [Turn("a", "go 1")], "b", ["go north", "look"])
    assert messages[0] == {"role": "system", "content": "Act."}
    assert "Admissible actions" not in messages[1]["content"] and "[Action 1] go 1" in messages[1]["content"]
    assert fmt.response_text("look") == "<action>look</action>" and fmt.parse(fmt.response_text("look")) == (
        "look",
        True,
    )
    assert PromptFormat().response_text("look") == "look"


def test_prompt_is_the_chat_template_rendering(tokenizer):
    ids = build_prompt_ids(
        tokenizer, "t", [], "start", None, parser="first_line", history_turns=2, max_prompt_tokens=10_000
    )
    text = tokenizer.decode(ids)
    assert text.startswith("<|bos|><|system|>\n" + SYSTEM_FIRST_LINE + "<|end|>\n<|user|>\nTask: t\n")
    assert text.endswith("Your action:<|end|>\n<|assistant|>\n")
    assert ids == build_prompt_ids(
        tokenizer, "t", [], "start", None, parser="first_line", history_turns=2, max_prompt_tokens=10_000
    )


def test_budget_drops_oldest_history_first(tokenizer):
    history = [Turn(f"observation number {i} " * 5, f"action {i}") for i in range(6)]

    def length(shown: int) -> int:
        return len(
            build_prompt_ids(
                tokenizer, "t", history, "now", None, parser="first_line", history_turns=shown, max_prompt_tokens=10_000
            )
        )

    full, two = length(4), length(2)
    assert two < full
    ids = build_prompt_ids(
        tokenizer, "t", history, "now", None, parser="first_line", history_turns=4, max_prompt_tokens=two
    )
    assert len(ids) == two
    text = tokenizer.decode(ids)
    assert "[Observation 5]" in text and "[Observation 6]" in text and "[Observation 4]" not in text


def test_budget_keeps_the_tail_of_a_long_observation(tokenizer):
    observation = " ".join(f"line{i}" for i in range(400)) + " THE END"
    short = len(
        build_prompt_ids(tokenizer, "t", [], "x", None, parser="first_line", history_turns=0, max_prompt_tokens=10_000)
    )
    budget = short + 40
    ids = build_prompt_ids(
        tokenizer,
        "t",
        [Turn("old", "a")],
        observation,
        None,
        parser="first_line",
        history_turns=1,
        max_prompt_tokens=budget,
    )
    assert len(ids) <= budget
    text = tokenizer.decode(ids)
    assert "[Current observation]\n..." in text and "THE END" in text and "line0 " not in text
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        build_prompt_ids(
            tokenizer, "t" * 500, [], "o", None, parser="first_line", history_turns=0, max_prompt_tokens=20
        )


def test_parsers_on_examples():
    assert parse_action("\n  go north  \nthen east", "first_line") == ("go north", True)
    assert parse_action(" \n\t\n", "first_line") == ("", False)
    assert parse_action("I should move.<action> take key </action> done", "action_tag") == ("take key", True)
    assert parse_action("<ACTION>look</ACTION>", "action_tag") == ("look", True)
    assert parse_action("<action>look", "action_tag") == ("", False)
    assert parse_action("go north", "action_tag") == ("", False)


@given(st.text())
def test_parsers_never_raise_and_return_one_stripped_line(text):
    for parser in ("first_line", "action_tag", "admissible"):
        action, found = parse_action(text, parser)
        assert found == bool(action)
        assert action == action.strip() and len(action.splitlines()) <= 1


@given(
    st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1).filter(
        lambda s: s.strip() and "<" not in s
    )
)
def test_action_tag_recovers_the_tagged_action(action):
    assert parse_action(f"thinking...<action>{action}</action>", "action_tag") == (action.strip(), True)


MAZE_ACTIONS = ["go north", "go east", "take key", "take brass key", "unlock north door with brass key", "look"]


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("go north", ("go north", True)),
        ("I will go north.", ("go north", True)),  # named inside a sentence
        ("GO   North!", ("go north", True)),  # case, spacing and punctuation ignored
        ("I will take the key.", ("I will take the key.", False)),  # "take key" is not named: invalid, not mapped
        ("Take brass key, then go east", ("take brass key", True)),  # the first named wins
        ("take key or go east", ("take key", True)),
        ("unlock north door with brass key", ("unlock north door with brass key", True)),  # longer wins at one start
        ("I choose <action>go east</action>, not go north", ("go east", True)),  # a tag's content decides
        ("forgo northward", ("forgo northward", False)),  # whole words only
        ("", ("", False)),
        ("\n  look around\nlater", ("look", True)),
    ],
)
def test_admissible_parser_on_examples(reply, expected):
    assert parse_action(reply, "admissible", MAZE_ACTIONS) == expected


def test_admissible_parser_without_a_list_reads_the_first_line():
    assert parse_action("print 1\nmore", "admissible", None) == ("print 1", True)
    assert parse_action("<action>print 2</action>", "admissible", []) == ("print 2", True)


@given(st.sampled_from(MAZE_ACTIONS), st.text(alphabet="abcdefghijklmnopqrstuvwxyz ,.!", max_size=30))
def test_admissible_parser_finds_a_named_action_and_only_admissible_ones(action, prefix):
    parsed, found = parse_action(f"{prefix} {action}.", "admissible", MAZE_ACTIONS)
    assert found and parsed in MAZE_ACTIONS
    words = " ".join(f"{prefix} {action}".lower().replace(",", " ").replace(".", " ").replace("!", " ").split())
    assert f" {parsed} " in f" {words} "  # the chosen action is named in the reply


def test_admissible_list_is_capped_and_says_how_many_more():
    fmt = PromptFormat(parser="admissible", max_admissible_actions=2)
    user = fmt.messages("t", [], "o", ["a", "b", "c", "d"])[1]["content"]
    assert "Admissible actions: a | b | ... (2 more)\n" in user
    assert (
        "Admissible actions: a | b\n"
        in PromptFormat(max_admissible_actions=2).messages("t", [], "o", ["a", "b"])[1]["content"]
    )
    assert fmt.parse("I pick d", ["a", "b", "c", "d"]) == ("d", True)  # an unlisted admissible action is still accepted
    with pytest.raises(ValueError, match="max_admissible_actions"):
        PromptFormat(max_admissible_actions=-1)
    with pytest.raises(ValueError, match="rollout.max_admissible_actions"):
        check_rollout(RolloutConfig(max_admissible_actions=-1))
