"""The drafters' data parallelism (trainer/data_parallel.py) on its own.

Two drafters (two real processes, gloo) average their gradients: in fp32 by DDP's own
reduction, in fp64 through the module's hook, whose mean of two fp32 gradients is rounded
once, so exact where fp32 loses it (a halved smallest subnormal, a sum past fp32's range).
Rank 0's weights reach every rank when wrapped, a buffer is never synchronised in
forward, the gradients are views of DDP's buckets, the bf16 reduction is refused on CPU
naming the fix, and the probe reads each sampled iteration's timings once, in ms. In this
process: a drafter alone trains its model unwrapped, and the loss is scaled by ranks over
the global weight.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ringtrain.trainer.data_parallel import (
    GradSyncProbe,
    data_parallel_ranks,
    scaled_loss,
    wrap_data_parallel,
)
from tests.helpers.gloo_pair import run_pair

SMALLEST = 2.0**-149  # fp32's smallest subnormal: half of it rounds to 0 in fp32
HUGE = 3e38  # two of them overflow fp32's sum; their mean does not
# Each rank's gradient of the weights (the input of a dot product).
GRADIENTS = (
    torch.tensor([1.0, 3.0, SMALLEST, HUGE, -2.0]),
    torch.tensor([3.0, 5.0, 2 * SMALLEST, HUGE, 2.0]),
)
# Their mean, rounded once (1.5 x SMALLEST rounds to the even 2 x SMALLEST).
EXACT_MEAN = torch.tensor([2.0, 4.0, 2 * SMALLEST, HUGE, 0.0])
# DDP's logger data as the probe reads it, iteration by iteration (times in ns).
GIVEN_TIMINGS = (
    {"iteration": 4},  # no reduction timed
    {"iteration": 5, "backward_comm_time": 3e6, "backward_compute_comm_overlap_time": 1e6},
    {"iteration": 5, "backward_comm_time": 3e6, "backward_compute_comm_overlap_time": 1e6},
    {"iteration": 6, "backward_comm_time": 3e6, "backward_compute_comm_overlap_time": 4e6},
    {"iteration": 7, "backward_comm_time": 3e6},
)


class Dot(nn.Module):
    """A weight vector dotted with the input, plus a buffer (as the drafter's RoPE table)."""

    def __init__(self, start: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((len(EXACT_MEAN),), start))
        self.register_buffer("offset", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight * x).sum() + self.offset.sum()


def probe_samples(group: dist.ProcessGroup) -> dict[str, list]:
    """The probe's samples of three real iterations (each read twice, with the wall-clock
    ms since the first began: DDP's timings of an iteration are of one before), and of
    GIVEN_TIMINGS."""
    network = wrap_data_parallel(nn.Linear(8, 8), group, "float32")
    probe = GradSyncProbe(network)
    real = []
    started = time.perf_counter()
    for _ in range(3):
        network(torch.randn(2, 8)).sum().backward()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        real.append((probe.sample(), probe.sample(), elapsed_ms))
    given = []
    for timings in GIVEN_TIMINGS:
        network._get_ddp_logging_data = lambda timings=timings: timings  # DDP's logger
        given.append(probe.sample())
    return {"real": real, "given": given}


def drafter_worker(rank: int, out: str) -> None:
    """Drafter `rank` of two: one backward per reduction dtype, each model starting from
    weights of its own rank, saving the weights, gradients and buffer it ends with; then
    the bucket views, the bf16 refusal and the probe."""
    group = dist.new_group([0, 1])
    results: dict[str, object] = {"ranks": data_parallel_ranks(group)}
    for dtype in ("float32", "float64"):
        model = Dot(start=float(rank + 1))
        network = wrap_data_parallel(model, group, dtype)
        with torch.no_grad():
            model.offset.fill_(rank + 10)  # a buffer of this rank's own
        network(GRADIENTS[rank]).backward()
        results[dtype] = {
            "weight": model.weight.detach().clone(),
            "grad": model.weight.grad.clone(),
            "offset": model.offset.item(),
        }
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    network = wrap_data_parallel(model, group, "float32")
    storages = []
    for _ in range(2):
        network(torch.randn(3, 4)).sum().backward()
        storages.append(len({p.grad.untyped_storage().data_ptr() for p in model.parameters()}))
    results["grad_storages"] = storages
    try:
        wrap_data_parallel(nn.Linear(2, 2), group, "bfloat16")
        results["bf16"] = None
    except ValueError as exc:
        results["bf16"] = str(exc)
    results["probe"] = probe_samples(group)
    torch.save(results, Path(out) / f"{rank}.pt")


@pytest.fixture(scope="module")
def two_drafters(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """What each of two drafters saved (drafter_worker)."""
    return run_pair(drafter_worker, tmp_path_factory.mktemp("pair"))


def test_two_drafters_count_as_two_ranks(two_drafters: list[dict]) -> None:
    assert [result["ranks"] for result in two_drafters] == [2, 2]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_drafter_starts_from_rank_0_s_weights_and_keeps_its_buffer(
    two_drafters: list[dict], dtype: str
) -> None:
    for rank, result in enumerate(two_drafters):
        assert torch.equal(result[dtype]["weight"], torch.ones(len(EXACT_MEAN)))
        assert result[dtype]["offset"] == rank + 10  # not rank 0's, in forward


def test_float32_averages_the_drafters_gradients(two_drafters: list[dict]) -> None:
    for result in two_drafters:
        grad = result["float32"]["grad"]
        assert torch.equal(grad[:2], EXACT_MEAN[:2]) and grad[4] == 0.0


def test_float64_rounds_the_mean_once_on_every_drafter(two_drafters: list[dict]) -> None:
    for result in two_drafters:
        grad = result["float64"]["grad"]
        assert grad.dtype == torch.float32
        assert torch.equal(grad, EXACT_MEAN), grad.tolist()


def test_gradients_are_views_of_one_bucket(two_drafters: list[dict]) -> None:
    """No second copy of the gradients: every parameter's lies in DDP's one bucket."""
    assert [result["grad_storages"] for result in two_drafters] == [[1, 1], [1, 1]]


def test_bf16_reduction_is_refused_on_cpu_naming_the_fix(two_drafters: list[dict]) -> None:
    for result in two_drafters:
        assert result["bf16"] is not None
        assert 'bfloat16" needs drafters on CUDA' in result["bf16"]
        assert 'set it to "float32"' in result["bf16"]


def test_the_probe_reads_each_sampled_iteration_once_in_ms(two_drafters: list[dict]) -> None:
    for result in two_drafters:
        real = result["probe"]["real"]
        assert real[-1][0] is not None  # DDP hands timings over in the next forward
        for first, second, elapsed_ms in real:
            assert second is None  # read once
            if first is not None:
                comm_ms, exposed_ms = first
                assert 0 < comm_ms < elapsed_ms
                assert 0 <= exposed_ms <= comm_ms


def test_the_probe_subtracts_the_overlap_from_ddp_s_timings(two_drafters: list[dict]) -> None:
    """3 ms of reduction, 1 ms of it hidden: 2 ms exposed; hidden whole (DDP can count
    more overlap than reduction): none, never negative; no overlap timed: all of it."""
    for result in two_drafters:
        assert result["probe"]["given"] == [None, (3.0, 2.0), None, (3.0, 0.0), (3.0, 3.0)]


def test_a_drafter_alone_trains_its_model_unwrapped() -> None:
    model = nn.Linear(2, 2)
    for dtype in ("float32", "float64", "bfloat16"):
        assert wrap_data_parallel(model, None, dtype) is model
    assert data_parallel_ranks(None) == 1
    assert GradSyncProbe(model).sample() is None


def test_the_loss_is_scaled_by_ranks_over_the_global_weight() -> None:
    assert scaled_loss(torch.tensor(6.0), 2, 3.0).item() == 4.0
    assert scaled_loss(torch.tensor(6.0), 1, 3.0).item() == 2.0
    assert scaled_loss(torch.tensor(0.0), 2, 0.0).item() == 0.0  # a step without labels
