"""Liveness by progress: what each rank's main thread is doing, and when it is hung.

A heartbeat thread proves only that a process exists; a main thread stuck in a loop, a
deadlock or a stopped process must be caught too. So each rank's main thread (never
another thread) refreshes `progress_ns` in its rank-table row whenever it finishes a
unit of work (`OwnRow.record_progress`), announces a phase (`OwnRow.set_phase`), or wakes
inside a ring wait (a rank waiting on the ring waits on its peers, it is not stuck).

A rank whose progress is older than its phase's allowance is hung. Announced phases
(start-up work: loading, compiling, the first step; checkpoints) may legitimately take
minutes and get `startup_timeout_s`; steady work gets `progress_timeout_s`. The ring
gives phases no names: a rank announces what it is doing in its own words (`doing`),
and names its steady work once (OwnRow.describe_work); the ring stores and shows them.

Slow is not hung: a step may outlast its allowance on a slow device. So the rank's
heartbeat thread samples the main thread about once a second (liveness.ThreadSampler)
and records when it last saw it working: its stack moved, it used the CPU, or it waits
on its peers in a collective (`active_ns`; `where` it is). A rank counts as hung only
when neither its progress nor its activity is younger than the allowance: its main
thread is blocked in one place using no CPU, or its process is stopped (then no thread
samples). A main thread that burns CPU without its stack moving (one long operation, or
a loop that never ends) counts as working for at most `startup_timeout_s`.
"""

from __future__ import annotations

import numpy as np

from ringtrain.ring import control as cb
from ringtrain.ring.liveness import ThreadActivity, process_state
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


def record_activity(
    row: np.ndarray | np.void, activity: ThreadActivity, now_ns: int, spec: RingSpec
) -> None:
    """Store one sample of the rank's main thread in its row (heartbeat thread only)."""
    if activity.moved:
        row["still_ns"] = now_ns
    row["cpu_busy"] = int(activity.busy)
    cb.put_bytes(row, "where", activity.where.encode("utf-8", "replace"))
    in_place_s = (now_ns - int(row["still_ns"])) / 1e9
    busy = activity.busy and in_place_s <= spec.startup_timeout_s
    if activity.moved or activity.waits_on_peers or busy:
        row["active_ns"] = now_ns


def where(row: np.ndarray | np.void) -> str:
    """Where the rank's main thread was at its last sample, in words."""
    text = cb.get_bytes(row["where"], row["where_len"]).decode("utf-8", "replace")
    return text or "a place not sampled yet"


def slow_reason(row: np.ndarray | np.void, now_ns: int, spec: RingSpec) -> str | None:
    """Why an attached rank is slow (past its allowance, but its main thread works), or
    None when it is not."""
    if int(row["status"]) != cb.ATTACHED:
        return None
    age = progress_age_s(row, now_ns)
    limit, key = allowance(int(row["phase"]), spec)
    if age <= limit or (now_ns - int(row["active_ns"])) / 1e9 > limit:
        return None
    return (
        f"is slow, not hung: no progress for {age:.0f} s while {doing(row)} (past {key} = "
        f"{limit:g} s), but its main thread is working (at {where(row)})"
    )


def hang_reason(row: np.ndarray | np.void, now_ns: int, spec: RingSpec) -> str | None:
    """Why the attached rank of `row` counts as hung, or None while it makes progress or
    works (see the module docstring).

    Only attached ranks count: a finished, closed or failed rank is not waited on, and a
    dead one is reported as dead (snapshot.death_reason) first."""
    if int(row["status"]) != cb.ATTACHED:
        return None
    age = progress_age_s(row, now_ns)
    limit, key = allowance(int(row["phase"]), spec)
    idle = (now_ns - int(row["active_ns"])) / 1e9
    if age <= limit or idle <= limit:
        return None
    progress = f"no progress for {age:.0f} s while {doing(row)} (allowed {limit:g} s, {key})"
    if process_state(int(row["pid"])) in ("T", "t"):  # no thread of it runs
        beat_s = (now_ns - int(row["heartbeat_ns"])) / 1e9
        return f"stopped beating (heartbeat lost {beat_s:.1f} s ago: its process is stopped), {progress}"
    head = f"is hung: {progress}"
    still = (now_ns - int(row["still_ns"])) / 1e9
    if int(row["cpu_busy"]):
        return (
            f"{head}; its main thread has used the CPU at {where(row)} for {still:.0f} s "
            "without moving (one operation may take ring.startup_timeout_s = "
            f"{spec.startup_timeout_s:g} s): a loop that never ends, or raise that limit"
        )
    return (
        f"{head}; its main thread is blocked at {where(row)}, using no CPU for "
        f"{idle:.0f} s: a deadlock or a wait that never ends, not a slow step"
    )


def is_silent(row: np.ndarray | np.void, now_ns: int, spec: RingSpec) -> bool:
    """Whether an attached rank has been silent long enough to show (SILENT_AFTER_S)."""
    if int(row["status"]) != cb.ATTACHED:
        return False
    limit, _ = allowance(int(row["phase"]), spec)
    return progress_age_s(row, now_ns) > min(SILENT_AFTER_S, limit / 2)
