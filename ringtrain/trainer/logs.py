"""Per-rank log files, the terminal progress stream, and the metrics JSONL file.

Every rank writes `<run_dir>/logs/rank<R>-<role>.log` (line-buffered, timestamped). The
terminal gets warnings and errors from every rank, and progress from the lead drafter
(the rank that knows the loss). Metrics go to `<run_dir>/metrics.jsonl`, one object per
logged step, written by the lead drafter.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import msgspec

if TYPE_CHECKING:
    from ringtrain.monitor.sinks import Sink

LOGGER_NAME = "ringtrain"


def setup_logging(run_dir: Path, rank: int, role: str, terminal_progress: bool) -> Path:
    """Configure the `ringtrain` logger for this rank; returns the log file's path."""
    log_dir = run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"rank{rank}-{role}.log"
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers.clear()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    file_handler = logging.StreamHandler(path.open("a", buffering=1, encoding="utf-8"))
    file_handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s.%(msecs)03d rank{rank} {role} %(levelname)s %(message)s",
            "%Y-%m-%d %H:%M:%S",
        )
    )
    logger.addHandler(file_handler)
    terminal = logging.StreamHandler(sys.stdout)
    terminal.setLevel(logging.INFO if terminal_progress else logging.WARNING)
    terminal.setFormatter(logging.Formatter(f"[rank{rank} {role}] %(message)s"))
    logger.addHandler(terminal)
    return path


def get_logger() -> logging.Logger:
    """The project's logger (configured by setup_logging in each rank)."""
    return logging.getLogger(LOGGER_NAME)


class MetricsWriter:
    """Appends one JSON object per line to `<run_dir>/metrics.jsonl` and hands each to the
    `sinks` too (`run.report_to`, see ringtrain.monitor.sinks). Opening writes a `start`
    record, so a reader sees where each session (a resume) began."""

    def __init__(self, path: Path, sinks: Sequence[Sink] = ()) -> None:
        self._file: TextIO = path.open("a", buffering=1, encoding="utf-8")
        self._encoder = msgspec.json.Encoder()
        self._sinks = list(sinks)
        self.write({"event": "start", "wall": time.time()})

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(self._encoder.encode(record).decode() + "\n")
        for sink in self._sinks:
            sink.write(record)

    def close(self) -> None:
        self._file.close()
        for sink in self._sinks:
            sink.close()
