"""A stuck main thread on demand: SIGUSR1 blocks the process's main thread for good.

Python imports this module at start-up in every process that has this directory on its
PYTHONPATH. The main thread then waits on a lock nobody releases, using no CPU, at its
next bytecode after the signal, while its other threads (heartbeat, watchdog) keep
running: the failure a heartbeat alone cannot see. (A main thread that computes counts
as working: ring/phases.py.) For the tests and tools/recipes/chaos_run.py that check how
a run reacts to a hung rank (ringtrain.testing.SPIN_HOOK names this directory); training
never uses it.
"""

import signal
import threading


def _block_forever(_signum, _frame):
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


signal.signal(signal.SIGUSR1, _block_forever)
