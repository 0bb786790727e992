"""Is a process still the one we knew? pid + kernel start time, zombies count as dead."""

from __future__ import annotations

import os
import time

_MISSING = -1


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


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


def own_identity() -> tuple[int, int]:
    """(pid, start time) of the calling process."""
    pid = os.getpid()
    return pid, process_start_time(pid)
