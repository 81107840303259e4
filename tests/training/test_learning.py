"""The default learner learns: from a random-action warm start, on the embedded model and the
embedded learner settings (only sizes shrunk), a one-step contextual bandit whose answer cannot be
copied, a two-step task whose first action decides whether the second can win, and a three-step
task with a hidden rule and one reward at the end."""

from __future__ import annotations

import string

import gymnasium as gym
import pytest

from agent_rl.config import load_config
from agent_rl.training.infra.logger import read_metrics
from agent_rl.training.loop.trainer import train

PATH_OF_SIGN = {"red": "left", "blue": "right", "gold": "right", "moon": "left"}


class TwoStep(gym.Env):
    """Take the path the sign calls for (a table the text never shows), then open the chest: a chest
    lies only at the end of the right path, and kicking it wins nothing. Random play wins 1/4."""

    observation_space = action_space = gym.spaces.Text(64, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.sign = list(PATH_OF_SIGN)[int(self.np_random.integers(len(PATH_OF_SIGN)))]
        self.turn = 0
        return f"The sign shows {self.sign}. Take a path.", {"admissible_actions": ["left", "right"]}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            self.on_path = action == PATH_OF_SIGN[self.sign]
            info = {"action_valid": action in ("left", "right"), "admissible_actions": ["open", "kick"]}
            return ("A chest." if self.on_path else "A wall."), 0.0, False, False, info
        won = self.on_path and action == "open"
        return (
            ("Gold!" if won else "Nothing."),
            float(won),
            True,
            False,
            {"won": won, "action_valid": action in ("open", "kick")},
        )


gym.register("learning_test/TwoStep-v0", entry_point=TwoStep)


def _train(run_dir, env_id: str, iterations: int, *extra: str) -> list[dict]:
    train(
        load_config(
            overrides=[
                f"env.id={env_id}",
                "engine=hf",
                f"trainer.run_dir={run_dir}",
                f"trainer.iterations={iterations}",
                f"trainer.eval_every={iterations}",
                "trainer.eval_episodes=32",
                "trainer.eval_sampled=false",
                "trainer.target_success=null",
                "trainer.torch_threads=1",
                "sft.episodes=400",
                "logging.console=false",
                "logging.tensorboard=false",
                *extra,
            ]
        )
    )
    return read_metrics(run_dir)


@pytest.mark.slow
def test_a_contextual_bandit_is_learned_from_a_random_action_warm_start(tmp_path):
    # 8 signs, 4 doors, a table the text never shows: the warm start learns the format and stops at
    # its format target, far short of sft.steps; RL must learn the table from rewards.
    records = _train(
        tmp_path / "bandit",
        "agent_rl.benchmarks.lift_envs:lift/Bandit-v0",
        10,
        "trainer.eval_every=1",
        "trainer.target_success=0.9",  # confirmed on 128 held-out episodes before the run stops
    )
    start, end = records[0], records[-1]
    assert start["sft/format_accuracy"] >= 0.95 and start["sft/steps_taken"] < 300  # the generic size
    assert start["eval/greedy_success"] <= 0.5
    assert all(r["rollout/rounds"] == 2 for r in records[1:])  # 128 one-step episodes a round, 256 rows wanted
    assert end["eval/greedy_success"] >= 0.9, [r.get("eval/greedy_success") for r in records]


@pytest.mark.slow
def test_a_two_step_task_is_learned_with_step_credit(tmp_path):
    # Both actions must be right to win. GiGPO's step groups ("A chest." reached by several members of
    # a group) separate open from kick within the good path, whatever the first step's outcome.
    records = _train(
        tmp_path / "two_step",
        "learning_test/TwoStep-v0",
        8,
        "trainer.eval_every=1",
        "trainer.target_success=0.9",  # confirmed on 128 held-out episodes before the run stops
    )
    assert records[0]["eval/greedy_success"] <= 0.5
    assert any(r.get("anchors/grouped_fraction", 0) > 0 for r in records[1:])
    assert records[-1]["eval/greedy_success"] >= 0.9, [r.get("eval/greedy_success") for r in records]


@pytest.mark.slow
def test_a_three_step_hidden_rule_with_one_reward_at_the_end_is_learned(tmp_path):
    # Three dials, each turned up or down by a table the text never shows; the lock opens, and the
    # one reward comes, only when all three are right (random play wins 1/8). The random-action warm
    # start leaves the policy blind to the symbols, so every dial's credit comes from the final reward.
    records = _train(
        tmp_path / "combination",
        "agent_rl.benchmarks.lift_envs:lift/Combination-v0",
        10,
        "env.kwargs={dials: 3}",
        "rollout.history_turns=0",  # the observation shows the dial: no earlier turn is needed
        "trainer.eval_every=1",
        "trainer.target_success=0.9",  # confirmed on 128 held-out episodes before the run stops
    )
    assert records[0]["eval/greedy_success"] <= 0.5
    assert all(r["rollout/return"] == r["rollout/success_rate"] for r in records[1:])  # the only reward: a win
    last = records[-1]
    assert last["eval/greedy_success"] >= 0.9, [r.get("eval/greedy_success") for r in records]
