"""Read a run directory's metrics.jsonl, live or finished, as the run trained it.

A live run's last line may be half-written, and a run that crashed and resumed may hold a
cut line in the middle: lines that do not decode are skipped and counted. A resumed run
trains again the steps after its checkpoint, so its records repeat steps already logged;
the later records win, and the step where each resumed session began is kept as a restart
(found from the `start` record a session writes when it opens the file, or, in files
without those, from a step that does not follow the step before it). Step and evaluation
records without the fields the figures read (or with fields of the wrong type) are
skipped and named by line, with what is wrong.
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


class _StepFields(msgspec.Struct):
    """What the figures read of a step record (a skipped step's loss is null)."""

    step: int
    loss: float | None
    tokens: float
    seconds: float
    accuracy: list[float | None]


class _EvalFields(msgspec.Struct):
    """What the figures read of an evaluation record."""

    step: int
    loss: float | None
    tau_sim: float
    accuracy_per_slot: list[float | None]


_FIELDS = {"step": _StepFields, "eval": _EvalFields}


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
    malformed: list[str] = field(default_factory=list)  # 'line N: what is wrong', skipped


def _malformed(record: dict[str, Any]) -> str | None:
    """What is wrong with a step or evaluation record, or None if the figures can read it."""
    event = record.get("event")
    fields = _FIELDS.get(event) if isinstance(event, str) else None
    if fields is None:
        return None
    try:
        msgspec.convert(record, fields)
    except msgspec.ValidationError as exc:
        return f"{event} record: {exc}"
    if event == "step" and not ({"tau_uniform", "tau"} & record.keys()):
        return "step record: Object missing required field `tau_uniform`"
    return None


def _read_records(path: Path) -> tuple[list[dict[str, Any]], int, list[str]]:
    """The usable records of `path`, the number of lines that did not decode, and what is
    wrong with the decoded step and evaluation records that cannot be used."""
    records, unreadable, malformed = [], 0, []
    decoder = msgspec.json.Decoder()
    with path.open("rb") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                record = decoder.decode(line)
            except msgspec.DecodeError:
                unreadable += 1
                continue
            if not isinstance(record, dict):
                unreadable += 1
            elif (problem := _malformed(record)) is not None:
                malformed.append(f"line {number}: {problem}")
            else:
                records.append(record)
    return records, unreadable, malformed


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
    records, unreadable, malformed = _read_records(metrics) if metrics.exists() else ([], 0, [])
    steps: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    restarts: list[int] = []
    session_opened = False
    for record in records:
        event = record.get("event")
        if event == "start":
            session_opened = bool(steps)
        elif event == "step":
            step = record["step"]
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
            f"{run_dir} has no step record yet ({_contents(metrics, unreadable, malformed)})"
            ": the run is starting, or it stopped before its first step"
        )
    name = config.get("run", {}).get("name") or run_dir.name
    return RunLog(run_dir, name, config, steps, evals, restarts, unreadable, malformed)


def _contents(metrics: Path, unreadable: int, malformed: list[str]) -> str:
    """What a metrics file without a usable step record holds instead."""
    if not metrics.exists():
        return f"{metrics.name} does not exist"
    if not unreadable and not malformed:
        return f"{metrics.name} is empty"
    parts = [f"{unreadable} line(s) that are not JSON records"] if unreadable else []
    parts += [f"{metrics.name} {problem}" for problem in malformed[:3]]
    return f"{metrics.name} holds " + "; ".join(parts)
