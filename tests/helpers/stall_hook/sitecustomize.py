"""A slow or a stuck main thread on demand, for the liveness tests.

Python imports this module at start-up in every process that has this directory first
on its PYTHONPATH. Then SIGUSR1 makes the main thread compute (a busy loop, using the
CPU) for STALL_HOOK_BUSY_S seconds and carry on: a step slowed past the progress
allowance while working. SIGUSR2 blocks the main thread for good on a lock, using no
CPU: a truly stuck rank. Its other threads (heartbeat, watchdog) keep running.
"""

import os
import signal
import threading
import time

BUSY_ENV = "STALL_HOOK_BUSY_S"


def _busy(_signum, _frame):
    end = time.monotonic() + float(os.environ.get(BUSY_ENV, "0"))
    while time.monotonic() < end:
        pass


def _blocked(_signum, _frame):
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


signal.signal(signal.SIGUSR1, _busy)
signal.signal(signal.SIGUSR2, _blocked)
