"""The credit testbed: its engine (``agent_rl.benchmarks.testbed``: exploration against the real environment,
the tabular policy's sampling, update and exact success) and the --quick run's outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from agent_rl.benchmarks import credit_testbed as tb
from agent_rl.benchmarks.testbed import exact, learner, simulator
from agent_rl.benchmarks.testbed import explore as exploration
from agent_rl.envs import TextEnv, Transition, check_text_env, register_text_env

CORRIDOR = "testbed/KeyCorridor-v0"


def corridor_graph(seed: int = 3, length: int = 4, max_steps: int = 20) -> exploration.TaskGraph:
    return exploration.explore(CORRIDOR, {"min_length": length, "max_length": length, "max_steps": max_steps}, seed)


def test_toy_env_keeps_the_text_env_contract():
    report = check_text_env(gym.make(CORRIDOR), seeds=(0, 1), n_steps=30)
    assert report.env_id == CORRIDOR


def test_exploration_finds_every_corridor_state_and_transition():
    graph = corridor_graph()
    env = gym.make(CORRIDOR, min_length=4, max_length=4)
    env.reset(seed=3)
    game = env.unwrapped
    # Every (cell, key) pair is reachable within 20 steps; the reset state comes first.
    assert sorted(graph.anchors) == sorted(f"cell={c};key={k}" for c in range(4) for k in (0, 1))
    assert graph.anchors[0] == f"cell={game.start};key=0"
    # Moves: 2 in the 2 inner cells, 1 at each end, with and without the key; plus take key and open door.
    assert graph.n_actions.sum() == 2 * (2 * 2 + 2) + 2
    terminal = graph.next_state < 0
    assert terminal.sum() == 1 and graph.won[terminal].all() and graph.reward[terminal][0] == 1.0
    assert graph.action_names[graph.action_id[terminal][0]] == "open door"
    assert graph.reward[~terminal].sum() == 0.0 and graph.valid.all()


def test_exploration_stops_expanding_at_the_step_limit():
    graph = corridor_graph(max_steps=1)
    assert graph.n_actions[0] > 0 and (graph.n_actions[1:] == 0).all()  # only the reset state is expanded
    assert len(graph.anchors) == 1 + graph.n_actions[0] - ("take key" in graph.action_names)


class InPlaceCounter(TextEnv):
    """Keeps its state in a list it mutates in place: attribute snapshots cannot restore it."""

    def __init__(self, **base_kwargs: Any) -> None:
        super().__init__(max_steps=6, **base_kwargs)
        self.position = [0]

    def _new_game(self, options):
        self.position = [0]
        self.task = "Count to 4."
        return "at 0"

    def _apply(self, command: str) -> Transition:
        if command == "up":
            self.position[0] += 1
        elif command != "stay":
            return Transition(f"at {self.position[0]}", valid=False, error="unknown")
        return Transition(f"at {self.position[0]}")

    def admissible_actions(self):
        return ["up", "stay"]

    def anchor(self) -> str:
        return f"at {self.position[0]}"

    def is_won(self) -> bool:
        return self.position[0] >= 4


def test_replay_check_rejects_an_env_that_mutates_its_state_in_place():
    register_text_env("testbedtest/InPlace-v0", InPlaceCounter, description="mutates a list in place")
    graph = exploration.explore("testbedtest/InPlace-v0", {}, 0)
    with pytest.raises(RuntimeError, match="testbedtest/InPlace-v0 seed 0: replaying the explored state graph"):
        for seed in range(20):  # several random walks: the corrupted edges are not on every one
            exploration.replay_check("testbedtest/InPlace-v0", {}, 0, graph, np.random.default_rng(seed))
    good = corridor_graph()
    for seed in range(20):
        exploration.replay_check(
            CORRIDOR, {"min_length": 4, "max_length": 4, "max_steps": 20}, 3, good, np.random.default_rng(seed)
        )


def corridor_tables(n_tasks: int = 3, max_steps: int = 8) -> exploration.Tables:
    return exploration.build_tables(
        [corridor_graph(seed, length=4 + seed % 2, max_steps=max_steps) for seed in range(n_tasks)]
    )


def test_tables_number_states_globally():
    graphs = [corridor_graph(seed, length=4 + seed) for seed in range(3)]
    tables = exploration.build_tables(graphs)
    assert np.array_equal(tables.start_state, [0, 8, 18])  # 2 * length states per task
    assert np.array_equal(np.bincount(tables.task_of_state), [8, 10, 12])
    assert (tables.admissible.sum(axis=1) == np.concatenate([g.n_actions for g in graphs])).all()
    targets = tables.next_state[tables.next_state >= 0]
    assert (tables.task_of_state[targets] == tables.task_of_state[np.nonzero(tables.next_state >= 0)[0]]).all()
    assert tables.anchors[tables.anchor_id[8]] == graphs[1].anchors[0]


def exhaustive_success(tables: exploration.Tables, pi: np.ndarray, state: int, steps_left: int) -> float:
    """Backward recursion over every action sequence: independent of the forward DP."""
    if steps_left == 0:
        return 0.0
    total = 0.0
    for slot in np.flatnonzero(tables.admissible[state]):
        after = tables.next_state[state, slot]
        total += pi[state, slot] * (
            tables.won[state, slot] + (exhaustive_success(tables, pi, after, steps_left - 1) if after >= 0 else 0.0)
        )
    return total


def test_exact_success_matches_exhaustive_enumeration():
    tables = corridor_tables()
    rng = np.random.default_rng(0)
    logits = np.where(tables.admissible, rng.normal(0, 1.5, tables.admissible.shape), -np.inf)
    pi = simulator.softmax(logits)
    expected = [exhaustive_success(tables, pi, start, tables.max_steps) for start in tables.start_state]
    np.testing.assert_allclose(exact.success_probability(tables, logits), expected, rtol=1e-12)
    assert 0 < min(expected) and max(expected) < 1


def test_rollouts_sample_the_policy():
    tables = corridor_tables()
    rng = np.random.default_rng(1)
    logits = np.where(tables.admissible, rng.normal(0, 1.5, tables.admissible.shape), -np.inf)
    uniforms = rng.random((3, 4000, tables.max_steps))
    batch = simulator.rollout(tables, logits, uniforms)
    # Each trajectory's rows are in time order and end at termination or the step limit.
    order = np.argsort(batch.traj, kind="stable")
    lengths = np.bincount(batch.traj, minlength=3 * 4000)
    assert lengths.max() <= tables.max_steps and lengths.min() >= 1
    assert (batch.task == batch.traj // 4000).all()
    wins = np.bincount(batch.traj, weights=batch.reward, minlength=3 * 4000).reshape(3, 4000).mean(axis=1)
    expected = exact.success_probability(tables, logits)
    assert np.all(np.abs(wins - expected) < 4 * np.sqrt(expected * (1 - expected) / 4000))
    # Wins and terminations happen on a trajectory's last row only; a won trajectory terminated.
    last = np.zeros(len(batch.traj), dtype=bool)
    last[len(batch.traj) - 1 - np.unique(batch.traj[::-1], return_index=True)[1]] = True
    assert not (batch.won & ~last).any() and not (batch.terminated & ~last).any()
    assert (batch.terminated[batch.won]).all() and (batch.reward == batch.won).all()
    # The same uniforms give the same trajectories (common random numbers).
    again = simulator.rollout(tables, logits, uniforms)
    assert np.array_equal(again.state, batch.state) and np.array_equal(again.action, batch.action)
    assert np.array_equal(order, np.argsort(again.traj, kind="stable"))


def test_a_state_without_admissible_actions_ends_the_trajectory():
    # State 0: "trap" leads to state 1 (no admissible actions), "win" wins. Uniform policy: success 1/2.
    graph = exploration.TaskGraph(
        anchors=["start", "trapped"],
        n_actions=np.array([2, 0]),
        action_names=["trap", "win"],
        action_id=np.array([0, 1]),
        next_state=np.array([1, -1]),
        reward=np.array([0.0, 1.0]),
        won=np.array([False, True]),
        valid=np.array([True, True]),
        observation_texts=["start"],
        observation_id=np.array([0, 0]),
        max_steps=5,
    )
    tables = exploration.build_tables([graph])
    logits = simulator.initial_logits(tables)
    assert exact.success_probability(tables, logits) == pytest.approx([0.5])
    batch = simulator.rollout(tables, logits, np.array([[[0.25] * 5, [0.75] * 5]]))
    assert batch.traj.tolist() == [0, 1] and batch.action.tolist() == [0, 1] and batch.reward.tolist() == [0.0, 1.0]
    # The trap is cut (no action left), not terminated: graph credit treats its next state as unseen.
    assert batch.won.tolist() == [False, True] and batch.terminated.tolist() == [False, True]


def test_policy_gradient_step_by_hand():
    logits = np.array([[0.0, 0.0, -np.inf], [np.log(3.0), 0.0, 0.0]])
    # State 0 (pi = 1/2, 1/2): actions 0 with A=1 and 1 with A=-1: lr * (1 - 1/2 + 1/2) = +lr on action 0.
    # State 1 (pi = 3/5, 1/5, 1/5): action 2 with A=2: lr * 2 * (onehot(2) - pi).
    learner.policy_gradient_step(logits, np.array([0, 0, 1]), np.array([0, 1, 2]), np.array([1.0, -1.0, 2.0]), lr=0.5)
    np.testing.assert_allclose(logits[0, :2], [0.5, -0.5])
    assert logits[0, 2] == -np.inf
    np.testing.assert_allclose(logits[1], [np.log(3.0) - 0.6, -0.2, 0.8])


def test_unit_mean_abs_by_hand():
    advantages = np.array([2.0, -2.0, 1.0, 0.0, 0.0, 0.5, -1.5])
    seeds = np.array([0, 0, 0, 1, 1, 2, 2])
    scaled = learner.unit_mean_abs(advantages, seeds, 3)
    # Seed 0: mean |A| 5/3; seed 1: no signal stays 0; seed 2: mean |A| 1.
    np.testing.assert_allclose(scaled, [1.2, -1.2, 0.6, 0.0, 0.0, 0.5, -1.5])


def test_arms_share_the_discount_and_penalty_their_results_used(monkeypatch):
    """Every arm resolves to gamma 0.95 and no invalid-action penalty, whatever AlgorithmConfig's
    defaults are; an arm's own fields still win."""
    import dataclasses

    import agent_rl.config

    odd = dataclasses.make_dataclass(
        "OddDefaults",
        [("gamma", float, dataclasses.field(default=0.5)), ("invalid_penalty", float, dataclasses.field(default=0.9))],
        bases=(agent_rl.config.AlgorithmConfig,),
    )
    monkeypatch.setattr(tb, "AlgorithmConfig", odd)
    for name, arm in tb.ARMS.items():
        algo = arm.algorithm()
        assert (algo.gamma, algo.invalid_penalty) == (0.95, 0.0), name
    assert tb.Arm({**tb.GIGPO, "gamma": 0.7}).algorithm().gamma == 0.7


def test_task_seeds_are_training_seeds():
    assert tb.task_seed(3, 2, 8) == 26
    with pytest.raises(ValueError, match="evaluation seed"):
        tb.task_seed(2**31 // 8, 0, 8)


def test_quick_run_writes_sane_outputs(tmp_path):
    out = tmp_path / "testbed"
    # From outside the checkout with no PYTHONPATH: the installed benchmarks package runs.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    run = subprocess.run(
        [str(Path(sys.executable).with_name("agent-rl")), "bench", "testbed", "--quick", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    settings = summary["settings"]
    assert settings["seeds"] == 6 and settings["views"] == ["equal", "raw"]
    assert summary["wall_s"] > 0 and summary["cpu_s"] > 0
    assert set(summary["envs"]) == set(tb.ENVIRONMENTS)
    for env, data in summary["envs"].items():
        assert 0.0 < data["uniform_success"] < 1.0 and data["states_per_task"]["min"] >= 2
        for view, arms in data["views"].items():
            expected_arms = [a for a in settings["arms"] if a not in data["skipped_arms"]]
            assert list(arms) == expected_arms
            for arm, r in arms.items():
                curve = r["curve"]
                assert curve["updates"][0] == 0 and curve["updates"][-1] == settings["updates"]
                assert curve["mean"][0] == pytest.approx(data["uniform_success"])  # every arm starts uniform
                assert (
                    all(0.0 <= x <= 1.0 for x in r["per_seed_final_success"]) and len(r["per_seed_final_success"]) == 6
                )
                assert r["final_success"]["mean"] == pytest.approx(np.mean(r["per_seed_final_success"]))
                assert 0.0 <= r["grouped_fraction"] <= 1.0 and r["raw_mean_abs_advantage"] >= 0.0
                baseline = tb.ARMS[arm].baseline
                assert ("vs_baseline" in r) == (baseline != arm)
                if baseline != arm:
                    diff = r["vs_baseline"]
                    assert diff["baseline"] == baseline and diff["n"] == 6
                    assert diff["ci_low"] <= diff["mean"] <= diff["ci_high"] and 0.0 <= diff["wilcoxon_p"] <= 1.0
                    finals = np.array(r["per_seed_final_success"]) - np.array(arms[baseline]["per_seed_final_success"])
                    assert diff["mean"] == pytest.approx(finals.mean())
                reference = tb.ARMS[arm].reference
                assert ("vs_reference" in r) == (reference in arms)
                if reference in arms:
                    finals = np.array(r["per_seed_final_success"]) - np.array(arms[reference]["per_seed_final_success"])
                    assert r["vs_reference"]["mean"] == pytest.approx(finals.mean())
    assert summary["envs"]["maze-long"]["skipped_arms"] == ["gigpo-similarity"]
    # The declared family: every arm against its baseline in the equal view, in every environment;
    # nothing else carries a verdict.
    primary = [
        r["primary"]
        for data in summary["envs"].values()
        for view, arms in data["views"].items()
        for r in arms.values()
        if "primary" in r
    ]
    family = sum(1 for data in summary["envs"].values() for r in data["views"]["equal"].values() if "vs_baseline" in r)
    assert len(primary) == family and {p["family_size"] for p in primary} == {family}
    assert all("primary" not in r for data in summary["envs"].values() for r in data["views"]["raw"].values())
    assert all(p["measure"] == "final_success" and p["holm_t_p"] >= p["t_p"] for p in primary)
    smallest = min(primary, key=lambda p: p["t_p"])
    assert smallest["holm_t_p"] == pytest.approx(min(1.0, family * smallest["t_p"]))
    table = (out / "summary.md").read_text()
    assert f"Holm over the {family} declared comparisons" in table
    assert table.count("| arm | final success") == 2 * len(tb.ENVIRONMENTS)
    assert "| gigpo | " in table and "vs grpo" in table and "vs grpo-g8" in table
    for name in [*(f"success_{env}.png" for env in tb.ENVIRONMENTS), "paired_differences.png"]:
        assert (out / name).stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "gigpo,gipgo"], "unknown arm 'gipgo'; valid arms: grpo, drgrpo, rloo, gigpo,"),
        (
            ["--envs", "maze,mazes"],
            "unknown environment 'mazes'; valid environments: maze, maze-long, sokoban, corridor",
        ),
        (["--seeds", "1"], "--seeds must be >= 2"),
    ],
)
def test_bad_names_are_reported_with_the_valid_ones(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        tb.main(args)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
