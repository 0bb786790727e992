"""A slow or a stuck main thread on demand, for the liveness tests.

Python imports this module at start-up in every process that has this directory first
on its PYTHONPATH. Then SIGUSR1 makes the main thread compute (a busy loop, using the
CPU) for STALL_HOOK_BUSY_S seconds and carry on: a step slowed past the progress
allowance while working. SIGUSR2 blocks the main thread for good on a lock, using no
CPU: a truly stuck rank. With STALL_HOOK_BLOCK_AT=peer-wait it blocks so at the end of
its next wait on its peers instead (ringtrain.ring.liveness.waiting_on_peers), after its
part of the collective: a rank stuck inside a peer wait while its peers go on to the
next one. Its other threads (heartbeat, watchdog) keep running.
"""

import os
import signal
import sys
import threading
import time

BUSY_ENV = "STALL_HOOK_BUSY_S"
BLOCK_AT_ENV = "STALL_HOOK_BLOCK_AT"


def _busy(_signum, _frame):
    end = time.monotonic() + float(os.environ.get(BUSY_ENV, "0"))
    while time.monotonic() < end:
        pass


def _block_forever():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


def _block_at_peer_wait_end(frame, event, _arg):
    """A profile function: block when waiting_on_peers resumes to end its span (its
    generator called again while the span is open)."""
    liveness = sys.modules.get("ringtrain.ring.liveness")
    resumed = event == "call" and frame.f_code.co_name == "waiting_on_peers"
    if resumed and liveness is not None and liveness._peer_wait_depth > 0:
        sys.setprofile(None)
        _block_forever()


def _blocked(_signum, _frame):
    if os.environ.get(BLOCK_AT_ENV) == "peer-wait":
        sys.setprofile(_block_at_peer_wait_end)  # the main thread: handlers run there
    else:
        _block_forever()


signal.signal(signal.SIGUSR1, _busy)
signal.signal(signal.SIGUSR2, _blocked)
