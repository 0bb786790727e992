"""Is a process still the one we knew (pid + kernel start time, zombies count as dead),
and is its main thread working (its stack moving or its CPU time growing)?

A thread's CPU time cannot be read from another thread through `time`, but the kernel
keeps it per thread in /proc/self/task/<tid>/stat; its stack is readable through
sys._current_frames. ThreadSampler reads both, so a rank's heartbeat thread can tell a
main thread that computes a long step from one blocked in one place (ring/phases.py).
A main thread waiting in a collective on its peers is neither: `waiting_on_peers` marks
that span, so the sampler counts it as working (a stuck peer is named by its own state),
and reports the span (PeerWait) so that a group whose ranks all wait on each other, none
of them working, is found (phases.deadlock).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

_MISSING = -1
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# A sampled thread that used at least this share of the time since the last sample on
# the CPU is computing (a blocked thread uses none; tick accounting is coarse).
MIN_BUSY_FRACTION = 0.05
# How many of a location's path components name it ("drafter/model.py:150 in forward").
WHERE_PATH_PARTS = 3


def _stat_fields_of(path: str) -> list[str] | None:
    """The fields of a /proc stat file after the command name (field 3 first), or None.
    The command name (field 2) may hold spaces and parentheses: split after the last ')'."""
    try:
        raw = Path(path).read_bytes().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 first), or None."""
    return _stat_fields_of(f"/proc/{pid}/stat")


def process_start_time(pid: int) -> int:
    """Kernel start time of `pid` in clock ticks since boot, or -1 if it does not exist."""
    fields = _stat_fields(pid)
    # After the command name: field 3 (state) is index 0, field 22 (starttime) index 19.
    return int(fields[19]) if fields else _MISSING


def process_state(pid: int) -> str:
    """The kernel's one-letter state of `pid` ("R", "S", "T" stopped, ...), "" if it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else ""


def process_alive(pid: int, start_time: int) -> bool:
    """True while `pid` runs and is the same process (same start time; not a zombie)."""
    if pid <= 0:
        return False
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X", "x"):
        return False
    return int(fields[19]) == start_time


def mapping_pid(path: str) -> int | None:
    """A live process that has the file at ``path`` mapped into its memory (from
    /proc/<pid>/maps; processes whose maps this user may not read are not seen), or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps", encoding="utf-8", errors="replace") as maps:
                if any(line.rstrip("\n").endswith(" " + path) for line in maps):
                    return int(entry)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return None


def monotonic_ns() -> int:
    """System-wide monotonic clock in ns (comparable between processes of one host)."""
    return time.monotonic_ns()


def thread_cpu_s(native_id: int) -> float | None:
    """CPU seconds (user + system) that thread `native_id` of this process has used, or None
    when it is gone."""
    fields = _stat_fields_of(f"/proc/self/task/{native_id}/stat")
    # After the command name: field 14 (utime) is index 11, field 15 (stime) index 12.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S if fields else None


@dataclass(frozen=True)
class PeerWait:
    """The main thread's spans of waiting_on_peers, as the sampler saw them."""

    since_ns: int = 0  # when the span it is in began (monotonic_ns); 0: not in one
    completed: int = 0  # spans it has left since the process started
    members: int = 0  # ranks of the group it waits with in this span (itself included)


@dataclass(frozen=True)
class ThreadActivity:
    """What a sampled thread did since the previous sample."""

    moved: bool  # its stack differs (a frame or a line)
    busy: bool  # it used the CPU (MIN_BUSY_FRACTION of the time)
    peer_wait: PeerWait  # its wait on peers in a collective (waiting_on_peers)
    where: str  # its innermost Python frame, "path:line in function"
    in_torch: bool = False  # that frame is torch's code, where collectives wait

    @property
    def waits_on_peers(self) -> bool:
        """Whether it is in a span of waiting_on_peers."""
        return self.peer_wait.since_ns > 0


class ThreadSampler:
    """Samples one thread of this process from another: its stack and its CPU time."""

    def __init__(self, ident: int, native_id: int) -> None:
        self.ident, self.native_id = ident, native_id
        self._stack: tuple[tuple[int, int], ...] | None = None
        self._cpu_s = thread_cpu_s(native_id)
        self._sampled = time.monotonic()

    def sample(self) -> ThreadActivity | None:
        """The thread's activity since the previous sample (None once it is gone)."""
        frame = sys._current_frames().get(self.ident)
        cpu_s, now = thread_cpu_s(self.native_id), time.monotonic()
        if frame is None or cpu_s is None:
            return None
        where = frame_location(frame)
        stack = []
        walk: FrameType | None = frame
        while walk is not None:
            stack.append((id(walk.f_code), walk.f_lineno or 0))
            walk = walk.f_back
        moved, self._stack = tuple(stack) != self._stack, tuple(stack)
        used, elapsed = cpu_s - (self._cpu_s or 0.0), max(now - self._sampled, 1e-6)
        self._cpu_s, self._sampled = cpu_s, now
        busy = used >= MIN_BUSY_FRACTION * elapsed
        return ThreadActivity(moved, busy, _peer_wait, where, runs_torch_code(frame))


def runs_torch_code(frame: FrameType) -> bool:
    """Whether `frame` runs torch's own code (a collective, the autograd engine): where a
    thread inside a peer wait waits on its peers; in its own code inside one, it is held
    up by something else. False while this process has not imported torch."""
    torch_file = getattr(sys.modules.get("torch"), "__file__", None)
    if torch_file is None:
        return False
    return frame.f_code.co_filename.startswith(os.path.dirname(torch_file) + os.sep)


def frame_location(frame: FrameType) -> str:
    """`frame`'s place in words: the last path components, the line and the function."""
    code = frame.f_code
    path = "/".join(Path(code.co_filename).parts[-WHERE_PATH_PARTS:])
    return f"{path}:{frame.f_lineno} in {code.co_name}"


# The main thread's peer wait (replaced, never changed in place, so a sampling thread
# reads one consistent value) and how deeply its spans nest.
_peer_wait = PeerWait()
_peer_wait_depth = 0


@contextlib.contextmanager
def waiting_on_peers(members: int) -> Iterator[None]:
    """Mark a span in which this process's main thread waits on its peers (a collective
    of a group of `members` ranks, itself included): the sampler counts it as working, as
    a ring wait counts, and reports the span (PeerWait). Spans may nest: the outermost
    one counts."""
    global _peer_wait, _peer_wait_depth
    _peer_wait_depth += 1
    if _peer_wait_depth == 1:
        _peer_wait = PeerWait(monotonic_ns(), _peer_wait.completed, members)
    try:
        yield
    finally:
        _peer_wait_depth -= 1
        if _peer_wait_depth == 0:
            _peer_wait = PeerWait(0, _peer_wait.completed + 1, 0)


def own_identity() -> tuple[int, int]:
    """(pid, start time) of the calling process."""
    pid = os.getpid()
    return pid, process_start_time(pid)
