"""One regenerate (or synthesize) client per output: an exclusive lock on `<output>.lock`.

Two clients appending to one output would both regenerate the records neither has
finished, and the file would hold them twice. So a client takes an exclusive `flock` on
`<output>.lock` before it reads or writes the output, and writes its pid and host into
the file; a second client finds the lock held and is refused with the first one's pid and
host. The kernel drops the lock when its holder exits, however it exits, so the lock of a
killed client is taken over by the next one (which says whose lock it took). The file
stays beside the output, like the settings and errors files, except after a run that
wrote nothing, which removes it while holding it (`release(remove=True)`); a client that
locked the removed file meanwhile sees it is no longer the one at the path and locks
the new one instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path

from ringtrain.data.errors import DatasetError


def lock_path(output: Path) -> Path:
    """The file whose lock says a client is writing `output`."""
    return output.with_name(output.name + ".lock")


def _owner(text: str) -> str:
    """'pid N on host H' from a lock file's contents (or what the file holds instead)."""
    try:
        owner = json.loads(text)
        return f"pid {owner['pid']} on host {owner['host']}"
    except (ValueError, TypeError, KeyError):
        return f"an unknown client (the lock file holds {text[:80]!r})"


class OutputLock:
    """The lock on one output, held from `acquire` until `release` (or process exit)."""

    def __init__(self, output: Path, command: str = "regenerate") -> None:
        self.path = lock_path(output)
        self.output = output
        self.command = command  # the client's command, named when another one is refused
        self.taken_over: str | None = None  # whose stale lock was taken over, if any
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock; raises DatasetError naming the client that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _owner(self.path.read_text(errors="replace"))
                os.close(fd)
                raise DatasetError(
                    f"{self.output}: another {self.command} client is writing it ({holder}, "
                    f"holding {self.path}); wait for it to finish or stop it, or choose "
                    "another --output"
                ) from None
            if self._at_path(fd):
                break
            os.close(fd)  # its holder removed it before this lock: lock the new file
        previous = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if previous:
            self.taken_over = _owner(previous)
        os.ftruncate(fd, 0)
        owner = {"pid": os.getpid(), "host": socket.gethostname()}
        os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
        self._fd = fd

    def _at_path(self, fd: int) -> bool:
        """Whether the file ``fd`` locks is still the one at the lock's path."""
        try:
            here, there = os.fstat(fd), os.stat(self.path)
        except FileNotFoundError:
            return False
        return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

    def release(self, remove: bool = False) -> None:
        """Empty the file (no owner), or with ``remove`` delete it, and drop the lock."""
        if self._fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        else:
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
