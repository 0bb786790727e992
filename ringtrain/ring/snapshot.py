"""Read-only statistics of a ring: discovery of live rings, snapshots, intervals, and
which end limits the ring (or which rank ended it).

Used by `ringtrain-stat` and by the trainer's progress line, which put it in the run's
words (ringtrain.monitor.verdict). Never disturbs the ring it reads: maps the control
block read-only, takes no lock and touches no semaphore. Live rings are found through
/proc/<pid>/fd links to their (already unlinked) control segments, plus any control
segment still named in /dev/shm.
"""

from __future__ import annotations

import json
import mmap
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ringtrain.ring import control as cb
from ringtrain.ring.liveness import monotonic_ns, process_alive, process_state
from ringtrain.ring.names import PREFIX, SHM_DIR, ring_name_part, run_dir_digest
from ringtrain.ring.payload import transport_name
from ringtrain.ring.phases import deadlock, doing, hang_reason, is_silent, progress_age_s
from ringtrain.ring.spec import CONSUMER, PRODUCER, RingSpec

# death_reason of a rank that recorded an error: it failed, and its error says why.
FAILED_REASON = "failed"
# An end is the bottleneck once the other end waits at least this share of the time.
BOTTLENECK_PCT = 10.0
_CTL_LINK = re.compile(
    rf"^{re.escape(SHM_DIR)}/{re.escape(PREFIX)}([A-Za-z0-9_-]+)\.ctl( \(deleted\))?$"
)


def death_reason(row: np.ndarray, now_ns: int, heartbeat_timeout_ns: int) -> str | None:
    """Why the rank of rank-table entry `row` counts as dead, or None while it lives.

    Dead means: it recorded a failure, its process is gone (or the pid was reused),
    or its heartbeat is older than the timeout. Ranks not yet attached or cleanly
    closed are not dead.
    """
    if int(row["status"]) in (cb.EMPTY, cb.CLOSED):
        return None
    pid = int(row["pid"])
    alive = process_alive(pid, int(row["start_time"]))
    # The status again, read after the process: a rank closes before it exits, and a peer
    # that kills a frozen rank marks it failed before the kill (watch.py).
    status = int(row["status"])
    if status in (cb.EMPTY, cb.CLOSED):
        return None
    if status == cb.FAILED:
        return FAILED_REASON
    if not alive:
        return f"died (process {pid} is gone)"
    age_s = (now_ns - int(row["heartbeat_ns"])) / 1e9
    if age_s * 1e9 > heartbeat_timeout_ns:
        stopped = ": its process is stopped" if process_state(pid) in ("T", "t") else ""
        return f"stopped beating (heartbeat lost {age_s:.1f} s ago{stopped})"
    return None


@dataclass
class RankSnapshot:
    """One rank of the ring as seen from outside."""

    rank: int
    index: int
    end: str  # PRODUCER or CONSUMER
    label: str  # what the run calls it (RingSpec.label)
    pid: int
    device: int
    status: str
    alive: bool
    dead_reason: str | None
    heartbeat_age_s: float
    uptime_s: float
    step: int
    items: int
    items_per_s: float
    blocked_pct: float
    starved_pct: float
    blocked_ns: int
    starved_ns: int
    last_error: str
    gpu_busy: float | None  # the rank's own last NVML sample; None: unknown
    interval_items_per_s: float | None = None
    interval_blocked_pct: float | None = None
    interval_starved_pct: float | None = None
    doing: str = ""  # what its main thread announced (phases.py)
    progress_age_s: float = 0.0  # seconds since its main thread last made progress
    hung_reason: str | None = None  # set while it is hung (alive, but no progress)
    silent: bool = False  # silent for a few seconds (phases.SILENT_AFTER_S)
    # Producer groups (RingSpec.group_size > 1): the rank's group, global over nodes, and
    # its place in it (0: the lead, the group's producer); -1 for consumers and without groups.
    group: int = -1
    member: int = -1

    @property
    def is_producer(self) -> bool:
        """A rank that publishes slots: a producer-end rank, or with groups a group's lead."""
        return self.end == PRODUCER and self.member <= 0

    @property
    def is_consumer(self) -> bool:
        """A rank that takes items out of the ring."""
        return self.end == CONSUMER


@dataclass
class RingSnapshot:
    """The whole ring at one instant (`taken_ns` on the monotonic clock)."""

    run: str
    generation: int
    transport: str
    transport_reason: str
    num_slots: int
    slots_per_producer: int
    slot_bytes: int
    closing: bool
    age_s: float
    taken_ns: int
    slot_states: list[str]
    slot_owners: list[int]
    slot_seqs: list[int]
    slot_counts: dict[str, int]
    occupancy: float
    producers_blocked_pct: float
    consumers_starved_pct: float
    ranks: list[RankSnapshot]
    interval_s: float | None = None
    interval_producers_blocked_pct: float | None = None
    interval_consumers_starved_pct: float | None = None
    interval_items_per_s: float | None = None

    @property
    def groups(self) -> dict[int, list[int]]:
        """Global ranks of each producer group, by group index (empty without groups)."""
        groups: dict[int, list[int]] = {}
        for r in self.ranks:
            if r.group >= 0:
                groups.setdefault(r.group, []).append(r.rank)
        return groups

    @property
    def dead(self) -> list[RankSnapshot]:
        """Ranks that count as dead."""
        return [r for r in self.ranks if not r.alive]

    @property
    def fatal(self) -> str | None:
        """The dead or hung rank that ends the run, in words; None while every rank is well."""
        return fatal_line(self.ranks)

    @property
    def waits(self) -> tuple[float, float]:
        """(% of the time producers were blocked, % consumers starved) over the interval
        when the snapshot has one (with_interval), else since the ranks attached."""
        if self.interval_s is None:
            return self.producers_blocked_pct, self.consumers_starved_pct
        return (
            self.interval_producers_blocked_pct or 0.0,
            self.interval_consumers_starved_pct or 0.0,
        )

    @property
    def bottleneck(self) -> str | None:
        """The end that limits the ring over `waits` (limiting_end)."""
        return limiting_end(*self.waits)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def fatal_line(ranks: list[RankSnapshot]) -> str | None:
    """The first dead or hung rank, in words; None while every rank is well."""
    if dead := [r for r in ranks if not r.alive]:
        r = dead[0]
        return f"rank {r.rank} ({r.label}) is dead: {r.dead_reason} - the run cannot continue"
    if hung := [r for r in ranks if r.hung_reason]:
        r = hung[0]
        return f"rank {r.rank} ({r.label}) {r.hung_reason} - the run cannot continue"
    return None


def limiting_end(blocked_pct: float, starved_pct: float) -> str | None:
    """The end that limits the ring: the consumers when producers are blocked on a full ring
    at least BOTTLENECK_PCT of the time (and more than consumers starve), the producers when
    consumers starve that long; None when neither waits that long."""
    if blocked_pct >= BOTTLENECK_PCT and blocked_pct >= starved_pct:
        return CONSUMER
    if starved_pct >= BOTTLENECK_PCT:
        return PRODUCER
    return None


def _rank_snapshot(
    ctl: cb.ControlBlock, spec: RingSpec, index: int, now: int, held_up: tuple[int, str] | None
) -> RankSnapshot:
    """Rank `index`'s row as a snapshot; `held_up` is the ring's phases.deadlock."""
    row = ctl.ranks[index]
    status = int(row["status"])
    reason = death_reason(row, now, int(spec.heartbeat_timeout_s * 1e9))
    hung = hang_reason(row, now, spec) if reason is None else None
    if reason is None and hung is None and held_up is not None and held_up[0] == index:
        hung = held_up[1]
    attached = int(row["attached_ns"])
    uptime_s = (now - attached) / 1e9 if status != cb.EMPTY else 0.0
    waiting = int(row["wait_start_ns"])
    live_wait = now - waiting if waiting and reason is None else 0
    end = spec.ends[index]
    blocked = int(row["blocked_ns"]) + (live_wait if index in spec.producers else 0)
    starved = int(row["starved_ns"]) + (live_wait if end == CONSUMER else 0)
    items = int(row["items"])
    span_ns = max(now - attached, 1)
    return RankSnapshot(
        rank=spec.global_ranks[index],
        index=index,
        end=end,
        label=spec.label(index),
        pid=int(row["pid"]),
        device=int(row["device"]),
        status="dead" if reason else "hung" if hung else cb.RANK_STATUS[status],
        alive=reason is None,
        dead_reason=reason,
        heartbeat_age_s=(now - int(row["heartbeat_ns"])) / 1e9 if status != cb.EMPTY else 0.0,
        uptime_s=uptime_s,
        step=int(row["step"]),
        items=items,
        items_per_s=items / uptime_s if uptime_s > 0 else 0.0,
        blocked_pct=100.0 * blocked / span_ns if status != cb.EMPTY else 0.0,
        starved_pct=100.0 * starved / span_ns if status != cb.EMPTY else 0.0,
        blocked_ns=blocked,
        starved_ns=starved,
        last_error=cb.get_bytes(row["error"], row["error_len"]).decode("utf-8", "replace"),
        gpu_busy=float(row["gpu_busy"]) if float(row["gpu_busy"]) >= 0 else None,
        doing=doing(row),
        progress_age_s=progress_age_s(row, now) if status != cb.EMPTY else 0.0,
        hung_reason=hung,
        silent=reason is None and is_silent(row, now, spec),
        group=group[0] if (group := spec.group_of(index)) else -1,
        member=group[1] if group else -1,
    )


def take_snapshot(ctl: cb.ControlBlock, spec: RingSpec) -> RingSnapshot:
    """Read the statistics of the ring behind `ctl` (no locks, no writes)."""
    now = monotonic_ns()
    header = ctl.header
    states = [cb.SLOT_STATES[int(s)] for s in ctl.slot_state]
    counts = {name: states.count(name) for name in cb.SLOT_STATES}
    held_up = deadlock(ctl.ranks, now, spec)
    ranks = [_rank_snapshot(ctl, spec, i, now, held_up) for i in range(spec.num_ranks)]
    blocked = _mean([r.blocked_pct for r in ranks if r.is_producer])
    starved = _mean([r.starved_pct for r in ranks if r.is_consumer])
    transport = transport_name(int(header["transport"]))
    return RingSnapshot(
        run=spec.run_id,
        generation=int(header["generation"]),
        transport=transport,
        transport_reason=cb.get_bytes(header["reason"], header["reason_len"]).decode(),
        num_slots=spec.num_slots,
        slots_per_producer=spec.slots_per_producer,
        slot_bytes=int(header["slot_bytes"]),
        closing=bool(int(header["closing"])),
        age_s=(now - int(header["created_mono_ns"])) / 1e9,
        taken_ns=now,
        slot_states=states,
        slot_owners=[spec.global_ranks[spec.producers[int(o)]] for o in ctl.slots["owner"]],
        slot_seqs=[int(s) for s in ctl.slots["seq"]],
        slot_counts=counts,
        occupancy=(spec.num_slots - counts["free"]) / spec.num_slots,
        producers_blocked_pct=blocked,
        consumers_starved_pct=starved,
        ranks=ranks,
    )


def with_interval(previous: RingSnapshot, current: RingSnapshot) -> RingSnapshot:
    """`current` plus rates and wait percentages over the time since `previous`."""
    span_ns = max(current.taken_ns - previous.taken_ns, 1)
    before = {r.index: r for r in previous.ranks}
    ranks = []
    for r in current.ranks:
        p = before.get(r.index, r)
        ranks.append(
            replace(
                r,
                interval_items_per_s=(r.items - p.items) * 1e9 / span_ns,
                interval_blocked_pct=100.0 * (r.blocked_ns - p.blocked_ns) / span_ns,
                interval_starved_pct=100.0 * (r.starved_ns - p.starved_ns) / span_ns,
            )
        )
    blocked = _mean([r.interval_blocked_pct for r in ranks if r.is_producer])
    starved = _mean([r.interval_starved_pct for r in ranks if r.is_consumer])
    consumed = sum(r.interval_items_per_s for r in ranks if r.is_consumer)
    return replace(
        current,
        ranks=ranks,
        interval_s=span_ns / 1e9,
        interval_producers_blocked_pct=blocked,
        interval_consumers_starved_pct=starved,
        interval_items_per_s=consumed,
    )


@dataclass(frozen=True)
class RingLocation:
    """Where a live ring's control block can be opened, and which processes map it."""

    run: str
    path: str
    pids: tuple[int, ...]


def discover() -> list[RingLocation]:
    """Rings mapped by live processes (through /proc/<pid>/fd) or still named in /dev/shm;
    segments that are not ring control blocks are left out (`names.junk_segments`)."""
    found: dict[str, tuple[str, list[int]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                match = _CTL_LINK.match(os.readlink(f"{fd_dir}/{fd}"))
            except OSError:
                continue
            if match:
                found.setdefault(match.group(1), (f"{fd_dir}/{fd}", []))[1].append(int(entry))
    for entry in os.listdir(SHM_DIR):
        match = _CTL_LINK.match(f"{SHM_DIR}/{entry}")
        if match and match.group(1) not in found:
            found[match.group(1)] = (f"{SHM_DIR}/{entry}", [])
    return [
        RingLocation(run, path, tuple(sorted(set(pids))))
        for run, (path, pids) in sorted(found.items())
        if _is_ring(path)
    ]


def _is_ring(path: str) -> bool:
    try:
        return cb.header_problem(cb.read_header(path)) is None
    except OSError:
        return False


class RingReader:
    """A read-only mapping of one ring's control block."""

    def __init__(self, location: RingLocation) -> None:
        self.location = location
        with open(location.path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        self.spec = cb.ControlBlock.read_spec(self._mm, location.path)
        self.control = cb.ControlBlock(self._mm, self.spec)

    def snapshot(self) -> RingSnapshot:
        """Current statistics of the ring."""
        return take_snapshot(self.control, self.spec)

    def close(self) -> None:
        """Drop the views and unmap."""
        self.control.drop()
        self._mm.close()


def open_ring(run: str | None = None) -> RingReader:
    """Open a live ring read-only: ``run`` is its ring id, the run's name, or the run's
    directory (None: the only live ring). Errors list the live rings."""
    rings = discover()
    names = ", ".join(r.run for r in rings) or "none"
    if run is None:
        if len(rings) != 1:
            raise LookupError(f"{len(rings)} live rings ({names}): name one")
        return RingReader(rings[0])
    pattern = _ring_pattern(run)
    matches = [r for r in rings if r.run == run] or [r for r in rings if pattern.match(r.run)]
    if len(matches) == 1:
        return RingReader(matches[0])
    if matches:
        listed = ", ".join(r.run for r in matches)
        raise LookupError(f"{run!r} matches several live rings ({listed}): name one")
    raise LookupError(f"no live ring of {run!r} (live rings: {names})")


def _ring_pattern(run: str) -> re.Pattern[str]:
    """The ring ids that ``run`` names: a run directory's rings (its config.json gives
    the name, its path the digest), or every ring of a run of that name."""
    directory = Path(run).expanduser()
    name, digest = run, r"[0-9a-f]{8}"
    if (directory / "config.json").is_file():
        try:
            name = json.loads((directory / "config.json").read_text())["run"]["name"]
            digest = run_dir_digest(str(directory.resolve()))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return re.compile(rf"{re.escape(ring_name_part(name))}-{digest}-n\d+$")
