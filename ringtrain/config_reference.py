"""The configuration reference, docs/configuration.md, generated from the config structs.

`python -m ringtrain.config_reference > docs/configuration.md` writes it. Every section of
`ringtrain.config.Config` and every struct nested in one (a sub-table such as
`[drafter.NAME]`) is walked through `msgspec.structs.fields`, so a key added, removed or
given another default shows up here without this module knowing it. A section's text is
its struct's docstring; a key's description is its `msgspec.Meta(description=...)`, else
the comment lines written right above it (or beside it) in its struct's source.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

import msgspec

from ringtrain.config import Config

REGENERATE = "python -m ringtrain.config_reference > docs/configuration.md"

INTRO = f"""\
# Configuration reference

<!-- Generated from the config structs by
`{REGENERATE}`:
edit the structs' comments, not this file. -->

A run reads one TOML file (`--config FILE`; without one, the embedded default,
`ringtrain/tiny.toml`, which sets a few of the keys below to tiny sizes). Every key is
optional: a key left out takes the default listed here. Unknown keys, values of the wrong
type, numbers out of their bounds and floats that are not finite are errors that name
the key and the file, before any GPU work. Any key can be overridden on the command line,
`--set section.key=value` (repeatable; the value in TOML syntax). Example configs:
`configs/`.
"""

BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def _struct_of(hint: Any) -> type[msgspec.Struct] | None:
    """The Struct a field's type names (alone or as `Struct | None`), else None."""
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        structs = [arg for arg in typing.get_args(hint) if _struct_of(arg)]
        return structs[0] if len(structs) == 1 else None
    return None


def describe_type(hint: Any) -> str:
    """A field's type in words: `int >= 1`, `one of "a", "b"`, `list of str`, ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        bounds = [
            f"{sign} {getattr(meta, name)}"
            for meta in args[1:]
            if isinstance(meta, msgspec.Meta)
            for name, sign in BOUNDS
            if getattr(meta, name) is not None
        ]
        return " ".join([describe_type(args[0]), ", ".join(bounds)]).strip()
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(arg) for arg in args)
    if origin is list:
        return f"list of {describe_type(args[0])}"
    if origin is dict:
        return f"table of {describe_type(args[0])} to {describe_type(args[1])}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join("none" if arg is type(None) else describe_type(arg) for arg in args)
    return getattr(hint, "__name__", str(hint))


def render_default(value: Any) -> str:
    """A default value as it is written in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(render_default(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {render_default(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "(none)"
    return repr(value)


def _default(field: msgspec.structs.FieldInfo) -> Any:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return msgspec.NODEFAULT


def _comments_by_line(source: str) -> tuple[dict[int, str], set[int]]:
    """Each line's comment text, and the lines that hold nothing but a comment."""
    comments: dict[int, str] = {}
    alone: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            line = token.start[0]
            comments[line] = token.string.lstrip("#").strip()
            if not token.line[: token.start[1]].strip():
                alone.add(line)
    return comments, alone


def field_comments(struct: type) -> dict[str, str]:
    """Each field's comment in the source of `struct` and of the Structs it derives from:
    the comment lines right above the field, then a comment beside it, as one line."""
    found: dict[str, str] = {}
    for cls in reversed(struct.__mro__):
        if not issubclass(cls, msgspec.Struct) or cls is msgspec.Struct:
            continue
        source = textwrap.dedent(inspect.getsource(cls))
        comments, alone = _comments_by_line(source)
        for node in ast.parse(source).body[0].body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            above, line = [], node.lineno - 1
            while line in alone:
                above.insert(0, comments[line])
                line -= 1
            beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
            found[node.target.id] = _join_lines(above + beside)
    return found


def _join_lines(lines: list[str]) -> str:
    """Comment lines as one line; a word hyphenated across a line break stays whole."""
    text = ""
    for line in lines:
        text += line if text.endswith("-") and not text.endswith(" -") else f" {line}"
    return text.strip()


def _meta_description(hint: Any) -> str | None:
    if typing.get_origin(hint) is not typing.Annotated:
        return None
    texts = [m.description for m in typing.get_args(hint)[1:] if isinstance(m, msgspec.Meta)]
    return next((text for text in texts if text), None)


def sections(struct: type = Config, prefix: str = "") -> Iterator[tuple[str, type]]:
    """(TOML table name, struct) for every table below `struct`, depth first; the top level
    (named "") first when it holds keys of its own."""
    if not prefix and keys(struct):
        yield "", struct
    for field in msgspec.structs.fields(struct):
        nested = _struct_of(field.type)
        if nested is not None:
            name = f"{prefix}{field.encode_name}"
            yield name, nested
            yield from sections(nested, f"{name}.")


def keys(struct: type) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for each plain key of one table."""
    comments = field_comments(struct)
    rows = []
    for field in msgspec.structs.fields(struct):
        if _struct_of(field.type) is not None:
            continue
        default = _default(field)
        shown = "(required)" if default is msgspec.NODEFAULT else render_default(default)
        text = _meta_description(field.type) or comments.get(field.name, "")
        rows.append((field.encode_name, describe_type(field.type), shown, text))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference() -> str:
    """The whole of docs/configuration.md."""
    parts = [INTRO]
    for name, struct in sections():
        parts.append(f"## [{name}]\n" if name else "## Top level\n")
        if struct.__doc__:
            parts.append(" ".join(inspect.cleandoc(struct.__doc__).split()) + "\n")
        rows = keys(struct)
        if rows:
            table = ["| key | type | default | description |", "|---|---|---|---|"]
            table += [
                f"| `{key}` | {_cell(kind)} | `{_cell(default)}` | {_cell(text)} |"
                for key, kind, default, text in rows
            ]
            parts.append("\n".join(table) + "\n")
    return "\n".join(parts)


def main() -> None:
    """Print the reference (`python -m ringtrain.config_reference > docs/configuration.md`)."""
    print(reference(), end="")


if __name__ == "__main__":
    main()
