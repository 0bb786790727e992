"""Judging the ranks of a ring from its rank table: dead, failed, aborted, hung or frozen.

Every rank checks its peers whenever a ring wait times out and, from a watchdog thread,
about once per wait timeout; the watchdog also checks the rank itself, so a rank whose
main thread is stuck (while its threads live) names itself and leaves, and one whose
main thread works past its allowance says once that it is slow, not hung. A peer that is
frozen (stopped: no heartbeat either) cannot leave by itself, so the peer that finds it
kills it: the run then ends within seconds instead of waiting for the launcher's grace.
Before the kill it records in the frozen rank's row that it was frozen and killed, so the
other peers, who then find the process gone, report it as failed (not as the first to
see it die): the run's report names what the rank was, frozen, not how it ended.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from ringtrain.ring import control as cb
from ringtrain.ring.errors import PeerDied, RankHung
from ringtrain.ring.liveness import ThreadSampler, monotonic_ns, process_alive
from ringtrain.ring.phases import deadlock, hang_reason, record_activity, slow_reason
from ringtrain.ring.snapshot import FAILED_REASON, death_reason
from ringtrain.ring.spec import RingSpec

log = logging.getLogger(__name__)
HEARTBEAT_INTERVAL_S = 1.0
# A rank whose heartbeat is this many intervals old is frozen (its threads do not run).
FROZEN_AFTER_BEATS = 3


def heartbeat_interval_s(spec: RingSpec) -> float:
    """How often each rank's heartbeat thread beats."""
    return min(HEARTBEAT_INTERVAL_S, spec.heartbeat_timeout_s / 4)


class Watch:
    """The checks of one rank (`local_index`) on the ring behind `control`."""

    def __init__(self, spec: RingSpec, control: cb.ControlBlock, local_index: int) -> None:
        """Call in the rank's main thread: the thread `beat` samples."""
        self.spec, self.control, self.local_index = spec, control, local_index
        self._said_slow = False
        # The first failure found, for every later check: the watchdog and the main thread
        # both check, and once this rank has killed a frozen peer, a fresh look finds only
        # what it left behind (see the module's docstring).
        self._peer_failure: PeerDied | None = None
        self._checking = threading.Lock()
        self._main = ThreadSampler(threading.get_ident(), threading.get_native_id())

    def beat(self, closed: bool) -> None:
        """Refresh this rank's heartbeat and record whether its main thread works
        (phases.record_activity); heartbeat thread only."""
        now = monotonic_ns()
        row = self.control.ranks[self.local_index]
        row["heartbeat_ns"] = now
        activity = self._main.sample()
        if activity is not None and not closed:
            record_activity(row, activity, now, self.spec)

    @property
    def found(self) -> PeerDied | None:
        """The failure a check found before, if any (reads no shared memory)."""
        return self._peer_failure

    def check_peers(self) -> None:
        """Raise PeerDied if another rank died, failed, aborted the ring or is hung; the
        same one, from every thread, once one was found."""
        with self._checking:
            if self._peer_failure is None:
                self._peer_failure = self._find_peer_failure()
        if self._peer_failure is not None:
            raise self._peer_failure

    def _find_peer_failure(self) -> PeerDied | None:
        now = monotonic_ns()
        timeout_ns = int(self.spec.heartbeat_timeout_s * 1e9)
        ranks = self.control.ranks
        if int(self.control.closing):
            index = int(self.control.header["closing_rank"])
            if index != self.local_index:
                return self._failure(index, "aborted the ring")
        others = [i for i in range(self.spec.num_ranks) if i != self.local_index]
        for index in others:
            if reason := death_reason(ranks[index], now, timeout_ns):
                return self._failure(index, reason, primary=reason != FAILED_REASON)
        for index in others:
            if reason := hang_reason(ranks[index], now, self.spec):
                return self._failure(index, reason, RankHung, primary=True)
        held_up = deadlock(ranks, now, self.spec)
        if held_up is not None and held_up[0] != self.local_index:
            return self._failure(*held_up, RankHung, primary=True)
        return None

    def check_self(self) -> None:
        """Raise RankHung if this rank's own main thread made no progress and did no work
        for too long (phases.hang_reason: the message says where it is blocked), or holds
        up its group, every rank of which waits on the others (phases.deadlock)."""
        now = monotonic_ns()
        reason = hang_reason(self.control.ranks[self.local_index], now, self.spec)
        held_up = deadlock(self.control.ranks, now, self.spec)
        if reason is None and held_up is not None and held_up[0] == self.local_index:
            reason = held_up[1]
        if reason:
            raise self._failure(self.local_index, reason, RankHung, primary=True)

    def note_slow_self(self) -> None:
        """Say once, in this rank's log, when its main thread works past its allowance: a
        slow step is not a hang (phases.slow_reason)."""
        if self._said_slow:
            return
        reason = slow_reason(self.control.ranks[self.local_index], monotonic_ns(), self.spec)
        if reason:
            self._said_slow = True
            log.warning(
                "rank %d %s; it keeps running: steps this long are expected on a slow "
                "device (a smaller data.token_budget or drafter makes them shorter)",
                self.spec.global_ranks[self.local_index],
                reason,
            )

    def _failure(
        self, index: int, reason: str, kind: type[PeerDied] = PeerDied, primary: bool = False
    ) -> PeerDied:
        """The error naming rank `index`; a frozen peer is killed first (see the docstring)."""
        row = self.control.ranks[index]
        error = cb.get_bytes(row["error"], row["error_len"]).decode("utf-8", "replace")
        if index != self.local_index:
            self._kill_if_frozen(index, reason)
        rank = self.spec.global_ranks[index]
        return kind(
            f"ring {self.spec.run_id}: rank {rank} ({self.spec.describe(index)}, "
            f"pid {int(row['pid'])}) {reason}; "
            f"its last error: {error or 'none recorded'}",
            rank=rank,
            label=self.spec.label(index),
            last_error=error,
            primary=primary,
        )

    def _kill_if_frozen(self, index: int, reason: str) -> None:
        """Kill rank `index` if it is frozen, after recording `reason` and the kill as its
        error (its status FAILED: the other peers then blame it without claiming it)."""
        row = self.control.ranks[index]
        pid, start = int(row["pid"]), int(row["start_time"])
        beat_age_s = (monotonic_ns() - int(row["heartbeat_ns"])) / 1e9
        frozen = beat_age_s > FROZEN_AFTER_BEATS * heartbeat_interval_s(self.spec)
        if int(row["status"]) in (cb.EMPTY, cb.CLOSED) or not frozen or pid == os.getpid():
            return
        if process_alive(pid, start):
            log.warning(
                "rank %d (pid %d) is frozen (no heartbeat for %.0f s): killing it so the run "
                "ends now",
                self.spec.global_ranks[index],
                pid,
                beat_age_s,
            )
            killer = self.spec.global_ranks[self.local_index]
            note = f"{reason}; rank {killer} killed it so the run ends"
            cb.put_bytes(row, "error", note.encode("utf-8", "replace"))
            row["status"] = cb.FAILED
            os.kill(pid, signal.SIGKILL)
