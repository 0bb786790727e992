"""What a mutant is: one line of a module changed, and a group of them with the tests that
must notice them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """One line of `module` changed from `old` to `new` (the text must occur exactly once)."""

    label: str
    old: str
    new: str


@dataclass(frozen=True)
class Group:
    """The mutants of one module and the tests that cover it."""

    name: str
    module: str
    tests: tuple[str, ...]
    mutants: tuple[Mutant, ...]
