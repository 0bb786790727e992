"""A full device on demand: after SIGUSR1, the next call of the function named by
RINGTRAIN_FAIL_ALLOCATION_IN (say, block_objective) in the process's main thread raises
torch.OutOfMemoryError worded as torch words a full GPU's.

Python imports this module at start-up in every process that has this directory on its
PYTHONPATH (ringtrain.testing.OOM_HOOK names it). For the tests that check what a run
says when a rank runs out of memory; training never uses it.
"""

import os
import signal
import sys

FUNCTION = os.environ.get("RINGTRAIN_FAIL_ALLOCATION_IN", "")
MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.06 GiB is free."
)


def _fail_at_call(frame, event, _arg):
    """A profile function: raise when the named function is called."""
    if event == "call" and frame.f_code.co_name == FUNCTION:
        sys.setprofile(None)
        raise sys.modules["torch"].OutOfMemoryError(MESSAGE)


def _arm(_signum, _frame):
    sys.setprofile(_fail_at_call)  # the main thread's: handlers run there


if FUNCTION:
    signal.signal(signal.SIGUSR1, _arm)
