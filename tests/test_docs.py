"""The documentation stays true: docs/configuration.md lists every config key with its
current default (it is generated from the config structs, so a stale file fails here), the
README stays short, and every relative link in the README and docs/ reaches a file (and a
heading, where the link names one)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import pytest

from ringtrain import config_reference
from ringtrain.config import Config

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "configuration.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ROW = re.compile(r"^\| `(?P<key>[^`]+)` \| .*? \| `(?P<default>[^`]*)` \| (?P<text>.*) \|$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def documented() -> dict[str, tuple[str, str]]:
    """`section.key` -> (default as written, description), read from docs/configuration.md."""
    rows: dict[str, tuple[str, str]] = {}
    section = ""
    for line in REFERENCE.read_text(encoding="utf-8").splitlines():
        if heading := re.match(r"^## \[(.+)\]$", line):
            section = heading.group(1)
        elif row := ROW.match(line):
            rows[f"{section}.{row['key']}"] = (row["default"], row["text"])
    return rows


def defaults(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`section.key` -> default for every leaf of a config's builtins tree."""
    leaves: dict[str, Any] = {}
    for name, value in tree.items():
        if isinstance(value, dict):
            leaves.update(defaults(value, f"{prefix}{name}."))
        else:
            leaves[f"{prefix}{name}"] = value
    return leaves


def test_every_config_key_is_documented_with_its_default() -> None:
    """Read independently of the generator: every key of a default Config has a row in
    its section, whose default (parsed as TOML) is the struct's. (Keys that no longer
    exist fail the next test, which compares the whole file.)"""
    rows = documented()
    expected = defaults(msgspec.to_builtins(Config()))
    fix = f"regenerate: {config_reference.REGENERATE}"
    missing = sorted(set(expected) - set(rows))
    assert not missing, f"keys missing from docs/configuration.md: {missing} ({fix})"
    differ = {
        key: (rows[key][0], value)
        for key, value in expected.items()
        if written_value(rows[key][0]) != value
    }
    assert not differ, f"documented defaults differ (written, actual): {differ} ({fix})"


def written_value(default: str) -> Any:
    """A documented default as a value: TOML, or None where it reads "(none)"."""
    return None if default == "(none)" else tomllib.loads(f"v = {default}")["v"]


def test_reference_file_is_what_the_generator_writes() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == config_reference.reference(), (
        f"docs/configuration.md is stale: {config_reference.REGENERATE}"
    )


def test_every_config_key_has_a_description() -> None:
    bare = [key for key, (_, text) in documented().items() if not text.strip()]
    assert not bare, f"config keys without a comment in their struct: {bare}"


class Inner(msgspec.Struct, kw_only=True):
    """An inner table."""

    # Hyphen-
    # ated over lines.
    ratio: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.5
    words: list[str] = msgspec.field(default_factory=lambda: ["a"])  # Beside the field.


class Outer(msgspec.Struct, kw_only=True):
    """An outer table."""

    # Which one.
    mode: Literal["x", "y"] = "x"
    inner: Inner = msgspec.field(default_factory=Inner)
    maybe_inner: Inner | None = None


class Holder(msgspec.Struct, kw_only=True):
    # A top-level key.
    flag: bool = False
    outer: Outer = msgspec.field(default_factory=Outer)


def test_generator_walks_nested_tables_and_reads_comments() -> None:
    """Any struct shape: nested tables by dotted name, optional ones too, the top level
    when it holds keys, and each key's type, TOML default and comment."""
    tables = {name: struct for name, struct in config_reference.sections(Holder)}
    assert list(tables) == ["", "outer", "outer.inner", "outer.maybe_inner"]
    assert config_reference.keys(Holder) == [("flag", "bool", "false", "A top-level key.")]
    assert config_reference.keys(tables["outer"]) == [
        ("mode", 'one of "x", "y"', '"x"', "Which one.")
    ]
    assert config_reference.keys(tables["outer.inner"]) == [
        ("ratio", "float >= 0.0, < 1.0", "0.5", "Hyphen-ated over lines."),
        ("words", "list of str", '["a"]', "Beside the field."),
    ]


def test_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail into docs/"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def leads_nowhere(page: Path, target: str) -> bool:
    """A relative link whose file does not exist, or whose #anchor is no heading there."""
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    if not resolved.exists():
        return True
    return bool(anchor) and resolved.suffix == ".md" and anchor not in anchors(resolved)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_resolve(page: Path) -> None:
    links = LINK.findall(page.read_text(encoding="utf-8"))
    broken = [t for t in links if not re.match(r"^[a-z]+:", t) and leads_nowhere(page, t)]
    assert not broken, f"{page.relative_to(ROOT)}: links that lead nowhere: {broken}"
