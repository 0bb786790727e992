"""Two nodes on one host: two torchrun agents (`--nnodes 2`, c10d rendezvous on 127.0.0.1)
run the embedded default, 1 target + 1 drafter each. Each node has a ring of its own,
the two drafters share one gradient, and a stop and resume of both agents trains what an
unbroken run trains: the same batches, step by step, and, with the gradients reduced in
fp64, the same final weights bit for bit, with the defaults (DFlash2, Muon)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from ringtrain.checkpoint import latest_checkpoint, load_checkpoint
from tests.helpers.launcher import RUN_TIMEOUT_S, run_env, shm_entries, step_records, wait_for_step

pytestmark = pytest.mark.slow

# Stopped once step 2 is recorded (a step's record comes after the next step's update, so
# the stop lands in step 3 or 4), it must still stop short of the end.
STEPS = 6
DRAFTER_RANKS = {1: "drafter", 3: "drafter"}
DIGEST = re.compile(r"drafter weights digest: ([0-9a-f]+)")
# The drafters' gradients reduced in fp64, as bit-exact resumes need with several drafters
# per node: the sum then does not depend on which drafter of a node took which batch (that
# follows timing). With the fp32 default, the last-bit
# differences of that order reach the weights: about 1e-6 through AdamW, but through
# Muon's orthogonalised step differences of a step's size (measured 5.3e-3 between a
# resumed and an unbroken run, 9.9e-3 between two unbroken ones, against 0 in fp64).
REDUCE = 'optim.grad_reduce_dtype="float64"'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_node(
    run_dir: Path, node: int, port: int, overrides: Sequence[str], resume: bool
) -> subprocess.Popen:
    """One node's torchrun agent, in a process group of its own, its output in a file."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
        "--node-rank", str(node), "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"two-nodes-{port}",
        "-m", "ringtrain.main", "--set", f"run.run_dir={json.dumps(str(run_dir))}",
        "--set", 'run.device="cpu"', *(a for o in overrides for a in ("--set", o)),
    ] + (["--resume"] if resume else [])  # fmt: skip
    output = (run_dir.parent / f"{run_dir.name}.node{node}.out").open("ab")
    return subprocess.Popen(
        command, env=run_env(), stdout=output, stderr=subprocess.STDOUT, start_new_session=True
    )


def start_nodes(run_dir: Path, overrides: Sequence[str], resume: bool) -> list[subprocess.Popen]:
    """Both nodes' agents, started."""
    port = free_port()
    return [start_node(run_dir, node, port, overrides, resume) for node in (0, 1)]


def run_nodes(
    run_dir: Path, overrides: Sequence[str], stop_after: int = 0, resume: bool = False
) -> list[int]:
    """Both agents to the end (or SIGTERM to both agents' process groups once step
    `stop_after` is recorded); returns their exit codes."""
    return finish_nodes(run_dir, start_nodes(run_dir, overrides, resume), stop_after)


def finish_nodes(run_dir: Path, nodes: list[subprocess.Popen], stop_after: int = 0) -> list[int]:
    """`run_nodes` for agents already started."""
    try:
        if stop_after:
            wait_for_step(nodes[0], run_dir, stop_after)
            for proc in nodes:
                os.killpg(proc.pid, signal.SIGTERM)
        return [proc.wait(RUN_TIMEOUT_S) for proc in nodes]
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(RUN_TIMEOUT_S)


def rank_log(run_dir: Path, rank: int, role: str) -> str:
    return (run_dir / "logs" / f"rank{rank}-{role}.log").read_text()


def digests(run_dir: Path) -> set[str]:
    """The last weights digest each drafter rank of both nodes logged."""
    return {DIGEST.findall(rank_log(run_dir, r, role))[-1] for r, role in DRAFTER_RANKS.items()}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The drafter's weights in the run's last checkpoint."""
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None
    return load_checkpoint(checkpoint, "cpu").model.state_dict()


def batches_per_step(run_dir: Path) -> list[list[tuple[int, int, int]]]:
    """(producer, seq, batch_id) of the batches each step trained, in a fixed order."""
    return [sorted(tuple(b) for b in r["batches"]) for r in step_records(run_dir)]


def test_two_nodes_one_ring_each_one_gradient_and_an_exact_resume(tmp_path: Path) -> None:
    name = f"nodes{os.getpid()}"
    overrides = [
        f"run.max_steps={STEPS}", "run.eval_every=0", "run.checkpoint_every=0",
        "run.log_every=1", f"run.name={name}", REDUCE,
    ]  # fmt: skip
    # The unbroken reference runs beside the interrupted run, which does not depend on it.
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    reference_nodes = start_nodes(reference, overrides, resume=False)
    try:
        run_nodes(interrupted, overrides, stop_after=2)  # the agents exit 1 on SIGTERM
    finally:
        reference_codes = finish_nodes(reference, reference_nodes)
    assert reference_codes == [0, 0], (tmp_path / "reference.node0.out").read_text()
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        for rank in ranks:
            role = DRAFTER_RANKS.get(rank, "target")
            assert f"ring {name}-" in rank_log(reference, rank, role)
            assert re.search(rf"ring {name}-[0-9a-f]+-n{node}\b", rank_log(reference, rank, role))
    steps = batches_per_step(reference)
    assert len(steps) == STEPS and all(len(batches) == 2 for batches in steps)
    assert all({p for p, _, _ in batches} == {0, 1} for batches in steps), "each node's target"
    assert len(digests(reference)) == 1, "the drafters of the two nodes drifted apart"

    for rank in range(4):
        log = rank_log(interrupted, rank, DRAFTER_RANKS.get(rank, "target"))
        assert "exiting with code 0" in log, f"rank {rank} did not stop cleanly:\n{log[-2000:]}"
    stopped = len(step_records(interrupted))
    assert 2 <= stopped < STEPS
    checkpoint = latest_checkpoint(interrupted / "checkpoints")
    assert checkpoint is not None and load_checkpoint(checkpoint, "cpu").step == stopped
    assert run_nodes(interrupted, overrides, resume=True) == [0, 0]
    assert batches_per_step(interrupted) == steps
    assert len(digests(interrupted)) == 1
    want, got = final_weights(reference), final_weights(interrupted)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert shm_entries(name) == []
