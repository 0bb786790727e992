"""Liveness by progress: what each rank's main thread is doing, and when it is hung.

A heartbeat thread proves only that a process exists; a main thread stuck in a loop, a
deadlock or a stopped process must be caught too. So each rank's main thread (never
another thread) refreshes `progress_ns` in its rank-table row whenever it finishes a
unit of work (`Ring.record_progress`), announces a phase (`Ring.set_phase`), or wakes
inside a ring wait (a rank waiting on the ring waits on its peers, it is not stuck).

A rank whose progress is older than its phase's allowance is hung. Announced phases
(start-up work: loading, compiling, the first step; checkpoints) may legitimately take
minutes and get `startup_timeout_s`; steady work gets `progress_timeout_s`. The ring
gives phases no names: a rank announces what it is doing in its own words (`doing`),
and names its steady work once (Ring.describe_work); the ring stores and shows them.
"""

from __future__ import annotations

import numpy as np

from ringtrain.ring import control as cb
from ringtrain.ring.liveness import process_state
from ringtrain.ring.spec import RingSpec

# A live rank silent for longer than this (or half its allowance, if less) shows up in
# the run's progress line.
SILENT_AFTER_S = 5.0


# The rank-table `phase`: attached and silent so far, in a phase it announced (start-up
# work, a checkpoint: the start-up allowance), or in steady work (record_progress).
STARTING, ANNOUNCED, WORKING = 0, 1, 2
STARTING_DOING = "starting up"


def doing(row: np.ndarray | np.void) -> str:
    """What the rank of `row` announced it is doing, in the words it gave."""
    return cb.get_bytes(row["doing"], row["doing_len"]).decode("utf-8", "replace")


def allowance(phase: int, spec: RingSpec) -> tuple[float, str]:
    """(seconds without progress a rank in `phase` is allowed, the config key that sets it)."""
    if phase == WORKING:
        return spec.progress_timeout_s, "ring.progress_timeout_s"
    return spec.startup_timeout_s, "ring.startup_timeout_s"


def progress_age_s(row: np.ndarray | np.void, now_ns: int) -> float:
    """Seconds since the rank of `row` last made progress."""
    return (now_ns - int(row["progress_ns"])) / 1e9


def hang_reason(row: np.ndarray | np.void, now_ns: int, spec: RingSpec) -> str | None:
    """Why the attached rank of `row` counts as hung, or None while it makes progress.

    Only attached ranks count: a finished, closed or failed rank is not waited on, and a
    dead one is reported as dead (snapshot.death_reason) first."""
    if int(row["status"]) != cb.ATTACHED:
        return None
    age = progress_age_s(row, now_ns)
    limit, key = allowance(int(row["phase"]), spec)
    if age <= limit:
        return None
    stopped = process_state(int(row["pid"])) in ("T", "t")
    return (
        f"is hung: no progress for {age:.0f} s while {doing(row)} (allowed {limit:g} s, {key})"
    ) + ("; its process is stopped" if stopped else "")


def is_silent(row: np.ndarray | np.void, now_ns: int, spec: RingSpec) -> bool:
    """Whether an attached rank has been silent long enough to show (SILENT_AFTER_S)."""
    if int(row["status"]) != cb.ATTACHED:
        return False
    limit, _ = allowance(int(row["phase"]), spec)
    return progress_age_s(row, now_ns) > min(SILENT_AFTER_S, limit / 2)
