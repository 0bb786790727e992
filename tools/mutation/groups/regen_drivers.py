"""The mutants of regenerate --local's decoding drivers and its run lock (ringtrain/data/regen_drivers.py, ringtrain/data/regen_lock.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

DRIVER_TESTS = (
    "tests/test_regen_drivers.py", "tests/test_regenerate_local_cpu.py",
    "tests/test_regenerate_local.py",
)  # fmt: skip
LOCK_TESTS = ("tests/test_regen_lock.py",)

GROUPS = (
    Group("regenerate drivers", "ringtrain/data/regen_drivers.py", DRIVER_TESTS, (
        Mutant("a step's tokens of the answers in progress not reported",
               "        generated += len(self.decoder.active)\n", ""),
        Mutant("a turn refused at admission counted as a generated token",
               "generated = len(requests) - sum(isinstance(o, Exception) for _, o in settled)",
               "generated = len(requests)"),
        Mutant("one turn more taken than there are free slots",
               "while len(taken) < self.decoder.free or self._stopping.is_set():",
               "while len(taken) <= self.decoder.free or self._stopping.is_set():"),
        Mutant("a turn waiting while stopping started instead of failed with Stopped",
               "            if self._stopping.is_set():\n                self._settler.settle(",
               "            if False:\n                self._settler.settle("),
        Mutant("the turns still queued not told that generation ended",
               "for turn in [*in_flight.values(), *self._drain()]:",
               "for turn in in_flight.values():"),
        Mutant("a turn whose answer fits the budget exactly refused",
               "        if need > self.budget:\n", "        if need >= self.budget:\n"),
        Mutant("a prompt's padded width rounded down",
               "width = -(-prompt // WIDTH_BUCKET) * WIDTH_BUCKET",
               "width = prompt // WIDTH_BUCKET * WIDTH_BUCKET"),
        Mutant("a failed batch's error handed on untranslated",
               "            failure = self._translate(error)\n            for turn in batch:",
               "            failure = error\n            for turn in batch:"),
        Mutant("a batch starts without waiting for the turns asking in the same passes",
               "while waiting != len(self._waiting) and len(self._waiting) < self.slots:",
               "while False:"),
        Mutant("an abort does not end the batch in flight",
               "        if self._aborted.is_set():\n            raise Aborted(\"generation aborted\")\n"
               "        self._settler.tokens(count)",
               "        if False:\n            raise Aborted(\"generation aborted\")\n"
               "        self._settler.tokens(count)"),
        Mutant("a stop leaves the waiting turns unanswered",
               '        self._fail_waiting(Stopped("stopping: the turn was not started"))\n', ""),
    )),
    Group("regenerate lock", "ringtrain/data/regen_lock.py", LOCK_TESTS, (
        Mutant("the lock taken shared", "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
               "fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)"),
        Mutant("a lock file removed under the client kept",
               "            if self._at_path(fd):\n", "            if True:\n"),
        Mutant("a longer stale owner not cut before the new one is written",
               "        os.ftruncate(fd, 0)\n", ""),
        Mutant("release(remove=True) leaves the lock file",
               "        if remove:\n", "        if False:\n"),
        Mutant("the lock not dropped at release",
               "        os.close(self._fd)\n        self._fd = None", "        self._fd = None"),
        Mutant("a lock file naming no pid crashes the next client",
               "    except (ValueError, TypeError, KeyError):",
               "    except (ValueError, TypeError):"),
        Mutant("the output's folder not made before its lock file",
               "        self.path.parent.mkdir(parents=True, exist_ok=True)\n", ""),
    )),
)  # fmt: skip
