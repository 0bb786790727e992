"""A stuck main thread on demand: SIGUSR1 blocks the process's main thread for good;
SIGUSR2 blocks it so at the end of its next wait on its peers (a drafter's gradient
reduction: ringtrain.ring.liveness.waiting_on_peers), after its part of the collective,
so its peers go on and wait for it in the next one.

Python imports this module at start-up in every process that has this directory on its
PYTHONPATH. The main thread then waits on a lock nobody releases, using no CPU, while
its other threads (heartbeat, watchdog) keep running: the failure a heartbeat alone
cannot see. (A main thread that computes counts as working: ring/phases.py.) For the
tests and tools/recipes/chaos_run.py that check how a run reacts to a hung rank
(ringtrain.testing.SPIN_HOOK names this directory); training never uses it.
"""

import signal
import sys
import threading


def _block_forever(*_args):
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


def _block_in_next_peer_wait(_signum, _frame):
    sys.setprofile(_block_at_peer_wait_end)  # the main thread's: handlers run there


signal.signal(signal.SIGUSR1, _block_forever)
signal.signal(signal.SIGUSR2, _block_in_next_peer_wait)
