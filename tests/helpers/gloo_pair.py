"""Two spawned processes in one gloo world, for tests of code that runs on several ranks.

Each process imports only torch and the worker's own module (not the project's config or
data), so a pair starts in the time of two torch imports. A process that fails ends its
pair at once: the other, which may wait in a collective for it, is killed.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path

SPAWN = mp.get_context("spawn")
PAIR_TIMEOUT_S = 60.0


def pair_member(worker: Callable[[int, str], None], rank: int, store: str, out: str) -> None:
    """One process of `run_pair`: joins the world, runs the worker, destroys its groups
    (after the worker's frame and what it held are gone, as a rank of a run does)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    worker(rank, out)
    gc.collect()
    dist.destroy_process_group()


def spawn_pair(
    member: Callable[[Callable, int, str, str], None],
    worker: Callable,
    tmp_path: Path,
    timeout_s: float = PAIR_TIMEOUT_S,
) -> list[dict]:
    """Run ``member(worker, rank, store, out)`` in two spawned processes (ranks 0 and 1, a
    file store under ``tmp_path``), each to exit code 0, and return what each saved as
    ``<out>/<rank>.pt``. A process that fails ends the pair: the other is killed."""
    import torch

    store, out = str(tmp_path / "store"), str(tmp_path)
    processes = [SPAWN.Process(target=member, args=(worker, rank, store, out)) for rank in (0, 1)]
    for process in processes:
        process.start()
    try:
        running = {process.sentinel: process for process in processes}
        while running:
            ended = wait(list(running), timeout=timeout_s)
            assert ended, f"the pair ran past {timeout_s} s"
            for sentinel in ended:
                process = running.pop(sentinel)
                process.join()
                rank = processes.index(process)
                assert process.exitcode == 0, f"rank {rank} exited with {process.exitcode}"
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    return [torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1)]


def run_pair(worker: Callable[[int, str], None], tmp_path: Path) -> list[dict]:
    """Run ``worker(rank, out)`` on ranks 0 and 1 of a gloo world (a file store under
    ``tmp_path``) and return what each saved as ``<out>/<rank>.pt``."""
    return spawn_pair(pair_member, worker, tmp_path)
