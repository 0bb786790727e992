"""CUDA transports with real processes: device slabs over CUDA IPC, pinned host slots."""

from __future__ import annotations

import multiprocessing as mp
import uuid

import pytest
import torch

from tests.helpers import ring_workers as rw

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CTX = mp.get_context("spawn")
JOIN_S = 120


@pytest.mark.parametrize("transport", ["device", "host"])
def test_two_processes_on_one_gpu_move_items_intact(transport: str) -> None:
    spec = rw.make_spec(
        f"t{uuid.uuid4().hex[:10]}", producers=1, consumers=1, slots=3, transport=transport
    )
    barrier, results = CTX.Barrier(2), CTX.Queue()
    jobs = {0: ("produce_random_cuda", 200, 7), 1: ("consume_verify_cuda",)}
    procs = [
        CTX.Process(target=rw.rank_main, args=(spec, i, barrier, results, *job))
        for i, job in jobs.items()
    ]
    for p in procs:
        p.start()
    reports = {tag: payload for tag, _, payload in (results.get(timeout=JOIN_S) for _ in jobs)}
    for p in procs:
        p.join(JOIN_S)
        assert p.exitcode == 0
    produced, used = reports["produce_random_cuda"]
    seen, corrupted = reports["consume_verify_cuda"]
    assert used == transport
    assert corrupted == 0
    assert sorted(seen) == [(0, s) for s in range(produced)]
