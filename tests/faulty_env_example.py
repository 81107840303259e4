"""A user environment that breaks, written as users write envs (plain ``gymnasium.Env``).

Importing this module registers ``faulty/Lever-v0``: pull the lever (``pull``) three times. Its
``fault`` argument says how it breaks: ``never``; ``always`` (every ``step`` raises); ``sometimes``
(every fifth ``step`` call of the process raises, whichever instance makes it); ``no_actions_at_2``
(the info of the step that starts turn 2 lists no admissible actions); ``nan_reward`` (the step of
turn 1 returns a NaN reward); ``number_observation`` (``reset`` returns the observation 7);
``hang_at_2`` (the step of turn 2 sleeps for an hour, as a call to a dead backend would block);
``spin_at_2`` (the step of turn 2 never returns from a regular expression, which holds the GIL);
``build_raises`` and ``build_hangs`` (the constructor raises, or sleeps for an hour).

``faulty/PlannedLever-v0`` is the same lever with an oracle plan (``pull`` for each pull left), and
more faults: ``oracle_raises`` (every ``oracle`` call raises) and ``oracle_hangs_at_<k>`` (the
``oracle`` call after the step of turn k, or after ``reset`` for 0, sleeps for an hour).
"""

from __future__ import annotations

import re
import string
import time

import gymnasium as gym

CRASH = "simulator crashed: lost connection to backend"
ORACLE_CRASH = "planner crashed: search space exhausted"
BUILD_CRASH = "backend unreachable"


class Lever(gym.Env):
    observation_space = action_space = gym.spaces.Text(64, charset=string.printable)
    calls = 0  # step calls in this process, for fault="sometimes"

    def __init__(self, fault: str = "never"):
        if fault == "build_raises":
            raise RuntimeError(BUILD_CRASH)
        if fault == "build_hangs":
            time.sleep(3600)
        self.fault = fault

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pulls = self.turn = 0
        return (7 if self.fault == "number_observation" else "A lever."), {"admissible_actions": ["pull", "wait"]}

    def step(self, action):
        Lever.calls += 1
        self.turn += 1
        if self.fault == "always" or (self.fault == "sometimes" and Lever.calls % 5 == 0):
            raise RuntimeError(CRASH)
        if self.fault == "hang_at_2" and self.turn == 2:
            time.sleep(3600)
        if self.fault == "spin_at_2" and self.turn == 2:
            re.match(r"(a+)+$", "a" * 64 + "b")  # exponential backtracking, in C
        self.pulls += action == "pull"
        won = self.pulls == 3
        info = {"won": won, "action_valid": action in ("pull", "wait"), "admissible_actions": ["pull", "wait"]}
        if self.fault == "no_actions_at_2" and self.turn == 2:
            del info["admissible_actions"]
        reward = float("nan") if self.fault == "nan_reward" and self.turn == 2 else float(won)
        return ("Click." if action == "pull" else "Nothing."), reward, won, False, info


class PlannedLever(Lever):
    def oracle(self) -> list[str]:
        if self.fault == "oracle_raises":
            raise RuntimeError(ORACLE_CRASH)
        if self.fault == f"oracle_hangs_at_{self.turn}":
            time.sleep(3600)
        return ["pull"] * (3 - self.pulls)


gym.register("faulty/Lever-v0", entry_point=Lever)
gym.register("faulty/PlannedLever-v0", entry_point=PlannedLever)
