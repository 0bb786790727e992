"""Read a run directory's metrics.jsonl, live or finished, as the run trained it.

A live run's last line may be half-written, and a run that crashed and resumed may hold a
cut line in the middle: lines that do not decode are skipped and counted. A resumed run
trains again the steps after its checkpoint, so its records repeat steps already logged;
the later records win, and the step where each resumed session began is kept as a restart
(found from the `start` record a session writes when it opens the file, or, in files
without those, from a step that does not follow the step before it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"


class RunDirError(ValueError):
    """A directory that holds no run (or no step of one yet); the message says why."""


@dataclass
class RunLog:
    """What a run directory recorded, with repeated steps after a resume resolved."""

    run_dir: Path
    name: str
    config: dict[str, Any]
    steps: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    restarts: list[int] = field(default_factory=list)  # first step of each resumed session
    unreadable: int = 0  # lines that did not decode (a torn line)


def _read_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    records, unreadable = [], 0
    decoder = msgspec.json.Decoder()
    with path.open("rb") as file:
        for line in file:
            if not line.strip():
                continue
            try:
                record = decoder.decode(line)
            except msgspec.DecodeError:
                unreadable += 1
                continue
            if isinstance(record, dict):
                records.append(record)
            else:
                unreadable += 1
    return records, unreadable


def _check_run_dir(run_dir: Path) -> tuple[Path, dict[str, Any]]:
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory: pass a run's run.run_dir")
    metrics, config_file = run_dir / METRICS_FILE, run_dir / CONFIG_FILE
    if not metrics.exists() and not config_file.exists():
        raise RunDirError(
            f"{run_dir} is not a ringtrain run directory (it has neither {METRICS_FILE} nor "
            f"{CONFIG_FILE}): pass the run.run_dir of a training run"
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    return metrics, config


def read_run(run_dir: Path | str) -> RunLog:
    """The run in `run_dir`; RunDirError if it is not a run or has no step record yet."""
    run_dir = Path(run_dir)
    metrics, config = _check_run_dir(run_dir)
    records, unreadable = _read_records(metrics) if metrics.exists() else ([], 0)
    steps: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    restarts: list[int] = []
    session_opened = False
    for record in records:
        event = record.get("event")
        if event == "start":
            session_opened = bool(steps)
        elif event == "step":
            step = int(record["step"])
            if steps and (session_opened or step <= steps[-1]["step"]):
                restarts.append(step)
                steps = [s for s in steps if s["step"] < step]
                evals = [e for e in evals if e["step"] < step]
            session_opened = False
            steps.append(record)
        elif event == "eval":
            evals.append(record)
    if not steps:
        raise RunDirError(
            f"{run_dir} has no step record yet ({metrics.name} "
            f"{'is empty' if metrics.exists() else 'does not exist'}): the run is starting, "
            "or it stopped before its first step"
        )
    name = config.get("run", {}).get("name") or run_dir.name
    return RunLog(run_dir, name, config, steps, evals, restarts, unreadable)
