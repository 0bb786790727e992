"""How each rank ended, for ringtrain-launch (ringtrain/launch.py) to report once.

Under ringtrain-launch every rank finds a directory named in RINGTRAIN_OUTCOME_DIR and
writes one small file there as it ends: its exit code, what kind of end it was and the
message that goes with it. The launcher reads them after torch's launcher has stopped
every worker and prints one line: the stop (with the step and checkpoint to resume
from), or the first refusal or failure, once for the whole node. A rank started by
plain torchrun (no such directory) prints its own messages instead (`launched()` says
which).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Protocol

import msgspec

from ringtrain.trainer.logs import rank_log_path

OUTCOME_DIR_ENV = "RINGTRAIN_OUTCOME_DIR"

DONE = "done"  # trained to run.max_steps
STOPPED = "stopped"  # SIGTERM/SIGINT: stopped at a safe point (after start-up: checkpointed)
REFUSED = "refused"  # bad input, found before training: alike on every rank
FAILED = "failed"  # an error of its own while running
PEER_FAILED = "peer failed"  # stopped because another rank died or failed


class PeerFailure(Protocol):
    """What a ring's PeerDied tells (ringtrain.ring is not imported here: rank_entry reads
    this module before the heavy imports)."""

    rank: int
    label: str
    primary: bool


class Outcome(msgspec.Struct, frozen=True):
    """One rank's end. `step` and `checkpoint` are the lead drafter's (the step reached
    and the newest checkpoint); `log` is the rank's log file when it had one. A rank that
    stopped for another's failure (PEER_FAILED) names that rank, `culprit` (itself when
    its own watchdog found it hung), and the culprit's log file; `primary` when it saw the
    culprit die or hang itself (not only the error or abort the culprit left)."""

    rank: int
    code: int
    kind: str
    message: str = ""
    signal: str = ""
    step: int | None = None
    checkpoint: str | None = None
    log: str | None = None
    wall: float = 0.0
    culprit: int | None = None
    culprit_log: str | None = None
    primary: bool = False


def launched() -> bool:
    """Whether ringtrain-launch started this rank (and reports its outcome)."""
    return bool(os.environ.get(OUTCOME_DIR_ENV))


class _Report:
    """Whether this process has reported: its first outcome is its end (each report is
    followed by the process's exit), so a second one, from another thread that saw the
    same failure at the same moment (the watchdog and the main thread), is dropped rather
    than written over the first. Re-entrant: a signal handler may report in the middle of
    the main thread's report (it then exits before that one resumes)."""

    lock = threading.RLock()
    done = False


def report_outcome(outcome: Outcome) -> None:
    """Write this rank's outcome for ringtrain-launch (nothing under plain torchrun), once
    per process (_Report). The file appears whole (written aside, then renamed), so the
    launcher never reads half."""
    directory = os.environ.get(OUTCOME_DIR_ENV)
    with _Report.lock:
        if _Report.done:
            return
        if directory:
            stamped = msgspec.structs.replace(outcome, wall=outcome.wall or time.time())
            path = Path(directory) / f"rank{outcome.rank}.json"
            aside = path.with_name(f".{path.name}.{os.getpid()}")
            aside.write_bytes(msgspec.json.encode(stamped))
            aside.replace(path)
        _Report.done = True


def outcome_reported() -> bool:
    """Whether this process has said how it ends (report_outcome; also under plain
    torchrun, where nothing is written): it is on its way out."""
    return _Report.done


def peer_failure(rank: int, died: PeerFailure, run_dir: Path, log: Path | None) -> Outcome:
    """The outcome of rank `rank`, stopped because another rank died, failed or hung
    (`died`, a ring PeerDied), pointing at that rank's log."""
    return Outcome(
        rank,
        1,
        PEER_FAILED,
        str(died),
        log=None if log is None else str(log),
        culprit=died.rank,
        culprit_log=str(rank_log_path(run_dir, died.rank, died.label)),
        primary=died.primary,
    )


def env_rank() -> int:
    """This process's global rank as torch's launcher set it."""
    return int(os.environ.get("RANK", "0"))


def read_outcomes(directory: Path) -> list[Outcome]:
    """The outcomes the ranks wrote into `directory`, by rank."""
    decoder = msgspec.json.Decoder(Outcome)
    found = [decoder.decode(path.read_bytes()) for path in directory.glob("rank*.json")]
    return sorted(found, key=lambda outcome: outcome.rank)
