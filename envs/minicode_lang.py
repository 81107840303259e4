"""MiniCode: a tiny stack language that agent-rl defines, compiles and interprets itself.

``REFERENCE`` below is the language reference; the environment shows it to the policy in the task.
Errors read like a compiler's: ``program:LINE:COL: KIND: MESSAGE`` followed by the source line and a
caret under the offending word. Programs are compiled once to flat arrays of opcodes with resolved
jump targets (cached per source string), so the interpreter is one loop without recursion; model
output is never handed to Python's ``exec``/``eval``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

REFERENCE = """\
MiniCode reference. A program is one line of words separated by spaces, run left to right on a stack of ints and bools.
- literals: integers like -12 or 7, true, false. Input names (e.g. x, or a b) push that input.
- stack: dup (a -- a a), drop (a --), swap (a b -- b a), over (a b -- a b a), rot (a b c -- b c a).
- arithmetic: add sub mul div mod neg (or + - * / %); div and mod round toward minus infinity.
- compare: eq ne lt le gt ge (or = != < <= > >=) push a bool; logic: and or not take bools.
- binary words pop the top value as the right operand: "a b sub" is a - b.
- control: "COND if ... else ... then" (else part optional; COND must be a bool); "N times ... end" runs the body N times, and inside it i pushes the 0-based counter.
- the result is the single value left on the stack. Limits: 10000 instructions, 256 stack values, 32 nested blocks.
Examples: "x 1 add dup mul" is (x+1)*(x+1); "x 5 gt if 1 else 0 then" is 1 when x > 5, else 0; "0 4 times i add end" is 0+1+2+3."""

MAX_INSTRUCTIONS = 10_000
MAX_STACK = 256
MAX_NESTING = 32
INT_LIMIT = 2**63 - 1
_MAX_LITERAL_DIGITS = 19  # longer literals are out of range; never hand huge digit strings to int()

# Opcodes, numbered so that the interpreter tests ranges: stack growers first, then int-int words.
PUSH, INPUT, INDEX, DUP, OVER, DROP, SWAP, ROT = range(8)
ADD, SUB, MUL, LT, LE, GT, GE, DIV, MOD = range(8, 17)
NEG, EQ, NE, NOT, AND, OR = range(17, 23)
IF, JUMP, TIMES, END = range(23, 27)
ARITY = (0, 0, 0, 1, 2, 1, 2, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 2, 2, 1, 2, 2, 1, 0, 1, 0)
"""Stack values each opcode needs."""

SIMPLE_WORDS = {
    "dup": DUP,
    "drop": DROP,
    "swap": SWAP,
    "over": OVER,
    "rot": ROT,
    "add": ADD,
    "+": ADD,
    "sub": SUB,
    "-": SUB,
    "mul": MUL,
    "*": MUL,
    "div": DIV,
    "/": DIV,
    "mod": MOD,
    "%": MOD,
    "neg": NEG,
    "eq": EQ,
    "=": EQ,
    "ne": NE,
    "!=": NE,
    "lt": LT,
    "<": LT,
    "le": LE,
    "<=": LE,
    "gt": GT,
    ">": GT,
    "ge": GE,
    ">=": GE,
    "and": AND,
    "or": OR,
    "not": NOT,
    "i": INDEX,
}
OP_NAMES = {op: word for word, op in reversed(SIMPLE_WORDS.items())}  # the spelled-out name wins
OP_NAMES.update({IF: "if", TIMES: "times", END: "end", JUMP: "else"})

_WORD = re.compile(r"\S+")
_INTEGER = re.compile(r"[+-]?[0-9]+")


class MiniCodeError(Exception):
    """A compile or runtime error at ``col`` (1-based) of the single source line."""

    def __init__(self, kind: str, col: int, message: str, width: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.col = col
        self.message = message
        self.width = max(1, width)

    def render(self, source: str) -> str:
        """The diagnostic as a compiler prints it: location, message, source line, caret."""
        caret = " " * (self.col - 1) + "^" + "~" * (self.width - 1)
        return f"program:1:{self.col}: {self.kind}: {self.message}\n    1 | {source}\n      | {caret}"


@dataclass(frozen=True)
class Program:
    """A compiled program: parallel arrays, one entry per instruction."""

    ops: tuple[int, ...]
    """Opcode of each instruction."""
    args: tuple[object, ...]
    """Literal value, input index or jump target (None where unused)."""
    cols: tuple[int, ...]
    """1-based source column of each instruction, for error messages."""
    widths: tuple[int, ...]
    """Length of the source word of each instruction (the caret width)."""
    end_col: int
    """Column just past the last word: where end-of-program errors point."""


def _quote(word: str) -> str:
    return repr(word if len(word) <= 24 else word[:21] + "...")


def _literal(word: str, col: int) -> int:
    digits = word.lstrip("+-")
    if len(digits.lstrip("0")) > _MAX_LITERAL_DIGITS or abs(int(word)) > INT_LIMIT:
        raise MiniCodeError(
            "error", col, f"integer literal {_quote(word)} out of range (limit is +-{INT_LIMIT})", len(word)
        )
    return int(word)


@lru_cache(maxsize=8192)
def compile_program(source: str, input_names: tuple[str, ...]) -> Program | MiniCodeError:
    """Compile ``source``; returns the program, or the first compile error (cached either way)."""
    try:
        return _compile(source, input_names)
    except MiniCodeError as error:
        return error


def _compile(source: str, input_names: tuple[str, ...]) -> Program:
    inputs = {name: index for index, name in enumerate(input_names)}
    ops: list[int] = []
    args: list[object] = []
    cols: list[int] = []
    widths: list[int] = []
    open_blocks: list[tuple[str, int, int, int]] = []  # (word, instruction index, col, width)
    for match in _WORD.finditer(source):
        word, col, width = match.group(), match.start() + 1, len(match.group())
        arg: object = None
        if word in SIMPLE_WORDS:
            op = SIMPLE_WORDS[word]
            if op == INDEX and not any(block[0] == "times" for block in open_blocks):
                raise MiniCodeError("error", col, "'i' used outside a 'times' loop", width)
        elif word in inputs:
            op, arg = INPUT, inputs[word]
        elif _INTEGER.fullmatch(word):
            op, arg = PUSH, _literal(word, col)
        elif word in ("true", "false"):
            op, arg = PUSH, word == "true"
        elif word in ("if", "times"):
            if len(open_blocks) >= MAX_NESTING:
                raise MiniCodeError("error", col, f"nesting too deep (more than {MAX_NESTING} levels)", width)
            op = IF if word == "if" else TIMES
            open_blocks.append((word, len(ops), col, width))
        elif word == "else":
            if not open_blocks or open_blocks[-1][0] != "if":
                raise MiniCodeError("error", col, "'else' without a matching 'if'", width)
            _, if_index, if_col, if_width = open_blocks.pop()
            args[if_index] = len(ops) + 1  # a false condition jumps past this 'else'
            op = JUMP
            open_blocks.append(("else", len(ops), if_col, if_width))
        elif word == "then":
            if not open_blocks or open_blocks[-1][0] not in ("if", "else"):
                raise MiniCodeError("error", col, "'then' without a matching 'if'", width)
            args[open_blocks.pop()[1]] = len(ops)  # 'then' compiles to nothing
            continue
        elif word == "end":
            if not open_blocks or open_blocks[-1][0] != "times":
                raise MiniCodeError("error", col, "'end' without a matching 'times'", width)
            times_index = open_blocks.pop()[1]
            args[times_index] = len(ops) + 1  # a zero count skips past this 'end'
            op, arg = END, times_index + 1
        elif word.lstrip("+-")[:1].isdigit():
            raise MiniCodeError("error", col, f"invalid number literal {_quote(word)}", width)
        else:
            raise MiniCodeError("error", col, f"unknown word {_quote(word)}", width)
        ops.append(op)
        args.append(arg)
        cols.append(col)
        widths.append(width)
    if open_blocks:
        word, _, col, width = open_blocks[-1]
        opener, closer = ("if", "then") if word in ("if", "else") else ("times", "end")
        raise MiniCodeError(
            "error", col, f"unterminated '{opener}': expected '{closer}' before the end of the program", width
        )
    if not ops:
        raise MiniCodeError("error", 1, "empty program: expected at least one word")
    return Program(tuple(ops), tuple(args), tuple(cols), tuple(widths), len(source.rstrip()) + 1)


def _type_name(value: object) -> str:
    return "bool" if type(value) is bool else "int"


def _show(value: object) -> str:
    return ("true" if value else "false") if type(value) is bool else str(value)


def run(program: Program, inputs: tuple[int, ...], max_instructions: int = MAX_INSTRUCTIONS) -> list[int | bool]:
    """Execute ``program`` on ``inputs`` and return the final stack (bottom first).

    Raises ``MiniCodeError`` (kind ``runtime error`` or ``type error``) at the failing instruction.
    """
    ops, args = program.ops, program.args
    stack: list[int | bool] = []
    push, pop = stack.append, stack.pop
    loops: list[list[int]] = []  # [counter, count] per running 'times'
    pc, executed, n = 0, 0, len(ops)
    while pc < n:
        op = ops[pc]
        executed += 1
        if executed > max_instructions:
            raise _error(
                program, pc, "runtime error", f"instruction limit exceeded ({max_instructions} instructions executed)"
            )
        if len(stack) < ARITY[op]:
            need = ARITY[op]
            raise _error(
                program,
                pc,
                "runtime error",
                f"stack underflow: '{OP_NAMES[op]}' needs {need} value{'s' * (need > 1)}, the stack has {len(stack)}",
            )
        if op <= OVER:
            if len(stack) >= MAX_STACK:
                raise _error(program, pc, "runtime error", f"stack overflow (more than {MAX_STACK} values)")
            if op == PUSH:
                push(args[pc])
            elif op == INPUT:
                push(inputs[args[pc]])
            elif op == INDEX:
                push(loops[-1][0])
            else:
                push(stack[-1] if op == DUP else stack[-2])
        elif ADD <= op <= MOD:
            y = pop()
            x = pop()
            if type(x) is not int or type(y) is not int:
                raise _error(
                    program,
                    pc,
                    "type error",
                    f"'{OP_NAMES[op]}' expects int, int but got {_type_name(x)} {_show(x)}, {_type_name(y)} {_show(y)}",
                )
            if op <= MUL:
                result = x + y if op == ADD else x - y if op == SUB else x * y
                if result > INT_LIMIT or result < -INT_LIMIT:
                    raise _error(program, pc, "runtime error", f"integer overflow in '{OP_NAMES[op]}': {x} and {y}")
                push(result)
            elif op <= GE:
                push(x < y if op == LT else x <= y if op == LE else x > y if op == GT else x >= y)
            elif y == 0:
                raise _error(program, pc, "runtime error", f"division by zero in '{OP_NAMES[op]}': {x} / 0")
            else:
                push(x // y if op == DIV else x % y)  # ints are symmetric around 0, so this stays in range
        elif op == END:
            frame = loops[-1]
            frame[0] += 1
            if frame[0] < frame[1]:
                pc = args[pc]
                continue
            loops.pop()
        elif op == IF:
            condition = pop()
            if type(condition) is not bool:
                raise _error(program, pc, "type error", f"'if' expects a bool condition but got int {condition}")
            if not condition:
                pc = args[pc]
                continue
        elif op == JUMP:
            pc = args[pc]
            continue
        elif op == TIMES:
            count = pop()
            if type(count) is not int:
                raise _error(program, pc, "type error", f"'times' expects an int count but got bool {_show(count)}")
            if count < 0:
                raise _error(program, pc, "runtime error", f"'times' count must be >= 0, got {count}")
            if count == 0:
                pc = args[pc]
                continue
            loops.append([0, count])
        elif op == DROP:
            pop()
        elif op == SWAP:
            stack[-1], stack[-2] = stack[-2], stack[-1]
        elif op == ROT:
            push(stack.pop(-3))
        elif op == NEG:
            x = pop()
            if type(x) is not int:
                raise _error(program, pc, "type error", f"'neg' expects int but got bool {_show(x)}")
            push(-x)
        elif op == EQ or op == NE:
            y = pop()
            x = pop()
            if type(x) is not type(y):
                raise _error(
                    program,
                    pc,
                    "type error",
                    f"'{OP_NAMES[op]}' cannot compare {_type_name(x)} {_show(x)} with {_type_name(y)} {_show(y)}",
                )
            push((x == y) == (op == EQ))
        elif op == NOT:
            x = pop()
            if type(x) is not bool:
                raise _error(program, pc, "type error", f"'not' expects bool but got int {x}")
            push(not x)
        else:  # AND, OR
            y = pop()
            x = pop()
            if type(x) is not bool or type(y) is not bool:
                raise _error(
                    program,
                    pc,
                    "type error",
                    f"'{OP_NAMES[op]}' expects bool, bool but got {_type_name(x)} {_show(x)}, {_type_name(y)} {_show(y)}",
                )
            push((x and y) if op == AND else (x or y))
        pc += 1
    return stack


def _error(program: Program, pc: int, kind: str, message: str) -> MiniCodeError:
    return MiniCodeError(kind, program.cols[pc], message, program.widths[pc])
