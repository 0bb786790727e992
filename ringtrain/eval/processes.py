"""Shares of an evaluation decoded in worker processes, and the one line a dead one leaves.

Worker k of n is a spawned process (a fresh interpreter, as CUDA needs) running
``function(args, (k, n))``; it sends back its result, or the exception it raised,
through a pipe of its own. A worker that ends without sending (killed by a signal, out
of memory) closes its pipe unread: ``WorkerDied`` then names it, its pid and how it
ended, and the other workers are stopped. Only pipes and processes are used (no queues,
locks or semaphores), so nothing is left behind for the resource tracker to report.
"""

from __future__ import annotations

import multiprocessing
import pickle
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from ringtrain.trainer.report import exit_text, shell_code


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
    """A worker's body: the share's result, or its exception, sent through ``pipe``."""
    try:
        message = ("result", function(args, share), "")
    except Exception as error:  # sent to the parent, which raises it there
        message = ("error", _portable(error), traceback.format_exc())
    pipe.send(message)
    pipe.close()


def run_shares(function: Callable[..., Any], args: Any, workers: int) -> list[Any]:
    """``function(args, (k, workers))`` for every k, each in a process of its own; the
    results in order of k. Raises a worker's exception, or WorkerDied."""
    context = multiprocessing.get_context("spawn")
    pipes: list[Connection] = []
    processes = []
    try:
        for k in range(workers):
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(
                target=_work, args=(function, args, (k, workers), sender), daemon=True
            )
            process.start()
            sender.close()  # the worker holds the only sending end: its death closes the pipe
            pipes.append(receiver)
            processes.append(process)
        return _collect(pipes, processes)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join()
        for pipe in pipes:
            pipe.close()


def _collect(pipes: list[Connection], processes: list) -> list[Any]:
    """Every worker's result, read as each arrives."""
    results: dict[int, Any] = {}
    while len(results) < len(pipes):
        pending = [pipe for k, pipe in enumerate(pipes) if k not in results]
        for pipe in wait(pending):
            k = pipes.index(pipe)
            try:
                kind, value, text = pipe.recv()
            except EOFError:
                raise _died(k, processes) from None
            if kind == "error":
                raise value from WorkerTraceback(text)
            results[k] = value
    return [results[k] for k in range(len(pipes))]


def _died(k: int, processes: list) -> WorkerDied:
    """The error of worker k, whose pipe closed unread."""
    process = processes[k]
    process.join()
    code = process.exitcode
    return WorkerDied(
        f"worker {k} of {len(processes)} (pid {process.pid}) {exit_text(code)} before "
        "reporting its share of the prompts; the other workers were stopped and nothing "
        "was reported",
        shell_code(code) or 1,
    )
