"""An evaluation's conversations decoded by worker processes that take them one at a time,
and the one line a dead worker leaves.

Worker k of n is a spawned process (a fresh interpreter, as CUDA needs) running
``function(args, (k, n), pull)``. ``pull(report)`` sends ``report`` (what the worker made
of its last task; None at first) to the parent, which hands it to ``on_report`` and
answers with the next task not yet handed out, or None when none is left: a worker whose
conversations were short takes more, so all finish at about the same time (fixed shares
left the evaluation waiting on the slowest one). The worker then sends back what
``function`` returns, or the exception it raised, through the same pipe, its own. A
worker that ends without sending (killed by a signal, out of memory) closes its pipe:
``WorkerDied`` then names it, its pid and how it ended, and the other workers are
stopped. Only pipes and processes are used (no queues, locks or semaphores), so nothing
is left behind for the resource tracker to report.
"""

from __future__ import annotations

import multiprocessing
import pickle
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any

from ringtrain.interrupts import set_worker_stops, stops_deferred
from ringtrain.trainer.report import exit_text, shell_code

# What reading or writing a pipe raises once the process at its other end has ended.
PEER_GONE = (EOFError, BrokenPipeError, ConnectionResetError)


class WorkerDied(RuntimeError):
    """A worker that ended without reporting its share; ``code``: the exit code to leave
    with (128 + N for signal N, as a shell gives)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class WorkerTraceback(Exception):
    """The traceback of an exception raised in a worker (the cause of the one raised again
    in the parent, so an unexpected error shows where it happened)."""


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def _work(
    function: Callable[..., Any], args: Any, share: tuple[int, int], pipe: Connection
) -> None:
    """A worker's body: tasks pulled through ``pipe``, then the result, or the exception,
    sent through it. A parent gone (its end of the pipe closed) ends the worker quietly
    at its next pull."""
    set_worker_stops()

    def pull(report: Any) -> Any:
        try:
            pipe.send(("next", report, ""))
            return pipe.recv()
        except PEER_GONE:
            raise SystemExit(1) from None

    try:
        message = ("result", function(args, share, pull), "")
    except Exception as error:  # sent to the parent, which raises it there
        message = ("error", _portable(error), traceback.format_exc())
    try:
        pipe.send(message)
    except PEER_GONE:
        raise SystemExit(1) from None
    pipe.close()


def run_workers(
    function: Callable[..., Any],
    args: Any,
    workers: int,
    tasks: Iterable[Any],
    on_report: Callable[[Any], None],
) -> list[Any]:
    """``function(args, (k, workers), pull)`` for every k, each in a process of its own,
    handing out ``tasks`` as the workers pull them (see the module docstring); what each
    returned, in order of k. Raises a worker's exception, or WorkerDied."""
    context = multiprocessing.get_context("spawn")
    pipes: list[Connection] = []
    processes = []
    try:
        for k in range(workers):
            mine, theirs = context.Pipe()
            process = context.Process(
                target=_work, args=(function, args, (k, workers), theirs), daemon=True
            )
            with stops_deferred():
                process.start()
            theirs.close()  # the worker holds the only other end: its death closes the pipe
            pipes.append(mine)
            processes.append(process)
        return _serve(pipes, processes, iter(tasks), on_report)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join()
        for pipe in pipes:
            pipe.close()


def local_pull(tasks: Iterable[Any], on_report: Callable[[Any], None]) -> Callable[[Any], Any]:
    """``pull`` for decoding in this process: the same hand-out as a worker's, no pipe."""
    remaining = iter(tasks)

    def pull(report: Any) -> Any:
        if report is not None:
            on_report(report)
        return next(remaining, None)

    return pull


def _serve(
    pipes: list[Connection],
    processes: list,
    tasks: Iterator[Any],
    on_report: Callable[[Any], None],
) -> list[Any]:
    """Answer the workers' pulls until every one has sent its result."""
    results: dict[int, Any] = {}
    while len(results) < len(pipes):
        pending = [pipe for k, pipe in enumerate(pipes) if k not in results]
        for pipe in wait(pending):
            k = pipes.index(pipe)
            try:
                kind, value, text = pipe.recv()
                if kind == "next":
                    if value is not None:
                        on_report(value)
                    pipe.send(next(tasks, None))
            except PEER_GONE:
                raise _died(k, processes) from None
            if kind == "error":
                raise value from WorkerTraceback(text)
            if kind == "result":
                results[k] = value
    return [results[k] for k in range(len(pipes))]


def _died(k: int, processes: list) -> WorkerDied:
    """The error of worker k, whose pipe closed unread."""
    process = processes[k]
    process.join()
    code = process.exitcode
    return WorkerDied(
        f"worker {k} of {len(processes)} (pid {process.pid}) {exit_text(code)} before "
        "finishing its conversations; the other workers were stopped and nothing was "
        "reported",
        shell_code(code) or 1,
    )
