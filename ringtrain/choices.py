"""Choice tables: what each name of a config choice stands for, kept in step with the config.

Every seam picked by name from the config (drafter architectures, objectives, optimisers,
schedules, ring transports) is one table of this shape: a dict from the name to what it
names, made by `choice_table`, which checks the names against the choice's `Literal` in
its config section. A name in one but not the other fails at import, naming both lists.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import TypeVar

Entry = TypeVar("Entry")


def config_choices(section: type, key: str) -> tuple[str, ...]:
    """The values the `Literal` field `key` of config section `section` allows."""
    return typing.get_args(typing.get_type_hints(section)[key])


def choice_table(
    section: type, key: str, entries: Mapping[str, Entry], beside: tuple[str, ...] = ()
) -> dict[str, Entry]:
    """`entries` as the table of the config choice `section.key`.

    `beside`: choices the config allows that name no entry (a transport's "auto").
    Raises ImportError when the config's choices and the table's names differ."""
    choices = config_choices(section, key)
    if set(choices) != {*entries, *beside}:
        raise ImportError(
            f"{section.__name__}.{key} allows {list(choices)} ({section.__module__}) but its "
            f"table names {[*entries, *beside]}: list each choice in both"
        )
    return dict(entries)
