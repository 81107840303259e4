"""Graph credit (``algo.step_credit=graph``): hand-computed graphs, a shortest-path reference, and the
pipeline around it."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.config import load_config, resolve_algorithm
from agent_rl.core.advantages import compute_advantages, graph_advantages, graph_progress
from agent_rl.core.batch import StepBatch


def rows(*trajectories):
    """Columns of one group from trajectories given as (states, ending): ending is "won" (the last
    action wins), "lost" (it ends the episode without a win) or "cut" (truncated)."""
    group, traj, key, won, done, truncated = [], [], [], [], [], []
    for index, (states, ending) in enumerate(trajectories):
        for t, state in enumerate(states):
            last = t == len(states) - 1
            group.append(0)
            traj.append(index)
            key.append(state)
            won.append(last and ending == "won")
            done.append(last)
            truncated.append(last and ending == "cut")
    return [np.array(c) for c in (group, traj, key, won, done, truncated)]


# T0 wins along A B C; T1 fails but passes B (stitched to T0's win) and is cut in E; T2 ends lost in E.
THREE = rows((["A", "B", "C"], "won"), (["A", "D", "B", "E"], "cut"), (["A", "E", "E"], "lost"))


def test_distances_and_progress_by_hand():
    graph = graph_progress(*THREE)
    # d(C)=1 (its action wins), d(B)=2, d(A)=3 via B, d(D)=3 via B; E reaches no win: the cap, 1 + 3.
    np.testing.assert_array_equal(graph.distance, [3, 2, 1, 3, 3, 2, 4, 3, 4, 4])
    np.testing.assert_array_equal(graph.next_distance, [2, 1, 0, 3, 2, 4, np.nan, 4, 4, 4])
    # B -> E loses 2 steps: clipped to -1. T1's cut last step has no next state: unknown. T2's E -> E
    # stays where it was: -1, as a step away (both ends at the cap would otherwise give 0).
    np.testing.assert_array_equal(graph.progress, [1, 1, 1, 0, 1, -1, np.nan, -1, -1, 0])
    assert graph.merged.all()  # T0 and T1 meet in B
    np.testing.assert_array_equal(graph.trajectory_won, [True] * 3 + [False] * 7)


def test_a_failed_trajectory_gets_credit_for_its_progress():
    graph = graph_progress(*THREE)
    advantages = graph_advantages(graph, normalize="mean")
    known = graph.progress[~np.isnan(graph.progress)]
    mean = known.mean()
    assert mean == pytest.approx(1 / 9)
    np.testing.assert_allclose(
        advantages, [1 - mean, 1 - mean, 1 - mean, -mean, 1 - mean, -1 - mean, 0, -1 - mean, -1 - mean, -mean]
    )
    # T1 failed, yet its step D -> B, onto the winning path, is credited above the group's average.
    assert advantages[4] > 0
    std = known.std(ddof=1)
    normalized = graph_advantages(graph, normalize="mean_std", eps=1e-6)
    np.testing.assert_allclose(normalized[~np.isnan(graph.progress)], (known - mean) / (std + 1e-6))


def test_a_turn_that_stays_put_never_scores_above_a_step_away():
    # T0 wins along A B C; T1 bumps into a wall at A (A -> A), then steps back from B to A, then wins.
    columns = rows((["A", "B", "C"], "won"), (["A", "A", "B", "A", "B", "C"], "won"))
    graph = graph_progress(*columns)
    np.testing.assert_array_equal(graph.distance, [3, 2, 1, 3, 3, 2, 3, 2, 1])
    stay, away = graph.progress[3], graph.progress[5]
    assert stay == away == -1 and graph.progress[4] == 1
    # The bump was an invalid action: with the invalid-action penalty it scores below the step away.
    group, traj, key, won, _, truncated = columns
    valid = np.ones(len(group), dtype=bool)
    valid[3] = False
    batch = StepBatch.for_credit(group, traj, won.astype(float), key, valid, won, truncated)
    algo = resolve_algorithm(load_config(overrides=["algo=gigpo", "algo.step_credit=graph"]).algo)
    credit = compute_advantages(batch, algo)
    assert credit.advantages[3] < credit.advantages[5] < credit.advantages[4]


def test_cycles_do_not_shorten_or_hang():
    # T0 walks A B A B C and wins; T1 walks A B then is cut. Loops do not change distances.
    graph = graph_progress(*rows((["A", "B", "A", "B", "C"], "won"), (["A", "B"], "cut")))
    np.testing.assert_array_equal(graph.distance, [3, 2, 3, 2, 1, 3, 2])
    # B -> A moves away (-1); A -> B along the shortest path (+1).
    np.testing.assert_array_equal(graph.progress, [1, -1, 1, 1, 1, 1, np.nan])


def test_a_group_without_a_win_has_no_progress():
    graph = graph_progress(*rows((["A", "B", "C"], "lost"), (["A", "B", "A"], "cut")))
    np.testing.assert_array_equal(graph.distance, np.ones(6))  # every state at the cap of a group without goals
    assert np.all(np.nan_to_num(graph.progress) == 0)
    advantages = graph_advantages(graph_progress(*rows((["A", "B", "C"], "lost"), (["A", "B", "A"], "cut"))))
    np.testing.assert_array_equal(advantages, 0)


def test_groups_whose_trajectories_never_meet_fall_back_to_episode_credit():
    # Only the reset state is shared: the graph is two separate paths.
    apart = rows((["S", "A", "B"], "won"), (["S", "C", "D"], "lost"))
    graph = graph_progress(*apart)
    assert not graph.merged.any()
    advantages = graph_advantages(graph)
    np.testing.assert_array_equal(advantages, 0)
    # A singleton group (one trajectory) cannot meet another either.
    graph = graph_progress(*rows((["S", "A", "A"], "won")))
    assert not graph.merged.any() and np.all(graph_advantages(graph) == 0)


def test_groups_are_separate_graphs():
    one = rows((["A", "B"], "won"), (["A", "B", "C"], "lost"))
    other = rows((["B", "C"], "won"), (["A", "C"], "won"))  # the same keys, another group
    columns = [np.concatenate([a, b]) for a, b in zip(one, other)]
    columns[0][len(one[0]) :] = 1
    columns[1][len(one[0]) :] += 10
    together = graph_progress(*columns)
    alone = [graph_progress(*one), graph_progress(*other)]
    np.testing.assert_array_equal(together.distance, np.concatenate([g.distance for g in alone]))
    np.testing.assert_array_equal(together.progress, np.concatenate([g.progress for g in alone]))


def reference_distances(columns):
    """Per row, the capped distance of its state, with networkx shortest paths, group by group."""
    group, traj, key, won, done, truncated = columns
    out = np.zeros(len(group))
    for g in np.unique(group):
        graph = nx.DiGraph()
        members = np.flatnonzero(group == g)
        graph.add_nodes_from(key[members].tolist())
        graph.add_node("GOAL")
        for i in members:
            later = [j for j in members if traj[j] == traj[i] and j > i]
            if won[i]:
                graph.add_edge(key[i], "GOAL")
            elif later:
                graph.add_edge(key[i], key[later[0]])
        lengths = nx.single_source_shortest_path_length(graph.reverse(), "GOAL")
        cap = 1 + max(lengths.values())
        out[members] = [lengths.get(key[i], cap) for i in members]
    return out


trajectory = st.tuples(
    st.lists(st.sampled_from("ABCDEF"), min_size=1, max_size=6), st.sampled_from(["won", "lost", "cut"])
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(trajectory, min_size=1, max_size=4), min_size=1, max_size=3), st.randoms())
def test_distances_match_networkx_and_ignore_row_order(groups, rng):
    parts = [rows(*group) for group in groups]
    offset = 0
    for index, part in enumerate(parts):
        part[0][:] = index
        part[1] += offset
        offset = part[1].max() + 1
    columns = [np.concatenate(c) for c in zip(*parts)]
    graph = graph_progress(*columns)
    np.testing.assert_array_equal(graph.distance, reference_distances(columns))
    known = ~np.isnan(graph.progress)
    assert np.all(graph.progress[known] <= 1) and np.all(graph.progress[known] >= -1)
    assert np.all(graph.progress[columns[3]] == 1)  # a winning action leaves a state at distance 1 for the goal
    # Trajectories interleaved at random, each one's rows still in time order: nothing changes per row.
    keys = np.array([rng.random() for _ in columns[1]])
    for t in set(columns[1].tolist()):
        keys[columns[1] == t] = np.sort(keys[columns[1] == t])
    order = np.argsort(keys, kind="stable")  # ties keep row order, so time order holds
    permuted = graph_progress(*[c[order] for c in columns])
    np.testing.assert_array_equal(permuted.distance, graph.distance[order])
    np.testing.assert_array_equal(permuted.progress, graph.progress[order])
    np.testing.assert_array_equal(permuted.merged, graph.merged[order])


def test_the_pipeline_adds_weighted_graph_credit_to_episode_credit():
    group, traj, key, won, done, truncated = THREE
    reward = won.astype(float)
    batch = StepBatch.for_credit(group, traj, reward, anchor_key=key, won=won, truncated=truncated)
    overrides = [
        "algo=gigpo",
        "algo.step_credit=graph",
        "algo.step_weight=0.5",
        "algo.invalid_penalty=0",
        "algo.negative_weight=1",
        "algo.row_weight=turn",
    ]
    algo = resolve_algorithm(load_config(overrides=overrides).algo)
    credit = compute_advantages(batch, algo)
    step = graph_advantages(graph_progress(*THREE), normalize="mean")
    np.testing.assert_allclose(credit.step, step)
    np.testing.assert_allclose(credit.advantages, credit.episode + 0.5 * step)
    metrics = credit.metrics()
    assert metrics["graph/merged_fraction"] == 1.0
    assert metrics["graph/failed_progress_fraction"] == pytest.approx(1 / 6)


def test_graph_credit_needs_anchor_keys_and_reads_the_old_switch():
    batch = StepBatch.for_credit([0, 0], [0, 1], [1.0, 0.0])
    algo = resolve_algorithm(load_config(overrides=["algo=grpo", "algo.step_credit=graph"]).algo)
    with pytest.raises(ValueError, match=r"step credit \(graph\) needs StepBatch.anchor_key"):
        compute_advantages(batch, algo)
    assert load_config(overrides=["algo.step_credit=true"]).algo.step_credit == "anchor"
    assert load_config(overrides=["algo.step_credit=false"]).algo.step_credit == "none"
    with pytest.raises(Exception, match="algo.step_credit"):
        load_config(overrides=["algo.step_credit=graf"])


@pytest.mark.parametrize("kind", ["anchor", "graph"])
def test_step_credit_that_reaches_no_row_says_why(kind):
    algo = resolve_algorithm(load_config(overrides=["algo=gigpo", f"algo.step_credit={kind}"]).algo)
    # Observations that never repeat (e.g. a turn counter in every one).
    apart = StepBatch.for_credit(
        [0] * 4,
        [0, 0, 1, 1],
        [0.0, 1.0, 0.0, 0.0],
        anchor_key=["s0", "a1", "s1", "b1"],
        won=[False, True, False, False],
    )
    assert kind in compute_advantages(apart, algo).blind_step_credit()
    # Trajectories that meet only in the reset state: anchor credit compares their first steps, graph
    # credit has no meeting to stitch.
    at_reset = StepBatch.for_credit(
        [0] * 4, [0, 0, 1, 1], [0.0, 1.0, 0.0, 0.0], anchor_key=["s", "a1", "s", "b1"], won=[False, True, False, False]
    )
    assert (compute_advantages(at_reset, algo).blind_step_credit() is None) == (kind == "anchor")
    met = StepBatch.for_credit(
        [0] * 4,
        [0, 0, 1, 1],
        [0.0, 1.0, 0.0, 0.0],
        anchor_key=["start", "a1", "a1", "a1"],
        won=[False, True, False, False],
    )
    assert compute_advantages(met, algo).blind_step_credit() is None
    none = resolve_algorithm(load_config(overrides=["algo=grpo"]).algo)
    assert compute_advantages(apart, none).blind_step_credit() is None
