"""A stuck main thread on demand: SIGUSR1 makes the process's main thread spin forever.

Python imports this module at start-up in every process that has this directory on its
PYTHONPATH. The main thread then loops in Python at its next bytecode after the signal,
while its other threads (heartbeat, watchdog) keep running: the failure a heartbeat
alone cannot see. For the tests and tools/recipes/chaos_run.py that check how a run reacts
to a hung rank (ringtrain.testing.SPIN_HOOK names this directory); training never uses it.
"""

import signal


def _spin_forever(_signum, _frame):
    while True:
        pass


signal.signal(signal.SIGUSR1, _spin_forever)
