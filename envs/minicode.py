"""MiniCode: write a one-line program in a tiny stack language that passes hidden tests.

The high-entropy environment: feedback is what a toolchain prints (compile errors with line:col and
the offending word, type and runtime errors at the failing instruction, failed tests with the
concrete input, expected and actual values), so exact observations rarely repeat across
trajectories, and ``info["error"]`` carries that raw text for error fingerprints.
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import blake2b
from math import factorial
from typing import Any, Callable

import numpy as np

from agent_rl.envs.base import TextEnv, Transition
from agent_rl.envs.minicode_lang import REFERENCE, MiniCodeError, compile_program, run


@dataclass(frozen=True)
class TaskTemplate:
    """A family of tasks: random constants and random test inputs are drawn per seed."""

    name: str
    level: int
    """1: straight-line arithmetic, 2: conditionals, 3: loops."""
    inputs: tuple[str, ...]
    """Input names, pushed by writing the name in the program."""
    input_range: tuple[int, int]
    """Inclusive range of every input value in the tests."""
    constants: dict[str, tuple[int, int]]
    """Inclusive range of each constant, referenced as {name} in ``statement`` and ``solution``."""
    statement: str
    solution: str
    """The oracle program (must pass every test; checked by the tests)."""
    expected: Callable[[dict[str, int], tuple[int, ...]], int]
    """Reference semantics in Python: (constants, inputs) -> the expected result."""


def _fibonacci(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


TEMPLATES: tuple[TaskTemplate, ...] = (
    TaskTemplate(
        "linear",
        1,
        ("x",),
        (-50, 50),
        {"m": (2, 9), "c": (-20, 20)},
        "Return {m}*x + {c}.",
        "x {m} mul {c} add",
        lambda k, v: k["m"] * v[0] + k["c"],
    ),
    TaskTemplate(
        "square_minus",
        1,
        ("x",),
        (-30, 30),
        {"c": (1, 50)},
        "Return x*x - {c}.",
        "x dup mul {c} sub",
        lambda k, v: v[0] * v[0] - k["c"],
    ),
    TaskTemplate(
        "weighted_sum",
        1,
        ("a", "b"),
        (-40, 40),
        {"p": (2, 7), "q": (2, 7)},
        "Return {p}*a + {q}*b.",
        "a {p} mul b {q} mul add",
        lambda k, v: k["p"] * v[0] + k["q"] * v[1],
    ),
    TaskTemplate(
        "scaled_difference",
        1,
        ("a", "b"),
        (-40, 40),
        {"c": (2, 9)},
        "Return (a - b) * {c}.",
        "a b sub {c} mul",
        lambda k, v: (v[0] - v[1]) * k["c"],
    ),
    TaskTemplate(
        "floor_division",
        1,
        ("x",),
        (-100, 100),
        {"c": (2, 9)},
        "Return x divided by {c}, rounded toward minus infinity.",
        "x {c} div",
        lambda k, v: v[0] // k["c"],
    ),
    TaskTemplate(
        "cube_plus",
        1,
        ("x", "a"),
        (-12, 12),
        {},
        "Return x*x*x + a.",
        "x dup dup mul mul a add",
        lambda k, v: v[0] ** 3 + v[1],
    ),
    TaskTemplate(
        "maximum",
        2,
        ("a", "b"),
        (-60, 60),
        {},
        "Return the larger of a and b.",
        "a b over over gt if drop else swap drop then",
        lambda k, v: max(v),
    ),
    TaskTemplate(
        "minimum",
        2,
        ("a", "b"),
        (-60, 60),
        {},
        "Return the smaller of a and b.",
        "a b over over lt if drop else swap drop then",
        lambda k, v: min(v),
    ),
    TaskTemplate(
        "absolute",
        2,
        ("x",),
        (-90, 90),
        {},
        "Return the absolute value of x.",
        "x dup 0 lt if neg then",
        lambda k, v: abs(v[0]),
    ),
    TaskTemplate(
        "divisible",
        2,
        ("x",),
        (-60, 60),
        {"c": (2, 7)},
        "Return 1 if x is divisible by {c}, else 0.",
        "x {c} mod 0 eq if 1 else 0 then",
        lambda k, v: int(v[0] % k["c"] == 0),
    ),
    TaskTemplate(
        "sign",
        2,
        ("x",),
        (-9, 9),
        {},
        "Return the sign of x: -1, 0 or 1.",
        "x 0 gt if 1 else x 0 lt if -1 else 0 then then",
        lambda k, v: (v[0] > 0) - (v[0] < 0),
    ),
    TaskTemplate(
        "clamp",
        2,
        ("x",),
        (-40, 40),
        {"lo": (-20, -1), "hi": (1, 20)},
        "Return x clamped to the range [{lo}, {hi}].",
        "x dup {lo} lt if drop {lo} else dup {hi} gt if drop {hi} then then",
        lambda k, v: min(max(v[0], k["lo"]), k["hi"]),
    ),
    TaskTemplate(
        "distance",
        2,
        ("a", "b"),
        (-50, 50),
        {},
        "Return |a - b|, the distance between a and b.",
        "a b sub dup 0 lt if neg then",
        lambda k, v: abs(v[0] - v[1]),
    ),
    TaskTemplate(
        "triangular",
        3,
        ("x",),
        (0, 30),
        {},
        "Return 1 + 2 + ... + x (0 when x is 0).",
        "0 x times i 1 add add end",
        lambda k, v: v[0] * (v[0] + 1) // 2,
    ),
    TaskTemplate(
        "power",
        3,
        ("x",),
        (-6, 6),
        {"c": (2, 5)},
        "Return x to the power {c}.",
        "1 {c} times x mul end",
        lambda k, v: v[0] ** k["c"],
    ),
    TaskTemplate(
        "factorial",
        3,
        ("x",),
        (0, 12),
        {},
        "Return x! (the factorial of x; 0! is 1).",
        "1 x times i 1 add mul end",
        lambda k, v: factorial(v[0]),
    ),
    TaskTemplate(
        "sum_of_squares",
        3,
        ("x",),
        (0, 20),
        {},
        "Return 1*1 + 2*2 + ... + x*x (0 when x is 0).",
        "0 x times i 1 add dup mul add end",
        lambda k, v: v[0] * (v[0] + 1) * (2 * v[0] + 1) // 6,
    ),
    TaskTemplate(
        "count_multiples",
        3,
        ("x",),
        (0, 40),
        {"c": (2, 6)},
        "Return how many of the numbers 1, 2, ..., x are divisible by {c}.",
        "0 x times i 1 add {c} mod 0 eq if 1 add then end",
        lambda k, v: v[0] // k["c"],
    ),
    TaskTemplate(
        "fibonacci",
        3,
        ("x",),
        (0, 25),
        {},
        "Return the x-th Fibonacci number (fib(0) = 0, fib(1) = 1, fib(n) = fib(n-1) + fib(n-2)).",
        "0 1 x times swap over add end drop",
        lambda k, v: _fibonacci(v[0]),
    ),
)
TEMPLATES_BY_NAME = {template.name: template for template in TEMPLATES}

ORACLES = ("solution", "drafts")
ARITHMETIC_WORDS = ("add", "sub", "mul", "div")


def flawed_draft(solution: str, input_names: tuple[str, ...], rng: np.random.Generator) -> str:
    """``solution`` with one random slip, as a programmer's draft makes them: a numeric literal off by
    1 to 5, an arithmetic word swapped for another, an input name mistyped, or a word left out. The
    slips give every kind of feedback: wrong values, type and stack errors, compile errors."""
    words = solution.split()
    slip = ("constant", "operator", "name", "omission")[int(rng.integers(4))]
    literals = [i for i, word in enumerate(words) if word.lstrip("-").isdigit()]
    operators = [i for i, word in enumerate(words) if word in ARITHMETIC_WORDS]
    names = [i for i, word in enumerate(words) if word in input_names]
    if slip == "constant" and literals:
        i = literals[int(rng.integers(len(literals)))]
        words[i] = str(int(words[i]) + int(rng.choice([-1, 1])) * int(rng.integers(1, 6)))
    elif slip == "operator" and operators:
        i = operators[int(rng.integers(len(operators)))]
        words[i] = str(rng.choice([word for word in ARITHMETIC_WORDS if word != words[i]]))
    elif slip == "name" and names:
        i = names[int(rng.integers(len(names)))]
        words[i] = str(rng.choice([name for name in ("x", "y", "a", "b", "n") if name != words[i]]))
    else:
        del words[int(rng.integers(len(words)))]
    return " ".join(words)


def _show_inputs(names: tuple[str, ...], values: tuple[int, ...]) -> str:
    return ", ".join(f"{name}={value}" for name, value in zip(names, values))


def _show_stack(stack: list[int | bool]) -> str:
    shown = ["true" if v is True else "false" if v is False else str(v) for v in stack[-8:]]
    return "[" + ("... " if len(stack) > 8 else "") + " ".join(shown) + "]"


def _result_problem(stack: list[int | bool], expected: int) -> str | None:
    """What is wrong with the final stack of one test run, or None when it holds exactly ``expected``."""
    if len(stack) != 1:
        return (
            f"failed: the program left {len(stack)} values on the stack {_show_stack(stack)}; expected exactly one int"
        )
    result = stack[0]
    if type(result) is bool:
        return f"failed: the result is the bool {'true' if result else 'false'}; expected an int"
    if result != expected:
        return f"failed: expected {expected}, got {result}"
    return None


class MiniCodeEnv(TextEnv):
    """Write a MiniCode program (see ``agent_rl.envs.minicode_lang.REFERENCE``) that passes hidden tests.

    Each step submits a whole program on one line (later lines are dropped; actions are lower-cased).
    The task text holds the problem, the input names, one worked example (the first test) and the
    full language reference, so a policy needs nothing else. The action set is infinite:
    ``info["admissible_actions"]`` is absent.

    Knobs:
        level: 1 straight-line arithmetic, 2 conditionals, 3 loops (default 2). Tasks are drawn from
            the templates of exactly this level.
        templates: names of templates to draw from instead (overrides ``level``); see ``TEMPLATES``.
        reference: whether the task text ends with the language reference (default True). A policy
            that learns the language from demonstrations, as a small model cloned from scratch does,
            needs none, and the task text is then about an eighth as long.
        oracle: what ``oracle()`` plans. ``"solution"`` (default): the template's solution, which wins
            in one step. ``"drafts"``: a programmer who, before each submission, has written a flawed
            draft (one random slip, see ``flawed_draft``) with probability ``draft_rate`` and submits
            it; the plan runs until the solution or until the attempts run out, so it may lose. It
            is drawn from a generator seeded by the task and the submissions so far, so the same state
            always gives the same plan. Cloning it gives a warm start that knows the solution but
            submits drafts, a policy whose success reinforcement learning can raise.
        draft_rate: the probability of a draft per submission for ``oracle="drafts"`` (default 0.5).
        n_tests: hidden tests per task (default 5); the program must pass all of them.
        max_steps and the reward knobs: see ``TextEnv`` (default 10 submissions).

    Feedback: compile errors as ``program:1:COL: error: ...`` with the source line and a caret;
    ``type error``/``runtime error`` at the failing instruction inside the test that hit it; the
    first failed test with its input, expected and actual values. ``info["error"]`` is that text
    (None on success), ``action_valid`` is False when the program does not compile.
    Anchor: hash of the task and the last submitted program. Oracle: the template's solution, or
    drafts before it (``oracle="drafts"``).
    """

    def __init__(
        self,
        *,
        level: int = 2,
        templates: tuple[str, ...] | list[str] | None = None,
        n_tests: int = 5,
        reference: bool = True,
        oracle: str = "solution",
        draft_rate: float = 0.5,
        max_steps: int = 10,
        **reward_and_render: Any,
    ) -> None:
        super().__init__(max_steps=max_steps, **reward_and_render)
        if oracle not in ORACLES:
            raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}")
        if not 0.0 <= draft_rate < 1.0:
            raise ValueError(f"draft_rate must be in [0, 1), got {draft_rate}")
        self.reference, self.oracle_kind, self.draft_rate = bool(reference), oracle, float(draft_rate)
        if templates is not None:
            unknown = [name for name in templates if name not in TEMPLATES_BY_NAME]
            if unknown or not templates:
                raise ValueError(f"unknown MiniCode templates {unknown}; known: {sorted(TEMPLATES_BY_NAME)}")
            self.templates = tuple(TEMPLATES_BY_NAME[name] for name in templates)
        else:
            levels = sorted({template.level for template in TEMPLATES})
            if level not in levels:
                raise ValueError(f"level must be one of {levels}, got {level}")
            self.templates = tuple(template for template in TEMPLATES if template.level == level)
        if not 1 <= n_tests <= 100:
            raise ValueError(f"n_tests must be in [1, 100], got {n_tests}")
        self.n_tests = int(n_tests)
        self._template = self.templates[0]
        self._constants: dict[str, int] = {}
        self._tests: list[tuple[tuple[int, ...], int]] = []
        self._solution = ""
        self._task_key = ""
        self._anchor = ""
        self._passed = False

    def _new_game(self, options: dict[str, Any] | None) -> str:
        rng = self.np_random
        template = self.templates[int(rng.integers(len(self.templates)))]
        constants = {name: int(rng.integers(low, high + 1)) for name, (low, high) in template.constants.items()}
        low, high = template.input_range
        values = rng.integers(low, high + 1, size=(self.n_tests, len(template.inputs)))
        self._template = template
        self._constants = constants
        self._tests = [(inputs, template.expected(constants, inputs)) for inputs in map(tuple, values.tolist())]
        self._solution = template.solution.format(**constants)
        example_inputs, example_output = self._tests[0]
        statement = template.statement.format(**constants)
        self.task = (
            f"Write a MiniCode program. Inputs: {', '.join(template.inputs)}. {statement}\n"
            f"Example: {_show_inputs(template.inputs, example_inputs)} -> {example_output}.\n"
            f"Submit the whole program on one line; it runs on {self.n_tests} hidden tests."
            + (f"\n\n{REFERENCE}" if self.reference else "")
        )
        self._task_key = blake2b(f"{self.task}\n{self._tests}".encode(), digest_size=16).hexdigest()
        self._passed = False
        self._set_anchor("")
        return f"Ready. Write a program that returns the answer for inputs {', '.join(template.inputs)}."

    def _set_anchor(self, program: str) -> None:
        self._anchor = blake2b(f"{self._task_key}\n{program}".encode(), digest_size=16).hexdigest()

    def _apply(self, command: str) -> Transition:
        self._set_anchor(command)
        feedback, compiled = self.evaluate(command)
        self._passed = feedback is None
        if feedback is None:
            return Transition(f"All {self.n_tests} tests passed.")
        return Transition(feedback, valid=compiled, error=feedback)

    def evaluate(self, program: str) -> tuple[str | None, bool]:
        """Run ``program`` on the hidden tests: (error text or None when all pass, whether it compiled)."""
        names = self._template.inputs
        compiled = compile_program(program, names)
        if isinstance(compiled, MiniCodeError):
            return compiled.render(program), False
        total = len(self._tests)
        for number, (inputs, expected) in enumerate(self._tests, start=1):
            try:
                problem = _result_problem(run(compiled, inputs), expected)
            except MiniCodeError as error:
                problem = f"failed with an error:\n{error.render(program)}"
            if problem is not None:
                return f"test {number}/{total} ({_show_inputs(names, inputs)}) {problem}", True
        return None, True

    def admissible_actions(self) -> None:
        return None

    def anchor(self) -> str:
        return self._anchor

    def instance_key(self) -> str:
        """The template, its constants and the hidden tests (inputs and expected results)."""
        return f"{self._template.name};{sorted(self._constants.items())};{self._tests}"

    def oracle(self) -> list[str]:
        if self.oracle_kind == "solution":
            return [self._solution]
        rng = np.random.default_rng(
            int(blake2b(f"{self._task_key}\n{self._steps}".encode(), digest_size=8).hexdigest(), 16)
        )
        attempts_left = self.max_steps - self._steps
        plan: list[str] = []
        while len(plan) < attempts_left and rng.random() < self.draft_rate:
            plan.append(flawed_draft(self._solution, self._template.inputs, rng))
        return plan if len(plan) == attempts_left else [*plan, self._solution]

    def is_won(self) -> bool:
        return self._passed
