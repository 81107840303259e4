"""Error fingerprints on a corpus of realistic tool output.

Each family lists the same error with different details (names, numbers, positions, paths,
addresses, counts): all members must share one fingerprint, and different families must differ.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl import envs  # noqa: F401  (registers agent_rl/MiniCode-v0)
from agent_rl.anchors import compute_anchor_keys, error_fingerprint
from agent_rl.envs.minicode_lang import compile_program, run


def py_traceback(path: str, line: int, bad: str, depth_calls: str = "") -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "{path}", line {line + 7}, in <module>\n'
        "    main()\n"
        f'  File "{path}", line {line + 3}, in main\n'
        f"    {depth_calls}return parse(data)\n"
        f'  File "{path}", line {line}, in parse\n'
        "    return int(s)\n"
        "           ^^^^^^\n"
        f"ValueError: invalid literal for int() with base 10: '{bad}'\n"
    )


def recursion_traceback(repeats: int) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/tmp/t/sol.py", line 9, in <module>\n'
        "    fact(5)\n"
        '  File "/tmp/t/sol.py", line 4, in fact\n'
        "    return n * fact(n - 1)\n"
        "               ^^^^^^^^^^^\n"
        '  File "/tmp/t/sol.py", line 4, in fact\n'
        "    return n * fact(n - 1)\n"
        "               ^^^^^^^^^^^\n"
        f"  [Previous line repeated {repeats} more times]\n"
        "RecursionError: maximum recursion depth exceeded\n"
    )


FAMILIES: dict[str, list[str]] = {
    "python_value_error": [
        py_traceback("/tmp/tmpa1b2c3/main.py", 3, "abc"),
        py_traceback("/home/alice/work/solution.py", 31, "12x"),
    ],
    "python_recursion": [recursion_traceback(996), recursion_traceback(17)],
    "python_name_error": [
        "Traceback (most recent call last):\n  File \"main.py\", line 2, in <module>\n    print(foo)\nNameError: name 'foo' is not defined",
        "Traceback (most recent call last):\n  File \"/x/y.py\", line 40, in <module>\n    total += bar\nNameError: name 'bar' is not defined",
    ],
    "python_key_error_bare": ["KeyError: 'user_id'", "KeyError: 'name'"],
    "python_attribute_error": [
        "AttributeError: 'NoneType' object has no attribute 'group'",
        "AttributeError: 'list' object has no attribute 'push'",
    ],
    "python_arg_count": [
        "TypeError: f() takes 2 positional arguments but 3 were given",
        "TypeError: f() takes 1 positional argument but 2 were given",
        "TypeError: f() takes 0 positional arguments but 1 was given",
    ],
    "python_syntax": [
        '  File "/tmp/a/main.py", line 1\n    def f(:\n          ^\nSyntaxError: invalid syntax',
        '  File "b.py", line 17\n    if x = 3:\n         ^\nSyntaxError: invalid syntax',
    ],
    "python_object_repr": [
        "TypeError: unhashable object <__main__.Node object at 0x7f3a2b1c9d40>",
        "TypeError: unhashable object <__main__.Node object at 0x10e4f2a90>",
    ],
    "gcc_undeclared": [
        "main.c: In function 'main':\nmain.c:4:13: error: 'y' undeclared (first use in this function)\n"
        "    4 |     int x = y + 1;\n      |             ^\n",
        "/tmp/build/prog.c: In function 'solve':\n/tmp/build/prog.c:27:9: error: 'count' undeclared (first use in this function)\n"
        "   27 |         count++;\n      |         ^~~~~\n",
    ],
    "clang_undeclared_identifier": [
        "prog.c:3:10: error: use of undeclared identifier 'foo'\n    return foo;\n           ^\n1 error generated.",
        "x.c:12:5: error: use of undeclared identifier 'barBaz'\n    barBaz = 2;\n    ^\n2 errors generated.",
    ],
    "rustc_mismatched_types": [
        'error[E0308]: mismatched types\n --> src/main.rs:2:18\n  |\n2 |     let x: i32 = "hello";\n'
        "  |            ---   ^^^^^^^ expected `i32`, found `&str`\n  |            |\n  |            expected due to this\n\n"
        "For more information about this error, try `rustc --explain E0308`.\nerror: aborting due to 1 previous error",
        "error[E0308]: mismatched types\n --> src/lib.rs:14:20\n   |\n14 |     let y: u8 = vec![1];\n"
        "   |            --   ^^^^^^^ expected `u8`, found `Vec<{integer}>`\n\n"
        'error[E0308]: mismatched types\n --> src/lib.rs:15:20\n   |\n15 |     let z: u8 = "s";\n\n'
        "For more information about this error, try `rustc --explain E0308`.\nerror: aborting due to 2 previous errors",
    ],
    "rustc_unresolved": [
        "error[E0425]: cannot find value `foo` in this scope\n --> src/main.rs:3:13\n  |\n3 |     let a = foo;\n  |             ^^^ not found in this scope",
        "error[E0425]: cannot find value `total_count` in this scope\n --> src/bin/x.rs:30:5",
    ],
    "javac_symbol": [
        "Main.java:3: error: cannot find symbol\n        System.out.println(foo);\n                           ^\n"
        "  symbol:   variable foo\n  location: class Main\n1 error",
        "src/app/Solver.java:118: error: cannot find symbol\n        int k = helper(n);\n                ^\n"
        "  symbol:   method helper(int)\n  location: class Solver\n1 error",
    ],
    "javac_incompatible": [
        'Main.java:5: error: incompatible types: String cannot be converted to int\n        int x = "a";\n                ^\n1 error',
        "Foo.java:9: error: incompatible types: String cannot be converted to int\n        int y = s;\n                ^\n1 error",
    ],
    "tsc_assignable": [
        "src/index.ts(3,7): error TS2322: Type 'string' is not assignable to type 'number'.",
        "lib/util.ts(120,15): error TS2322: Type 'boolean' is not assignable to type 'string'.",
    ],
    "tsc_cannot_find_name": [
        "src/index.ts:4:1 - error TS2304: Cannot find name 'foo'.\n\n4 foo();\n  ~~~\n\nFound 1 error in src/index.ts:4",
        "app.ts:10:3 - error TS2304: Cannot find name 'barQux'.\n\n10   barQux();\n     ~~~~~~\n\nFound 1 error in app.ts:10",
    ],
    "go_undefined": [
        "# command-line-arguments\n./main.go:5:2: undefined: foo",
        "# example.com/app\n./handlers/user.go:41:9: undefined: parseUser",
    ],
    "go_unused": [
        "# command-line-arguments\n./main.go:7:6: declared and not used: x",
        "./cmd/run.go:3:2: declared and not used: count",
    ],
    "go_panic_index": [
        "panic: runtime error: index out of range [5] with length 3\n\ngoroutine 1 [running]:\nmain.main()\n\t/tmp/x/main.go:8 +0x1d\nexit status 2",
        "panic: runtime error: index out of range [10] with length 10\n\ngoroutine 7 [running]:\nmain.work()\n\t/app/w.go:81 +0x2f8\nexit status 2",
    ],
    "pytest_assert": [
        "=================================== FAILURES ===================================\n"
        "___________________________________ test_add ___________________________________\n\n"
        "    def test_add():\n>       assert add(2, 3) == 6\nE       assert 5 == 6\nE        +  where 5 = add(2, 3)\n\n"
        "test_calc.py:5: AssertionError\n=========================== short test summary info ============================\n"
        "FAILED test_calc.py::test_add - assert 5 == 6\n============================== 1 failed in 0.03s ===============================",
        "==================== FAILURES ====================\n____________ test_add ____________\n\n"
        "    def test_add():\n>       assert add(10, 1) == 12\nE       assert 11 == 12\nE        +  where 11 = add(10, 1)\n\n"
        "tests/test_calc.py:14: AssertionError\n============ short test summary info =============\n"
        "FAILED tests/test_calc.py::test_add - assert 11 == 12\n========= 1 failed, 4 passed in 1.27s =========",
    ],
    "shell_command_not_found": ["bash: pythn: command not found", "bash: gti: command not found"],
    "sh_not_found": ["sh: 1: pythn: not found", "sh: 12: mkae: not found"],
    "zsh_not_found": ["zsh: command not found: pythn", "zsh: command not found: sl"],
    "no_such_file": ["cat: notes.txt: No such file or directory", "cat: /etc/missing/conf: No such file or directory"],
    "log_line": [
        "2024-05-01 12:00:03,123 ERROR worker 3f2a9c1e-1b2c-4d5e-8f90-123456789abc failed at 0x7ffd1234abcd",
        "2025-11-30T23:59:59Z ERROR worker 00000000-aaaa-4bbb-8ccc-dddddddddddd failed at 0x1",
    ],
    "minicode_unknown_word": ["error: 1:7: unknown word 'dupp'", "error: 1:12: unknown word 'swapp'"],
    "minicode_underflow": [
        "error: 1:3: stack underflow in 'add' (needs 2, has 1)",
        "error: 1:15: stack underflow in 'mul' (needs 2, has 0)",
    ],
    "minicode_wrong_answer": [
        "wrong answer: input (3, 4): expected 11, got 7",
        "wrong answer: input (-2, 10): expected -20, got 8",
    ],
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_same_error_different_details_collide(family):
    fingerprints = {error_fingerprint(text) for text in FAMILIES[family]}
    assert len(fingerprints) == 1, fingerprints
    assert fingerprints != {""}


def test_different_errors_differ():
    representatives = {family: error_fingerprint(texts[0]) for family, texts in FAMILIES.items()}
    by_fingerprint: dict[str, list[str]] = {}
    for family, fingerprint in representatives.items():
        by_fingerprint.setdefault(fingerprint, []).append(family)
    assert [families for families in by_fingerprint.values() if len(families) > 1] == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("error: 1:7: unknown word 'dupp'", "error: <n>:<n>: unknown word <q>"),
        ("wrong answer: input (3, 4): expected 11, got 7", "wrong answer: input (<n>...): expected <n>, got <n>"),
        (
            "test 2/5 (x=4) failed: the program left 3 values on the stack [1 2 3]; expected exactly one int",
            "test <n>/<n> (x=<n>) failed: the program left <n> value on the stack [<n>...]; expected exactly one int",
        ),
        (
            py_traceback("/tmp/x.py", 3, "abc"),
            "Traceback(<module> > main > parse): ValueError: invalid literal for int() with base <n>: <q>",
        ),
        (recursion_traceback(5), "Traceback(<module> > fact): RecursionError: maximum recursion depth exceeded"),
        ("./main.go:5:2: undefined: foo", "<path>:<n>:<n>: undefined: <name>"),
        ("bash: pythn: command not found", "bash: <name>: command not found"),
        ("2024-05-01 12:00:03 run 3f2a9c1e-1b2c-4d5e-8f90-123456789abc at 0xdeadbeef", "<time> run <uuid> at <hex>"),
        ("You can't go that way.", "You can't go that way."),
        ("", ""),
        (" \n\t ", ""),
    ],
)
def test_hand_computed_templates(text, expected):
    assert error_fingerprint(text) == expected


def test_multi_error_output_is_ordered_list_with_consecutive_repeats_merged():
    go = "./a.go:1:2: undefined: x\n./a.go:2:2: undefined: y\n./a.go:3:6: declared and not used: z\n./a.go:9:2: undefined: w"
    assert error_fingerprint(go).split("\n") == [
        "<path>:<n>:<n>: undefined: <name>",
        "<path>:<n>:<n>: declared and not used: <name>",
        "<path>:<n>:<n>: undefined: <name>",
    ]
    swapped = "./a.go:3:6: declared and not used: z\n./a.go:1:2: undefined: x"
    assert error_fingerprint(swapped) != error_fingerprint(go)


def test_chained_python_exceptions_keep_both_templates():
    text = (
        "Traceback (most recent call last):\n  File \"a.py\", line 3, in load\n    d[k]\nKeyError: 'k'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "a.py", line 5, in load\n    raise ValueError(k)\nValueError: k\n'
    )
    assert error_fingerprint(text).split("\n") == [
        "Traceback(load): KeyError: <q>",
        "During handling of the above exception, another exception occurred:",
        "Traceback(load): ValueError: <name>",
    ]


def test_different_call_paths_differ():
    a = py_traceback("/tmp/x.py", 3, "abc")
    b = a.replace("in main", "in run")
    assert error_fingerprint(a) != error_fingerprint(b)


def _minicode_feedback(source: str, inputs: tuple[int, ...] = (3, 4)) -> str:
    compiled = compile_program(source, ("a", "b"))
    if not hasattr(compiled, "ops"):
        return compiled.render(source)
    try:
        run(compiled, inputs)
    except Exception as error:  # MiniCodeError from the interpreter
        return error.render(source)
    raise AssertionError(f"{source!r} ran without error")


def test_real_minicode_diagnostics():
    unknown = [_minicode_feedback("a dupp add"), _minicode_feedback("a b swap mull")]
    underflow = [_minicode_feedback("add"), _minicode_feedback("a b add mul")]
    assert error_fingerprint(unknown[0]) == error_fingerprint(unknown[1]) == "program:<n>:<n>: error: unknown word <q>"
    assert error_fingerprint(underflow[0]) == error_fingerprint(underflow[1])
    assert error_fingerprint(underflow[0]).startswith("program:<n>:<n>: runtime error: stack underflow")
    assert "|" not in error_fingerprint(unknown[0])  # the source line and caret are dropped


def test_minicode_env_feedback_groups_by_error_kind():
    """Real feedback of the MiniCode environment: programs that fail the same way share a
    fingerprint key, whatever the word, column, test number or values."""
    env = gym.make("agent_rl/MiniCode-v0", templates=["clamp"], max_steps=20)
    env.reset(seed=0)
    kinds = {
        "unknown word": ["x dupp add", "x x swapp"],
        "underflow": ["add", "x add"],
        "wrong answer": ["1", "x 1000 add"],
        "leftover values": ["1 2", "x 1 2 3"],
    }
    errors, observations, labels = [], [], []
    for kind, programs in kinds.items():
        for program in programs:
            observation, _, _, _, info = env.step(program)
            assert info["error"], program
            errors.append(info["error"])
            observations.append(observation)
            labels.append(kind)
    keys = compute_anchor_keys("fingerprint", observations, errors)
    for i in range(len(labels)):
        for j in range(len(labels)):
            assert (keys[i] == keys[j]) == (labels[i] == labels[j]), (errors[i], errors[j])


@settings(deadline=None)
@given(st.text(max_size=200))
def test_fingerprint_is_total_and_deterministic(text):
    fingerprint = error_fingerprint(text)
    assert error_fingerprint(text) == fingerprint
    assert "\n\n" not in fingerprint and fingerprint == fingerprint.strip()
