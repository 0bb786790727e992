"""A rank's first log line: how long it took to start, and the bytecode advice (CPU)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringtrain.trainer.startup import SLOW_START_S, bytecode_advice, process_age_s, started_in


def test_process_age_counts_from_the_process_start() -> None:
    before = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", "from ringtrain.trainer.startup import process_age_s as a; "
         "print(a())"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    elapsed = time.monotonic() - before
    # Clock ticks (1/100 s) bound the precision of the process start.
    assert 0 <= float(out) <= elapsed + 0.02
    assert process_age_s() > float(out)  # this process started before that one
    assert started_in(12.34) == "; started in 12.3 s (its imports)"
    assert started_in(None) == ""


def _fresh_module(folder: Path, name: str):
    """Import a module written now into `folder` (its source, nothing compiled yet)."""
    (folder / f"{name}.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(folder))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)


def test_bytecode_advice_only_for_a_slow_start_that_recompiles_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    recompiled = _fresh_module(tmp_path, "ringtrain_startup_probe_a")
    advice = bytecode_advice(SLOW_START_S + 1, recompiled)
    assert advice is not None and "PYTHONDONTWRITEBYTECODE" in advice
    assert "PYTHONPYCACHEPREFIX" in advice
    assert bytecode_advice(SLOW_START_S - 1, recompiled) is None  # a quick start
    assert bytecode_advice(None, recompiled) is None  # age unknown
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    kept = _fresh_module(tmp_path, "ringtrain_startup_probe_b")
    assert Path(kept.__cached__).exists()
    assert bytecode_advice(SLOW_START_S + 1, kept) is None  # Python keeps bytecode
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert bytecode_advice(SLOW_START_S + 1, kept) is None  # installed with bytecode
