"""Anchor keys: stable hashing, the four key kinds, and input validation."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl import anchors
from agent_rl.anchors import (
    KEY_KINDS,
    batch_anchor_keys,
    compute_anchor_keys,
    context_keys,
    error_fingerprint,
    hash_strings,
    stable_hash64,
)

# blake2b(digest_size=8, person=domain), little-endian; pinned so a change of hash breaks loudly.
PINNED = [
    ("", "", 13020603013274838756),
    ("room 3", "", 18319972001364094694),
    ("room 3", "state", 11539763356247989365),
    ("héllo wörld", "observation", 12240616928265902739),
]


@pytest.mark.parametrize(("text", "domain", "expected"), PINNED)
def test_stable_hash64_pinned_values(text, domain, expected):
    assert stable_hash64(text, domain=domain) == expected


def test_hash_strings_matches_scalar_hash_and_repeats():
    texts = ["a", "b", "a", "", "héllo wörld", "b"]
    keys = hash_strings(texts, domain="observation")
    assert keys.dtype == np.uint64 and keys.shape == (6,)
    assert [int(k) for k in keys] == [stable_hash64(t, domain="observation") for t in texts]
    assert hash_strings([]).shape == (0,)


def test_domains_separate_equal_strings():
    assert stable_hash64("x", domain="state") != stable_hash64("x", domain="observation")
    with pytest.raises(ValueError, match="longer than 16 bytes"):
        stable_hash64("x", domain="a-very-long-domain-name")


def test_non_strings_are_rejected():
    with pytest.raises(TypeError, match="needs str values"):
        hash_strings(["a", None])
    with pytest.raises(TypeError, match="states must hold str"):
        compute_anchor_keys("state", states=["a", 3])


def test_keys_are_stable_across_processes():
    script = (
        "import anchors;"
        "print(list(map(int, anchors.compute_anchor_keys('fingerprint', ['obs one', 'obs  two'],"
        " [None, \"program:1:3: error: unknown word 'dupp'\"]))));"
        "print(list(map(int, anchors.compute_anchor_keys('state', states=['s0', 's1']))))"
    )
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1]
    here_fp = compute_anchor_keys(
        "fingerprint", ["obs one", "obs  two"], [None, "program:1:3: error: unknown word 'dupp'"]
    )
    here_state = compute_anchor_keys("state", states=["s0", "s1"])
    assert outputs[0] == f"{list(map(int, here_fp))}\n{list(map(int, here_state))}\n"


def test_package_does_not_import_torch():
    script = "import sys, anchors; anchors.compute_anchor_keys('similarity', ['a b c']); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_state_keys_hash_the_anchor_strings():
    keys = compute_anchor_keys("state", states=["r1", "r2", "r1"])
    assert keys[0] == keys[2] != keys[1]
    assert int(keys[0]) == stable_hash64("r1", domain="state")


def test_observation_keys_normalize_whitespace_only():
    keys = compute_anchor_keys("observation", ["You see a key.", "  You   see\na key. ", "you see a key."])
    assert keys[0] == keys[1]
    assert keys[0] != keys[2]  # case is part of the observation
    assert int(keys[0]) == stable_hash64("You see a key.", domain="observation")


def test_fingerprint_keys_use_error_template_else_observation():
    observations = ["stack: [1]", "stack: [2]", "stack: [1]", "stack: [1]", "stack: [3]"]
    errors = [
        "program:1:5: error: unknown word 'dupp'",
        "program:1:9: error: unknown word 'swapp'",
        None,
        "   ",
        "program:1:2: runtime error: stack underflow: 'add' needs 2 values, the stack has 1",
    ]
    keys = compute_anchor_keys("fingerprint", observations, errors)
    assert keys[0] == keys[1]  # same error kind, different word and column
    assert keys[2] == keys[3] == compute_anchor_keys("observation", ["stack: [1]"])[0]  # no error -> observation
    assert len({keys[0], keys[2], keys[4]}) == 3
    assert int(keys[0]) == stable_hash64(error_fingerprint(errors[0]), domain="fingerprint")


def test_fingerprint_key_never_equals_observation_key_of_same_text():
    text = "error: something broke"
    keys = compute_anchor_keys("fingerprint", [text, text], [None, text])
    assert error_fingerprint(text) == text
    assert keys[0] != keys[1]


def test_similarity_keys_cluster_within_groups():
    observations = ["You are in the cellar. Turn 3.", "You are in the cellar. Turn 4.", "A dragon appears!"] * 2
    keys = compute_anchor_keys("similarity", observations, group_ids=[0, 0, 0, 1, 1, 1])
    assert keys.dtype == np.uint64
    assert keys[0] == keys[1] and keys[3] == keys[4]
    assert keys[0] != keys[2] and keys[0] != keys[3]  # per-group clusters: never shared across groups


def test_unknown_kind_lists_valid_kinds():
    with pytest.raises(
        ValueError, match="unknown anchor key kind 'exact'.*state, observation, fingerprint, similarity, context"
    ):
        compute_anchor_keys("exact", observations=["a"])
    assert anchors.KEY_KINDS == KEY_KINDS == ("state", "observation", "fingerprint", "similarity", "context")


@pytest.mark.parametrize(
    ("kind", "kwargs", "message"),
    [
        ("state", {"observations": ["a"]}, "needs states"),
        ("fingerprint", {"observations": ["a"]}, "needs errors"),
        ("similarity", {}, "needs observations"),
        ("fingerprint", {"observations": ["a", "b"], "errors": [None]}, "observations=2, errors=1"),
        ("similarity", {"observations": ["a", "b"], "group_ids": [0]}, "observations=2, group_ids=1"),
        ("context", {"states": ["a"], "actions": ["x"], "traj_ids": [0]}, "needs history_turns"),
        ("context", {"states": ["a"], "history_turns": 1}, "needs actions and traj_ids"),
        ("context", {"states": ["a", "b"], "actions": ["x", "y"], "traj_ids": [0], "history_turns": 1}, "traj_ids=1"),
        ("context", {"states": ["a"], "actions": ["x"], "traj_ids": [0], "history_turns": -1}, "history_turns must be"),
    ],
)
def test_missing_or_mismatched_inputs_are_named(kind, kwargs, message):
    with pytest.raises(ValueError, match=message):
        compute_anchor_keys(kind, **kwargs)


@settings(deadline=None)
@given(st.lists(st.text(max_size=30), max_size=20))
def test_keys_are_deterministic_and_equal_iff_normalized_text_equal(texts):
    first = compute_anchor_keys("observation", texts)
    second = compute_anchor_keys("observation", list(texts))
    assert np.array_equal(first, second)
    normalized = [" ".join(t.split()) for t in texts]
    for i in range(len(texts)):
        for j in range(len(texts)):
            assert (first[i] == first[j]) == (normalized[i] == normalized[j])


# ---- context keys -----------------------------------------------------------------------------


def _context(states, actions, traj_ids, history_turns):
    return compute_anchor_keys(
        "context", states=states, actions=actions, traj_ids=traj_ids, history_turns=history_turns
    )


def test_context_keys_by_hand():
    # Trajectories 0 and 1 both walk a -> b -> a -> b, but trajectory 1 waits instead of going back
    # on its second turn; trajectory 2 starts in b.
    states = ["a", "b", "a", "b"] + ["a", "b", "a", "b"] + ["b"]
    actions = ["go", "back", "go", "back"] + ["go", "wait", "go", "back"] + ["back"]
    traj = [0] * 4 + [1] * 4 + [2]
    k1 = _context(states, actions, traj, 1)  # own state + (previous state, previous action)
    assert k1[0] == k1[4]  # in a, no earlier turn
    assert k1[1] == k1[3] == k1[5] == k1[7]  # in b after (a, go)
    assert k1[2] != k1[6]  # in a after (b, back) vs after (b, wait)
    assert len({k1[0], k1[1], k1[2], k1[6], k1[8]}) == 5
    k2 = _context(states, actions, traj, 2)  # own state + the last two turns
    assert k2[0] == k2[4] and k2[1] == k2[5]  # still no difference in what is shown
    assert k2[1] != k2[3]  # in b after only (a, go) vs after (b, back), (a, go)
    assert k2[3] != k2[7]  # in b after (b, back), (a, go) vs after (b, wait), (a, go)
    assert k2[1] != k1[1]


def test_context_keys_differ_for_same_state_and_different_last_action():
    states, actions, traj = ["s0", "s", "s0", "s"], ["left", "x", "right", "x"], [0, 0, 1, 1]
    keys = _context(states, actions, traj, 1)
    assert keys[1] != keys[3]
    assert keys[0] == keys[2]  # first turns: same state, no history
    group, _ = anchors.group_steps([7, 7, 7, 7], keys)
    assert group[1] != group[3]


def test_context_keys_read_the_shown_observations_when_given():
    # Same states and actions; the first turn's observation differs ("You go north." was shown).
    states, actions, traj = ["hall", "room", "hall", "room"], ["go", "look", "go", "look"], [0, 0, 1, 1]
    observations = ["You are in the hall.", "In the room.", "You go north. You are in the hall.", "In the room."]
    by_state = _context(states, actions, traj, 1)
    assert by_state[1] == by_state[3]
    shown = compute_anchor_keys("context", observations, states=states, actions=actions, traj_ids=traj, history_turns=1)
    assert shown[1] != shown[3]
    assert shown[0] == shown[2] == by_state[0]  # first turns: the state key, no history
    spaced = compute_anchor_keys(
        "context",
        ["You  are in the hall.", *observations[1:]],
        states=states,
        actions=actions,
        traj_ids=traj,
        history_turns=1,
    )
    assert spaced[1] == shown[1]  # observations are compared whitespace-normalized, as the observation kind does


def test_context_keys_with_no_history_are_the_state_keys():
    states = ["r1", "r2", "r1", "r3", "r2"]
    keys = _context(states, ["a", "b", "c", "d", "e"], [0, 0, 1, 1, 1], 0)
    assert np.array_equal(keys, compute_anchor_keys("state", states=states))


def test_context_keys_follow_trajectories_through_interleaved_rows():
    # The same two trajectories, row by row interleaved and one after the other.
    states = ["a", "b", "c", "x", "y", "z"]
    actions = ["1", "2", "3", "4", "5", "6"]
    traj = [0, 0, 0, 1, 1, 1]
    interleave = [0, 3, 1, 4, 2, 5]
    blocked = _context(states, actions, traj, 2)
    mixed = _context(
        [states[i] for i in interleave], [actions[i] for i in interleave], [traj[i] for i in interleave], 2
    )
    assert np.array_equal(mixed, blocked[interleave])


@settings(deadline=None, max_examples=60)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from("ab"), st.sampled_from("uv")), min_size=1, max_size=30),
    st.integers(0, 3),
)
def test_context_keys_equal_iff_shown_histories_equal(rows, history_turns):
    """Keys are equal exactly when the state and the shown turns (state standing in for the
    observation, action) are equal."""
    traj = [r[0] for r in rows]
    states = [r[1] for r in rows]
    actions = [r[2] for r in rows]
    keys = _context(states, actions, traj, history_turns)
    shown = []
    for i, (trajectory, state, _) in enumerate(rows):
        earlier = [j for j in range(i) if traj[j] == trajectory][::-1][:history_turns]
        shown.append((state, tuple((states[j], actions[j]) for j in earlier)))
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (keys[i] == keys[j]) == (shown[i] == shown[j])


def test_batch_keys_in_context_follow_the_prompt_history():
    from agent_rl.core.batch import StepBatch

    # One trajectory revisits state s0 after different actions; a prompt with one history turn
    # tells the two visits apart, a prompt with none does not.
    batch = StepBatch.for_credit([0, 0, 0, 0], [0, 0, 0, 0], [0.0, 0.0, 0.0, 1.0])
    batch.anchor_state = ["s0", "s1", "s0", "s0"]
    batch.observation = ["o0", "o1", "o0", "o0"]
    batch.action = ["go north", "go south", "look", "take key"]
    keys = batch_anchor_keys(batch, "context", history_turns=1, history_observations=True)
    assert keys[2] != keys[3] and len(set(keys.tolist())) == 4
    np.testing.assert_array_equal(
        batch_anchor_keys(batch, "context", history_turns=0, history_observations=True),
        batch_anchor_keys(batch, "state", history_turns=0, history_observations=True),
    )
    # Without observations in the prompt, an earlier turn is keyed by its state instead.
    by_state = batch_anchor_keys(batch, "context", history_turns=1, history_observations=False)
    np.testing.assert_array_equal(by_state, context_keys(batch.anchor_state, batch.action, batch.traj_id, 1))
    assert not np.array_equal(by_state, keys)
