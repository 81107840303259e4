"""MiniCode: the interpreter against hand-computed values, toolchain-style errors, limits, hostile
input, the task templates against their reference semantics, oracle wins and determinism."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl import envs
from agent_rl.envs import check_text_env, oracle_actions
from agent_rl.envs.base import clean_observation
from agent_rl.envs.minicode import TEMPLATES, MiniCodeEnv, flawed_draft
from agent_rl.envs.minicode_lang import (
    INT_LIMIT,
    MAX_INSTRUCTIONS,
    MAX_STACK,
    SIMPLE_WORDS,
    MiniCodeError,
    compile_program,
    run,
)


def execute(source: str, inputs: tuple[int, ...] = (), names: tuple[str, ...] = ()) -> list:
    program = compile_program(source, names)
    if isinstance(program, MiniCodeError):
        raise program
    return run(program, inputs)


def error_of(source: str, inputs: tuple[int, ...] = (), names: tuple[str, ...] = ()) -> MiniCodeError:
    with pytest.raises(MiniCodeError) as caught:
        execute(source, inputs, names)
    return caught.value


# ---- the interpreter ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "inputs", "names", "stack"),
    [
        ("1 2 add", (), (), [3]),
        ("7 3 sub", (), (), [4]),
        ("6 7 *", (), (), [42]),
        ("7 2 div 7 2 mod", (), (), [3, 1]),
        ("-7 2 div -7 2 mod", (), (), [-4, 1]),  # floor division: -7 = 2 * -4 + 1
        ("7 -2 / 7 -2 %", (), (), [-4, -1]),
        ("5 neg", (), (), [-5]),
        ("1 2 dup", (), (), [1, 2, 2]),
        ("1 2 drop", (), (), [1]),
        ("1 2 swap", (), (), [2, 1]),
        ("1 2 over", (), (), [1, 2, 1]),
        ("1 2 3 rot", (), (), [2, 3, 1]),
        ("3 4 lt 4 3 lt 3 3 le 3 3 ge 4 3 gt 3 3 ne", (), (), [True, False, True, True, True, False]),
        ("2 2 = 2 3 != true false eq", (), (), [True, True, False]),
        ("true false and true false or true not", (), (), [False, True, False]),
        ("x y sub", (10, 3), ("x", "y"), [7]),
        ("x 0 lt if x neg else x then", (-9,), ("x",), [9]),
        ("x 0 lt if x neg else x then", (4,), ("x",), [4]),
        ("x 0 gt if 1 else x 0 lt if -1 else 0 then then", (0,), ("x",), [0]),
        ("x 0 gt if 1 else x 0 lt if -1 else 0 then then", (-3,), ("x",), [-1]),
        ("5 true if 1 add then", (), (), [6]),
        ("5 false if 1 add then", (), (), [5]),
        ("0 4 times i add end", (), (), [6]),  # 0 + 0 + 1 + 2 + 3
        ("0 0 times 99 add end", (), (), [0]),  # a zero count skips the body
        ("0 3 times 2 times 1 add end end", (), (), [6]),  # nested loops: 3 * 2 iterations
        ("0 3 times 2 times i add end end", (), (), [3]),  # i is the innermost counter: 3 * (0 + 1)
        ("1 5 times 2 mul end", (), (), [32]),
        ("0 1 10 times swap over add end drop", (), (), [55]),  # fib(10)
        ("+5 -0 007", (), (), [5, 0, 7]),
    ],
)
def test_interpreter_hand_computed(source, inputs, names, stack):
    assert execute(source, inputs, names) == stack


def test_results_keep_their_types():
    (value,) = execute("1 1 eq")
    assert value is True
    (value,) = execute("2 1 add")
    assert type(value) is int


@pytest.mark.parametrize(
    ("source", "kind", "col", "needle"),
    [
        ("1 2 foo add", "error", 5, "unknown word 'foo'"),
        ("1 3 mul bar", "error", 9, "unknown word 'bar'"),
        ("1 2x", "error", 3, "invalid number literal '2x'"),
        ("1 99999999999999999999", "error", 3, "out of range"),
        ("1 2 then", "error", 5, "'then' without a matching 'if'"),
        ("1 else", "error", 3, "'else' without a matching 'if'"),
        ("1 end", "error", 3, "'end' without a matching 'times'"),
        ("true if 1", "error", 6, "unterminated 'if'"),
        ("3 times 1", "error", 3, "unterminated 'times'"),
        ("1 i add", "error", 3, "'i' used outside a 'times' loop"),
        ("", "error", 1, "empty program"),
        ("1 add", "runtime error", 3, "stack underflow: 'add' needs 2 values, the stack has 1"),
        ("drop", "runtime error", 1, "'drop' needs 1 value, the stack has 0"),
        ("1 true add", "type error", 8, "'add' expects int, int but got int 1, bool true"),
        ("1 if 2 then", "type error", 3, "'if' expects a bool condition but got int 1"),
        ("1 2 eq 1 eq", "type error", 10, "cannot compare bool false with int 1"),
        ("1 0 div", "runtime error", 5, "division by zero in 'div'"),
        ("1 0 %", "runtime error", 5, "division by zero in 'mod'"),
        ("-1 times end", "runtime error", 4, "'times' count must be >= 0, got -1"),
        ("true times end", "type error", 6, "'times' expects an int count"),
        ("5 not", "type error", 3, "'not' expects bool but got int 5"),
        ("1 true or", "type error", 8, "'or' expects bool, bool"),
        (f"{INT_LIMIT} 1 add", "runtime error", 23, "integer overflow in 'add'"),
        (f"{INT_LIMIT} 2 mul", "runtime error", 23, "integer overflow in 'mul'"),
    ],
)
def test_errors_name_the_position_and_the_word(source, kind, col, needle):
    error = error_of(source)
    assert (error.kind, error.col) == (kind, col)
    assert needle in error.message
    text = error.render(source)
    first, excerpt, caret = text.split("\n")
    assert first == f"program:1:{col}: {kind}: {error.message}"
    assert excerpt == f"    1 | {source}"
    assert caret.index("^") - len("      | ") == col - 1


def test_caret_underlines_the_whole_word():
    text = error_of("1 2 frobnicate").render("1 2 frobnicate")
    assert text.endswith("|     ^~~~~~~~~~")


def test_instruction_limit():
    error = error_of("1000000 times end")
    assert error.kind == "runtime error" and f"instruction limit exceeded ({MAX_INSTRUCTIONS}" in error.message
    assert execute("0 100 times 1 add end") == [100]
    with pytest.raises(MiniCodeError, match="instruction limit exceeded \\(50"):
        run(compile_program("0 100 times 1 add end", ()), (), max_instructions=50)


def test_stack_and_nesting_limits():
    assert "stack overflow" in error_of("1 1000 times dup end").message
    assert len(execute("1 " * MAX_STACK)) == MAX_STACK
    assert "stack overflow" in error_of("1 " * (MAX_STACK + 1)).message
    deep = "true if " * 32 + "1" + " then" * 32
    assert execute(deep) == [1]
    assert "nesting too deep" in error_of("true if " * 33 + "1" + " then" * 33).message


def test_literal_limits():
    assert execute(f"{INT_LIMIT} {-INT_LIMIT}") == [INT_LIMIT, -INT_LIMIT]
    assert "out of range" in error_of(str(INT_LIMIT + 1)).message
    assert "out of range" in error_of("9" * 100_000).message  # never handed to int()


WORDS = sorted(SIMPLE_WORDS) + [
    "if",
    "else",
    "then",
    "times",
    "end",
    "true",
    "false",
    "x",
    "y",
    "0",
    "1",
    "-3",
    "7",
    "??",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=40), st.integers(-(2**63) + 1, 2**63 - 1))
def test_random_programs_only_raise_minicode_errors(words, x):
    """Any word soup compiles to a program or a MiniCodeError, and runs to a stack or a MiniCodeError."""
    source = " ".join(words)
    program = compile_program(source, ("x",))
    if isinstance(program, MiniCodeError):
        assert program.render(source).startswith("program:1:")
        return
    try:
        stack = run(program, (x,))
    except MiniCodeError as error:
        assert error.kind in ("runtime error", "type error")
        return
    assert len(stack) <= MAX_STACK
    assert all(type(v) is bool or -INT_LIMIT <= v <= INT_LIMIT for v in stack)


# ---- the task templates ------------------------------------------------------------------------
@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.name)
def test_template_solution_matches_reference_semantics(template):
    """The oracle program (interpreted) agrees with the template's Python reference on random draws."""
    rng = np.random.default_rng(0)
    for _ in range(100):
        constants = {n: int(rng.integers(lo, hi + 1)) for n, (lo, hi) in template.constants.items()}
        inputs = tuple(
            int(v) for v in rng.integers(template.input_range[0], template.input_range[1] + 1, len(template.inputs))
        )
        assert execute(template.solution.format(**constants), inputs, template.inputs) == [
            template.expected(constants, inputs)
        ]
    for bound in template.input_range:  # both ends of the input range
        inputs = (bound,) * len(template.inputs)
        constants = {n: hi for n, (lo, hi) in template.constants.items()}
        assert execute(template.solution.format(**constants), inputs, template.inputs) == [
            template.expected(constants, inputs)
        ]


# ---- the environment ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs", [dict(level=1), dict(level=2), dict(level=3, n_tests=12), dict(level=1, reference=False, oracle="drafts")]
)
def test_checker_passes(kwargs):
    assert check_text_env(MiniCodeEnv(**kwargs)).checks[-1] == "usable_after_fuzz"


def test_checker_passes_through_gymnasium_make():
    env = gym.make("agent_rl/MiniCode-v0", level=3)
    assert check_text_env(env).env_id == "agent_rl/MiniCode-v0"
    assert envs.text_env_spec("agent_rl/MiniCode-v0").default_anchor == "fingerprint"


@pytest.mark.parametrize(
    "kwargs", [dict(level=1), dict(level=2), dict(level=3), dict(level=2, n_tests=1), dict(level=3, n_tests=30)]
)
def test_oracle_wins_on_20_seeds(kwargs):
    env = MiniCodeEnv(**kwargs)
    for seed in range(20):
        observation, info = env.reset(seed=seed)
        assert "admissible_actions" not in info and not info["won"]
        plan = oracle_actions(env)
        assert len(plan) == 1
        observation, reward, terminated, truncated, info = env.step(plan[0])
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info["won"] and info["action_valid"] and info["error"] is None
        assert observation == f"All {env.n_tests} tests passed."


def test_task_shows_problem_example_and_reference():
    env = MiniCodeEnv(templates=["linear"])
    _, info = env.reset(seed=4)
    m, c = re.search(r"Return (\d+)\*x \+ (-?\d+)\.", info["task"]).groups()
    example = re.search(r"Example: x=(-?\d+) -> (-?\d+)\.", info["task"])
    assert int(example.group(2)) == int(m) * int(example.group(1)) + int(c)
    assert "MiniCode reference" in info["task"] and "times ... end" in info["task"]
    assert env.oracle() == [f"x {m} mul {c} add"]


def test_determinism_per_seed_and_variety_across_seeds():
    a, b = MiniCodeEnv(level=2), MiniCodeEnv(level=2)
    tasks = set()
    for seed in range(15):
        first, second = a.reset(seed=seed), b.reset(seed=seed)
        assert first == second
        assert a.step("x 1 add")[:4] == b.step("x 1 add")[:4]
        tasks.add(first[1]["task"])
    assert len(tasks) == 15


def test_feedback_kinds_validity_and_anchor():
    env = MiniCodeEnv(templates=["maximum"], max_steps=20)
    _, info = env.reset(seed=1)
    start_anchor = info["anchor"]
    (a, b), expected = env._tests[0]
    observation, _, _, _, info = env.step("a b foo")
    assert not info["action_valid"] and info["error"] == observation
    assert observation.startswith("program:1:5: error: unknown word 'foo'")
    anchor_foo = info["anchor"]
    observation, _, _, _, info = env.step("a b add")
    assert info["action_valid"] and not info["won"]
    assert observation == f"test 1/5 (a={a}, b={b}) failed: expected {expected}, got {a + b}"
    observation, _, _, _, info = env.step("a b 0 div")
    assert info["action_valid"] and observation.startswith(
        f"test 1/5 (a={a}, b={b}) failed with an error:\nprogram:1:7: runtime error"
    )
    observation, _, _, _, info = env.step("a b")
    assert "left 2 values on the stack" in observation and f"[{a} {b}]" in observation
    observation, _, _, _, info = env.step("a b gt")
    assert "the result is the bool" in observation
    # The anchor is the (task, program) pair: a resubmission returns to it, the start is distinct.
    _, _, _, _, info = env.step("a b foo")
    assert info["anchor"] == anchor_foo != start_anchor


def test_wrong_answer_reports_the_first_failing_test():
    env = MiniCodeEnv(templates=["absolute"], n_tests=20)
    env.reset(seed=0)
    first_negative = next(k for k, ((x,), _) in enumerate(env._tests, 1) if x < 0)
    x = env._tests[first_negative - 1][0][0]
    observation, *_ = env.step("x")
    assert observation == f"test {first_negative}/20 (x={x}) failed: expected {-x}, got {x}"


HOSTILE = [
    "x " * 50_000,
    "9" * 100_000,
    "\x00\x01\x1b[2J x \x7f",
    "x 1 add\nrm -rf /\nquit",
    "1000000000 times 1000000000 times end end",
    "true if " * 200 + "1",
    "1 " * 300,
    "x 4611686018427387904 mul 4 mul",
    "__import__('os').system('ls')",
    "🙂 走 ∑",
    "",
    "   ",
]


@pytest.mark.parametrize("action", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_programs_get_feedback_not_crashes(action):
    env = MiniCodeEnv(templates=["linear"], max_steps=50)
    env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step(action)
    assert observation in env.observation_space and observation == clean_observation(info["error"])
    assert not info["won"] and not terminated and reward == 0.0
    observation, reward, terminated, *_ = env.step(env.oracle()[0])  # still playable
    assert terminated and reward == 1.0


# Programs per error class for one task (templates=["maximum"], seed=0): the same class, different
# details. Error fingerprints must map each class to one template; exact text never repeats.
ERROR_CLASSES = {
    "unknown word": ["a b mx", "a b maxx", "a foo b", "a b swap bar drop"],
    "invalid literal": ["a 3b add", "1x", "a b 0xff"],
    "unterminated block": ["a b gt if a", "3 times a", "a b lt if a else b"],
    "stack underflow": ["a add", "a b add add", "drop", "a b swap drop drop drop"],
    "type error": ["a b gt 1 add", "a if 1 then", "a b lt not 2 mul", "true 2 eq"],
    "division by zero": ["a 0 div", "a b 0 mod", "b a a sub div"],
    "wrong answer": ["a", "b", "a b add", "a b sub", "a b mul"],
    "stack shape": ["a b", "a b a", "1 2 3 4"],
    "instruction limit": ["1000000 times end a", "a 99999 times 1 add end", "50000 times a drop end b"],
}


def test_same_error_class_different_raw_text():
    env = MiniCodeEnv(templates=["maximum"], max_steps=100)
    env.reset(seed=0)
    texts = []
    for name, programs in ERROR_CLASSES.items():
        raw = [env.evaluate(program)[0] for program in programs]
        assert all(text is not None for text in raw), name
        assert len(set(raw)) == len(raw), f"{name}: exact texts repeat"
        texts += raw
    assert len(set(texts)) == len(texts)


def test_bad_knobs_are_rejected():
    with pytest.raises(ValueError, match="level must be one of"):
        MiniCodeEnv(level=7)
    with pytest.raises(ValueError, match="unknown MiniCode templates \\['nope'\\]"):
        MiniCodeEnv(templates=["linear", "nope"])
    with pytest.raises(ValueError, match="n_tests"):
        MiniCodeEnv(n_tests=0)
    with pytest.raises(ValueError, match="oracle must be one of \\('solution', 'drafts'\\), got 'nope'"):
        MiniCodeEnv(oracle="nope")
    with pytest.raises(ValueError, match="draft_rate must be in \\[0, 1\\), got 1.0"):
        MiniCodeEnv(oracle="drafts", draft_rate=1.0)


def test_task_without_reference_keeps_problem_and_example():
    with_reference, without = MiniCodeEnv(level=1), MiniCodeEnv(level=1, reference=False)
    task = with_reference.reset(seed=3)[1]["task"]
    short = without.reset(seed=3)[1]["task"]
    assert "MiniCode reference" in task and "MiniCode reference" not in short
    assert task.startswith(short) and "Example:" in short and "hidden tests." in short
    assert len(short) < len(task) / 3


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(TEMPLATES), st.integers(0, 2**32 - 1))
def test_a_draft_is_its_solution_with_one_slip(template, seed):
    solution = template.solution.format(**{name: low for name, (low, _) in template.constants.items()})
    draft = flawed_draft(solution, template.inputs, np.random.default_rng(seed)).split()
    words = solution.split()
    if len(draft) == len(words):  # one word replaced
        assert sum(a != b for a, b in zip(draft, words)) == 1
    else:  # one word left out
        assert len(draft) == len(words) - 1
        assert any(words[:i] + words[i + 1 :] == draft for i in range(len(words)))


def test_drafts_oracle_plans_drafts_then_the_solution_deterministically():
    env = MiniCodeEnv(level=1, max_steps=4, oracle="drafts", draft_rate=0.5)
    lengths, losing = [], 0
    for seed in range(400):
        env.reset(seed=seed)
        plan = env.oracle()
        assert env.oracle() == plan  # the same state, the same plan
        assert plan[:-1] == [step for step in plan[:-1] if step != env._solution]
        if plan[-1] != env._solution:
            assert len(plan) == 4  # only a plan that runs out of attempts loses
            losing += 1
        lengths.append(len(plan))
    # P(first submission is the solution) = 1 - rate, P(four drafts) = rate ** 4.
    assert 0.42 < lengths.count(1) / 400 < 0.58
    assert 0.03 < losing / 400 < 0.11
    # From a later state the plan fits the attempts left.
    env.reset(seed=1)
    env.step("x")
    env.step("x")
    assert 1 <= len(env.oracle()) <= 2


def test_drafts_oracle_with_rate_zero_is_the_solution():
    env = MiniCodeEnv(level=2, oracle="drafts", draft_rate=0.0)
    for seed in range(10):
        env.reset(seed=seed)
        assert env.oracle() == [env._solution]
