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

A wait on peers counts as working because a peer that does not come is named by its own
row. That fails when the stuck rank is itself inside a peer wait (blocked in its part of
a backward whose gradients the group reduces, say): then every rank of the group waits
and each counts as working, for ever. So the sampler also records each rank's peer wait
(since when, how many it completed, the group's size, whether it waits in torch's code),
and `deadlock` finds a group whose every rank has waited past its allowance with its
stack still and no CPU in use. The rank that is behind is named: the one with fewer
completed waits (the others passed the wait it is still in); at equal counts, one
blocked in its own code while the others wait in torch's (a span holds work of its own:
a backward computes before it waits, so the rank that entered first may be the stuck
one, its peers waiting in the collective for its gradients); else the one that entered
the shared wait last (the others arrived and wait for it). A group that spans hosts is
judged on none of them (a host sees only its own ranks); its ranks' own allowances still
bound it.
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
    peer_wait = activity.peer_wait
    row["peer_wait_ns"], row["peer_waits_done"] = peer_wait.since_ns, peer_wait.completed
    row["peer_group"], row["in_torch"] = peer_wait.members, int(activity.in_torch)
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
        return (
            f"stopped beating (heartbeat lost {beat_s:.1f} s ago: its process is stopped), "
            f"{progress}"
        )
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


def _idle_in_peer_wait(row: np.ndarray | np.void, now_ns: int, spec: RingSpec) -> bool:
    """Whether the attached rank of `row` has waited on its peers, without progress and
    without working (stack still, no CPU in use), for longer than its allowance."""
    if int(row["status"]) != cb.ATTACHED or not int(row["peer_wait_ns"]):
        return False
    limit, _ = allowance(int(row["phase"]), spec)
    waited = (now_ns - int(row["peer_wait_ns"])) / 1e9
    still = (now_ns - int(row["still_ns"])) / 1e9
    computing = int(row["cpu_busy"]) and still <= spec.startup_timeout_s
    return min(waited, progress_age_s(row, now_ns), still) > limit and not computing


def deadlock(ranks: np.ndarray, now_ns: int, spec: RingSpec) -> tuple[int, str] | None:
    """(the index of the rank that holds up its group, why) when every rank of a peer group
    waits on the others past its allowance and none of them works; None otherwise (see
    the module docstring). `ranks` is the ring's rank table."""
    waiting = [i for i in range(spec.num_ranks) if _idle_in_peer_wait(ranks[i], now_ns, spec)]
    if not waiting or any(int(ranks[i]["peer_group"]) != len(waiting) for i in waiting):
        return None
    behind = min(
        waiting,
        key=lambda i: (
            int(ranks[i]["peer_waits_done"]),
            int(ranks[i]["in_torch"]),
            -int(ranks[i]["peer_wait_ns"]),
        ),
    )
    row = ranks[behind]
    done = int(row["peer_waits_done"])
    others = [i for i in waiting if i != behind]
    if all(int(ranks[i]["peer_waits_done"]) > done for i in others):
        why = f"it is still in its wait #{done + 1} on them, which the others have left"
    elif not int(row["in_torch"]) and all(int(ranks[i]["in_torch"]) for i in others):
        why = "it is blocked in its own code inside the wait, the others in torch's, for it"
    else:
        why = "it entered the wait they share last, so the others wait for it"
    limit, key = allowance(int(row["phase"]), spec)
    waited = (now_ns - int(row["peer_wait_ns"])) / 1e9
    elsewhere = "; ".join(f"rank {spec.global_ranks[i]} at {where(ranks[i])}" for i in others)
    return behind, (
        f"is hung: it and the other {len(others)} rank(s) of its group wait on each other "
        f"and none of them works (allowed {limit:g} s, {key}); {why}: blocked at "
        f"{where(row)} for {waited:.0f} s while {doing(row)} (the others: {elsewhere})"
    )


def is_silent(row: np.ndarray | np.void, now_ns: int, spec: RingSpec) -> bool:
    """Whether an attached rank has been silent long enough to show (SILENT_AFTER_S)."""
    if int(row["status"]) != cb.ATTACHED:
        return False
    limit, _ = allowance(int(row["phase"]), spec)
    return progress_age_s(row, now_ns) > min(SILENT_AFTER_S, limit / 2)
