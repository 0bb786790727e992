"""A perf_counter the test sets, for modules that time windows with time.perf_counter."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest


class Clock:
    """A perf_counter that reads what the test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def set_clock(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> Clock:
    """Give `module` a `time` whose perf_counter reads the returned Clock."""
    clock = Clock()
    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    return clock
