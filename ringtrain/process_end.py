"""How ringtrain's processes end: without Python's last garbage collection.

At exit Python clears every module and then runs its cyclic garbage collector over what
is left: for a process holding torch, transformers and a model, about 1,600 modules and
their objects, 0.4-0.9 s a rank on a 2-core machine, paid at the end of every run (and
of every multi-process test); 0.5 s for the launcher (torch alone), 0.8 s for a command
that imported transformers. Each process has closed everything it writes by the time its
main returns (a rank: the ring, metrics.jsonl, which is unbuffered, the checkpoints and
report sinks; a command: its outputs, written in `with` blocks or through raw file
descriptors; log handlers and the standard streams flush in Python's exit hooks), so
nothing it keeps depends on that collection. `gc.freeze` moves the live objects out of
the collector's reach; objects still free by reference counting as modules are cleared,
exit hooks (temporary directories' clean-up among them) run and threads are joined as
before.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import NoReturn


def end_process(code: int) -> NoReturn:
    """Exit with `code`, skipping only the collector's final pass (see the docstring)."""
    gc.freeze()
    sys.exit(code)


def process_entry(main: Callable[[], int]) -> Callable[[], NoReturn]:
    """`main` as a process's entry point (a console script's, ``python -m``'s): it runs,
    then the process ends with its exit code through `end_process`. Called in-process,
    `main` itself returns as before."""

    def run() -> NoReturn:
        end_process(main())

    run.__doc__ = f"{main.__module__}.main, then the process's end with its exit code."
    return run
