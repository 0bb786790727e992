"""The configuration reference's generator on struct shapes the shipped config does not have
yet: optional tables written either way, a union of two tables (a plain key), renamed keys
and tables, tuples, tables and none as defaults, a description given in the type, comments
beside consecutive keys, a subclass's comment over its base's, a dash ending a comment line,
a `|` inside a table cell, and a top level without keys of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Optional

import msgspec
import pytest

from ringtrain import config_reference


class Left(msgspec.Struct, kw_only=True):
    """The left table."""

    # How far.
    depth: int = 1


class Right(msgspec.Struct, kw_only=True):
    """The right table."""

    # How wide.
    width: int = 2


class Shapes(msgspec.Struct, kw_only=True, rename={"long_name": "long-name", "old": "old-table"}):
    """Keys of every shape."""

    # Either side.
    side: Left | Right | None = None
    # An old-style optional table.
    old: Optional[Left] = None  # noqa: UP045 (written as older configs write it)
    # A key renamed in TOML.
    long_name: int = 3
    # A pair.
    pair: tuple[int, int] = (1, 2)
    # Weights by name.
    weights: dict[str, float] = msgspec.field(default_factory=lambda: {"a": 0.5, "b": True})
    # A comment the description overrides.
    described: Annotated[int, msgspec.Meta(description="From the type.")] = 0
    bounded: Annotated[int, msgspec.Meta(le=9, description="At most nine.")] = 4
    first: int = 5  # Beside the first.
    second: int = 6  # Beside the second.
    # Ends with a dash -
    # then goes on.
    dashed: str = "x"
    # Either a | b.
    piped: str = "a|b"


class Base(msgspec.Struct, kw_only=True):
    # The base's words.
    level: int = 1


class Derived(Base, kw_only=True):
    # The subclass's words.
    level: int = 2


class TablesOnly(msgspec.Struct, kw_only=True):
    derived: Derived = msgspec.field(default_factory=Derived)


def test_optional_tables_either_way_but_not_a_union_of_two() -> None:
    assert [name for name, _ in config_reference.sections(Shapes)] == ["", "old-table"]
    rows = {row[0]: row for row in config_reference.keys(Shapes)}
    assert rows["side"][1:3] == ("Left or Right or none", "(none)")
    assert "old" not in rows and "old-table" not in rows


def test_renamed_keys_and_defaults_as_toml_writes_them() -> None:
    rows = {row[0]: row for row in config_reference.keys(Shapes)}
    assert "long_name" not in rows and rows["long-name"][2] == "3"
    assert rows["pair"][2] == "[1, 2]"
    assert rows["weights"][1:3] == ("table of str to float", "{a = 0.5, b = true}")
    assert rows["bounded"][1] == "int <= 9"
    assert rows["described"][1] == "int"


def test_a_description_in_the_type_wins_over_the_comment() -> None:
    rows = {row[0]: row for row in config_reference.keys(Shapes)}
    assert rows["described"][3] == "From the type."
    assert rows["bounded"][3] == "At most nine."


def test_comments_beside_consecutive_keys_stay_with_their_key() -> None:
    rows = {row[0]: row for row in config_reference.keys(Shapes)}
    assert rows["first"][3] == "Beside the first."
    assert rows["second"][3] == "Beside the second."


def test_a_dash_ending_a_line_is_not_a_hyphen() -> None:
    rows = {row[0]: row for row in config_reference.keys(Shapes)}
    assert rows["dashed"][3] == "Ends with a dash - then goes on."


def test_a_subclass_comment_wins_over_its_base() -> None:
    assert config_reference.keys(Derived) == [("level", "int", "2", "The subclass's words.")]


def test_reference_escapes_pipes_and_names_no_empty_top_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    walk = config_reference.sections

    def rooted_at(root: type) -> Callable[..., Iterator[tuple[str, type]]]:
        return lambda struct=root, prefix="": walk(struct, prefix)

    monkeypatch.setattr(config_reference, "sections", rooted_at(TablesOnly))
    text = config_reference.reference()
    assert "## Top level" not in text and "## [derived]" in text
    assert "| `level` | int | `2` | The subclass's words. |" in text
    monkeypatch.setattr(config_reference, "sections", rooted_at(Shapes))
    text = config_reference.reference()
    assert text.count("## Top level\n") == 1 and "Keys of every shape." in text
    assert '| `piped` | str | `"a\\|b"` | Either a \\| b. |' in text
