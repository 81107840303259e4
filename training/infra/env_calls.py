"""Calls into a user's environment, which may raise or hang: what one raised reads as one line that
names the call and the user's own frames (:func:`failure`), and :class:`TimedCalls` runs calls under a
time limit (``env.timeout_s``).

A running Python call cannot be interrupted, so with a limit set the calls run on a daemon thread:
the caller stops waiting for one over the limit, abandons its thread (a daemon, so a call that never
returns does not keep the process alive) and goes on with a new one.
"""

from __future__ import annotations

import queue
import threading
import traceback
from concurrent import futures
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym

from agent_rl.envs.oracle import oracle_actions
from agent_rl.envs.registration import make_text_env

FAILURE_FRAMES = 2
"""Traceback frames an environment failure names, innermost last."""
HIDDEN_PATHS = (
    str(Path(gym.__file__).parent),
    str(Path(futures.__file__).parent),
    oracle_actions.__code__.co_filename,
    make_text_env.__code__.co_filename,
    str(Path(__file__).resolve().parents[1]),
)
"""Gymnasium's wrappers, the call thread's futures, the oracle's unwrapping, the registry's build and
this library's training code (pools, probes): frames a user never wrote."""


def failure(exc: BaseException, call: str) -> str:
    """``"ExceptionType: message (in call(); at file.py:12 in fn; ...)"``: what the environment raised,
    in which call, and the last ``FAILURE_FRAMES`` frames of its traceback outside ``HIDDEN_PATHS``."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(HIDDEN_PATHS)]
    where = "; ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in frames[-FAILURE_FRAMES:])
    return (
        f"{traceback.format_exception_only(type(exc), exc)[-1].strip()} (in {call}(){'; at ' + where if where else ''})"
    )


def failure_kind(failure: str) -> str:
    """A failure (:func:`failure`) without its message: the exception type, the call and the frames,
    so that one error repeated with other values counts as one kind."""
    head, _, place = failure.rpartition(" (in ")
    return f"{head.partition(':')[0]} (in {place}"


def check_time_limit(timeout_s: float | None) -> None:
    """A call time limit is > 0 seconds, or None for no limit."""
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds or None (no limit), got {timeout_s}")


class EnvBuildError(RuntimeError):
    """An environment factory that raised, or passed the time limit, when a pool built its first
    environment."""


def build_env(make_env: Callable[[], Any], timeout_s: float | None) -> Any:
    """``make_env()`` within ``timeout_s``: a factory that raises or hangs is an :class:`EnvBuildError`
    naming its failure (:func:`failure`); a hung one is abandoned."""
    with TimedCalls(timeout_s) as calls:  # outside the try: a bad limit is the caller's ValueError
        try:
            return calls(make_env, "make_env")
        except Exception as exc:
            raise EnvBuildError(f"the environment factory failed: {failure(exc, 'make_env')}") from exc


class _CallThread:
    """A daemon thread that runs calls one at a time, so that the caller can stop waiting for one."""

    def __init__(self):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="agent-rl-env-calls", daemon=True).start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, future = call
            try:
                future.set_result(fn())
            except BaseException as exc:  # the caller re-raises it, with its traceback
                future.set_exception(exc)

    def submit(self, fn: Callable[[], Any]) -> futures.Future:
        future: futures.Future = futures.Future()
        self._calls.put((fn, future))
        return future

    def retire(self) -> None:
        """Let the thread end once its current call returns, if it ever does."""
        self._calls.put(None)


class TimedCalls:
    """Environment calls under the limit ``timeout_s`` (None: no limit, each runs in the caller's
    thread). ``consequence`` says what becomes of an environment whose call passed the limit (the end
    of the timeout's message); ``abandoned`` counts those calls."""

    def __init__(self, timeout_s: float | None, *, consequence: str = "the environment was abandoned"):
        check_time_limit(timeout_s)
        self.timeout_s, self.consequence = timeout_s, consequence
        self.abandoned = 0
        self._thread: _CallThread | None = None  # started on the first call, ended by close()

    def __call__(self, fn: Callable[[], Any], call: str) -> Any:
        """``fn()``, within the limit: past it, a ``TimeoutError`` naming ``call``, and a new call thread
        (the old one stays with the call that does not return). What ``fn`` raises, it raises."""
        if self.timeout_s is None:
            return fn()
        if self._thread is None:
            self._thread = _CallThread()
        future = self._thread.submit(fn)
        done, _ = futures.wait([future], timeout=self.timeout_s)
        if not done:
            self._thread.retire()
            self._thread, self.abandoned = _CallThread(), self.abandoned + 1
            raise TimeoutError(
                f"{call}() gave no answer within {self.timeout_s:g} s (env.timeout_s); {self.consequence}"
            )
        return future.result()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.retire()
            self._thread = None

    def __enter__(self) -> TimedCalls:
        return self

    def __exit__(self, *_) -> None:
        self.close()
