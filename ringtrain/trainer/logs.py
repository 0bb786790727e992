"""Per-rank log files, the terminal progress stream, and the metrics JSONL file.

Every rank writes `<run_dir>/logs/rank<R>-<role>.log` (line-buffered, timestamped). The
terminal gets warnings and errors from every rank, and progress from the lead drafter
(the rank that knows the loss). Metrics go to `<run_dir>/metrics.jsonl`, one object per
logged step, written by the lead drafter, each line in one write.

A session opening metrics.jsonl makes it the record of the run as it now stands: a torn
last line (a crash mid-write) is cut, and the records of steps after the step the session
starts from (a resume trains them again; a fresh start trains all) are dropped, and so are
the held-out rounds due after the last round its checkpoint records (a resume runs them
again), the file as it was kept beside it as `metrics.jsonl.pre-resume`. So every step
and round appears once, as ringtrain-plot's reader (which keeps the later copy of a step)
would also read it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from ringtrain.monitor.sinks import Sink

LOGGER_NAME = "ringtrain"
# A rank log line begins with this local time, then ".<milliseconds>".
LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"

# transformers' notice, on each rank that runs a hybrid target, that Gated DeltaNet and
# causal conv1d fall back to torch because flash-linear-attention or causal_conv1d is not
# installed: on CPU there is nothing to install (both packages need CUDA), with
# target.linear_attention = "torch" the torch kernels are the configuration's choice (the
# embedded default's, on a GPU too), and the target's load line says which kernels run.
KERNEL_FALLBACK_LOGGER = "transformers.integrations.hub_kernels"
KERNEL_FALLBACK_NOTICE = "is falling back to its reference PyTorch implementation"


class _WithoutNotice(logging.Filter):
    """Drops the log records whose message contains `notice`."""

    def __init__(self, notice: str) -> None:
        super().__init__()
        self.notice = notice

    def filter(self, record: logging.LogRecord) -> bool:
        return self.notice not in record.getMessage()


_KERNEL_FALLBACKS = _WithoutNotice(KERNEL_FALLBACK_NOTICE)

# `extra=` of a record for the rank's log file only: something every rank says alike, or
# that ringtrain-launch reports once for all of them.
FILE_ONLY = {"file_only": True}


class _NotFileOnly(logging.Filter):
    """Drops the records logged with FILE_ONLY."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "file_only", False)


def silence_kernel_fallbacks() -> None:
    """Keep transformers' kernel fallback notices off the console (idempotent): for a CPU
    rank, or one whose configuration chose the torch kernels."""
    logging.getLogger(KERNEL_FALLBACK_LOGGER).addFilter(_KERNEL_FALLBACKS)


def rank_log_path(run_dir: Path, rank: int, role: str) -> Path:
    """The log file of global rank `rank` (of role `role`) in the run directory."""
    return run_dir / "logs" / f"rank{rank}-{role}.log"


def setup_logging(run_dir: Path, rank: int, role: str, terminal_progress: bool) -> Path:
    """Configure the `ringtrain` logger for this rank; returns the log file's path."""
    path = rank_log_path(run_dir, rank, role)
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers.clear()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    file_handler = logging.StreamHandler(path.open("a", buffering=1, encoding="utf-8"))
    file_handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s.%(msecs)03d rank{rank} {role} %(levelname)s %(message)s",
            LOG_TIME_FORMAT,
        )
    )
    logger.addHandler(file_handler)
    terminal = logging.StreamHandler(sys.stdout)
    terminal.setLevel(logging.INFO if terminal_progress else logging.WARNING)
    terminal.setFormatter(logging.Formatter(f"[rank{rank} {role}] %(message)s"))
    terminal.addFilter(_NotFileOnly())
    logger.addHandler(terminal)
    return path


def get_logger() -> logging.Logger:
    """The project's logger (configured by setup_logging in each rank)."""
    return logging.getLogger(LOGGER_NAME)


class MetricsWriter:
    """Appends one JSON object per line to `<run_dir>/metrics.jsonl` and hands each to the
    `sinks` too (`run.report_to`, see ringtrain.monitor.sinks). Opening supersedes the
    records of steps after `resumed_step` and of rounds after `evaluated_step` (see the
    module docstring) and writes a `start` record, so a reader sees where each session (a
    resume) began."""

    def __init__(
        self,
        path: Path,
        sinks: Sequence[Sink] = (),
        resumed_step: int = 0,
        evaluated_step: int = 0,
    ) -> None:
        self.notes = supersede_records(path, resumed_step, evaluated_step)
        self._file = path.open("ab", buffering=0)
        self._encoder = msgspec.json.Encoder()
        self._sinks = list(sinks)
        self.write({"event": "start", "wall": time.time(), "resumed_step": resumed_step})

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` as one line, in one write (unbuffered, so it is on disk whole)."""
        line = memoryview(self._encoder.encode(record) + b"\n")
        while line:  # a regular file takes it in one write unless the disk is full
            line = line[self._file.write(line) :]
        for sink in self._sinks:
            sink.write(record)

    def close(self) -> None:
        self._file.close()
        for sink in self._sinks:
            sink.close()


def _superseded(line: bytes, resumed_step: int, evaluated_step: int) -> bool:
    """Whether a line of metrics.jsonl is a torn line, a step record after `resumed_step`
    or an eval record of a round due after `evaluated_step`."""
    try:
        record = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return True
    if not isinstance(record, dict):
        return False
    last_kept = {"step": resumed_step, "eval": evaluated_step}.get(record.get("event"))
    return last_kept is not None and int(record.get("step", 0)) > last_kept


def supersede_records(path: Path, resumed_step: int, evaluated_step: int) -> list[str]:
    """Cut a torn last line of `path` and drop the step records after `resumed_step` and
    the eval records after `evaluated_step` (keeping the file as it was in
    `<path>.pre-resume`); returns what was done, for the log."""
    if not path.exists():
        return []
    content = path.read_bytes()
    whole = content[: content.rfind(b"\n") + 1]
    kept = [
        line
        for line in whole.splitlines(keepends=True)
        if not _superseded(line, resumed_step, evaluated_step)
    ]
    dropped = len(whole.splitlines()) - len(kept)
    notes = [f"{path.name}: cut a torn last line"] if len(whole) < len(content) else []
    if dropped:
        shutil.copyfile(path, path.with_name(path.name + ".pre-resume"))
        notes.append(
            f"{path.name}: {dropped} records of steps after step {resumed_step} or rounds "
            f"after step {evaluated_step} (or torn) superseded; the file before is kept as "
            f"{path.name}.pre-resume"
        )
    if notes:
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_bytes(b"".join(kept))
        temporary.replace(path)
    return notes


def last_evaluation(path: Path) -> dict[str, Any] | None:
    """The last held-out evaluation record of metrics.jsonl (a resumed session's progress
    lines carry its tau_sim until the session's own first round), or None."""
    if not path.exists():
        return None
    for line in reversed(path.read_bytes().splitlines()):
        if b'"eval"' not in line:
            continue
        with contextlib.suppress(msgspec.DecodeError):
            record = msgspec.json.decode(line)
            if isinstance(record, dict) and record.get("event") == "eval":
                return record
    return None
