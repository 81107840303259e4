"""The Maze under another id, ``usertest/InterruptedMaze-v0``, that signals its own process at a
chosen reset: with ``AGENT_RL_TEST_SIGNAL=SIGINT:12`` in the environment, the 12th reset of the
process sends SIGINT. Tests import it (``--import interrupting_env``) to stop a CLI run at the same
point of an iteration every time."""

from __future__ import annotations

import os
import signal

from agent_rl.envs import register_text_env
from agent_rl.envs.maze import MazeEnv

SIGNAL_VARIABLE = "AGENT_RL_TEST_SIGNAL"


class InterruptedMaze(MazeEnv):
    resets = 0
    """Resets so far in this process, over every instance."""

    def reset(self, *, seed=None, options=None):
        InterruptedMaze.resets += 1
        name, _, at = os.environ.get(SIGNAL_VARIABLE, "").partition(":")
        if name and InterruptedMaze.resets == int(at):
            os.kill(os.getpid(), signal.Signals[name])
        return super().reset(seed=seed, options=options)


register_text_env("usertest/InterruptedMaze-v0", InterruptedMaze, description="The Maze, signalling at a chosen reset.")

# A process that inherits SIGINT ignored (children of a process that ignores it: some libraries set
# that, and so do shells for background jobs) would not stop; the run under test stops as it would
# from a terminal or a job scheduler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
