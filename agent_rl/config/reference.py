"""The configuration reference, generated from the schema: each key's meaning is written once, as its
field's docstring, and docs/training.md shows it between two markers.

    python -m agent_rl.config.reference                          # print the reference (Markdown)
    python -m agent_rl.config.reference --write docs/training.md # rewrite it between the markers

``tests/test_docs.py`` fails when the page and the schema disagree.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import typing
from pathlib import Path
from typing import Any

from agent_rl.config.schema import Config

BEGIN = "<!-- config reference: generated from agent_rl/config/schema.py by python -m agent_rl.config.reference -->"
END = "<!-- end of the config reference -->"


def field_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls``, on one line, with Markdown's backticks."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    return {
        field.target.id: " ".join(doc.value.value.split()).replace("``", "`")
        for field, doc in zip(body, body[1:])
        if isinstance(field, ast.AnnAssign)
        and isinstance(doc, ast.Expr)
        and isinstance(doc.value, ast.Constant)
        and isinstance(doc.value.value, str)
    }


def flow(value: Any) -> str:
    """A default as YAML flow text, the way an override spells it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(flow, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {flow(item)}" for key, item in value.items()) + "}"
    return str(value)


def markdown() -> str:
    """One table per section: every key, its default and its docstring."""
    defaults = Config()
    blocks = []
    for section, cls in typing.get_type_hints(Config).items():
        docs = field_docstrings(cls)
        lines = [f"### `{section}`: {inspect.getdoc(cls).replace('``', '`')}", ""]
        if getattr(cls, "_shorthand", None):
            lines += [f"`{section}=VALUE` is short for `{section}.{cls._shorthand}=VALUE`.", ""]
        lines += ["| key | default | meaning |", "|---|---|---|"]
        values = getattr(defaults, section)
        for field in dataclasses.fields(cls):
            if field.name not in docs:
                raise ValueError(f"config key {section}.{field.name} has no docstring in agent_rl/config/schema.py")
            lines.append(f"| `{section}.{field.name}` | `{flow(getattr(values, field.name))}` | {docs[field.name]} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def between_markers(text: str) -> tuple[int, int]:
    """Where the generated reference starts and ends in ``text``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"the page needs one {BEGIN!r} line and, after it, one {END!r} line")
    return text.index(BEGIN) + len(BEGIN) + 1, text.index(END)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, metavar="PAGE", help="rewrite the reference between the markers of PAGE")
    args = parser.parse_args(argv)
    if args.write is None:
        print(markdown(), end="")
        return
    text = args.write.read_text()
    start, end = between_markers(text)
    args.write.write_text(text[:start] + "\n" + markdown() + "\n" + text[end:])


if __name__ == "__main__":
    main()
