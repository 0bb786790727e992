"""Block proposals over a fixed-size, masked context (and CUDA graphs of them) equal the
drafter's proposals over the context itself; drawn proposals (at a temperature) can be
graphed too."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ringtrain.drafter import FrozenHead, build_drafter, drafter_spec_from_target
from ringtrain.eval.graphed_drafts import BUCKET_ROWS, FixedShapeProposals, bucket
from ringtrain.generate.sampling import TokenSampler
from tests.helpers.tiny_drafter import TAPS, TARGET, make_cfg

# Context lengths in an order that leaves stale rows of a longer context behind a shorter
# one, crosses bucket edges, and ends past the first capacity (the buffer grows).
LENGTHS = [130, 5, 70, 64, 65, 1, 300]
ARCHITECTURES = {
    "dflash": {},
    "dflash_sliding": {"sliding_windows": [0, 24], "sliding_attention": "causal"},
    "dflash2": {"architecture": "dflash2", "selector_rank": 8, "selector_top_k": 4},
}


def _drafter(overrides: dict, device: str, dtype: torch.dtype) -> tuple:
    torch.manual_seed(0)
    cfg = make_cfg(**{"sliding_windows": [0, 0], **overrides})
    model = build_drafter(drafter_spec_from_target(TARGET, cfg, TAPS)).to(device, dtype)
    model.eval().requires_grad_(False)
    # Weights far from the small initialisation, so the context weighs in the logits.
    for parameter in model.parameters():
        parameter.normal_(std=0.3)
    gen = torch.Generator().manual_seed(1)
    embed, lm_head = (torch.randn(2, 64, 32, generator=gen) * 0.5).to(device, dtype)
    return model, FrozenHead(embed, lm_head)


def _inputs(length: int, block_size: int, device: str, dtype: torch.dtype) -> tuple:
    gen = torch.Generator().manual_seed(length)
    context = torch.randn(length, 3 * 32, generator=gen).to(device, dtype)
    block = torch.full((block_size,), 63, dtype=torch.long, device=device)
    block[0] = length % 60
    return context, block


def test_bucket_rounds_up_to_whole_buckets() -> None:
    assert [bucket(n) for n in (0, 1, BUCKET_ROWS, BUCKET_ROWS + 1)] == [
        BUCKET_ROWS,
        BUCKET_ROWS,
        BUCKET_ROWS,
        2 * BUCKET_ROWS,
    ]


class RecordingDrafter:
    """The drafter, its logits recorded at every proposal (what the proposal saw)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.spec = model, model.spec
        self.logits: list[torch.Tensor] = []

    def propose(
        self, head: FrozenHead, *args: torch.Tensor, ctx_valid: torch.Tensor
    ) -> torch.Tensor:
        self.logits.append(self.model.draft_logits(head, *args, ctx_valid))
        return self.model.propose(head, *args, ctx_valid=ctx_valid)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_padded_masked_proposals_equal_proposals_over_the_context(name: str) -> None:
    model, head = _drafter(ARCHITECTURES[name], "cpu", torch.float64)
    block_size = model.spec.block_size
    recorder = RecordingDrafter(model)
    proposals = FixedShapeProposals(recorder, head, 128, 96, torch.float64, graphed=False)
    for length in LENGTHS:
        context, block = _inputs(length, block_size, "cpu", torch.float64)
        positions = torch.arange(length + block_size)
        args = (head, context, positions[:length], block, positions[length:])
        drafts = proposals.propose(context, block, length)
        assert drafts.tolist() == model.propose(*args).tolist(), length
        # The masked rows (zeros, or stale rows of a longer context) weigh nothing.
        expected = model.draft_logits(*args)
        torch.testing.assert_close(recorder.logits[-1], expected, rtol=1e-12, atol=1e-12)
    assert proposals.context.shape[0] >= 300 and not proposals.graphs


class HostReads(TorchDispatchMode):
    """Records every operator that reads a tensor's value on the host (a sync on CUDA,
    where it breaks a CUDA graph's capture)."""

    READS = ("_local_scalar_dense", "nonzero", "is_nonzero", "equal")

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(
        self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None
    ) -> object:
        if func.__name__.split(".")[0] in self.READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_proposals_never_read_a_device_value_on_the_host(name: str) -> None:
    """What a CUDA graph captures must not sync: a proposal (DFlash2's selector walk
    included) keeps every index on the device."""
    model, head = _drafter(ARCHITECTURES[name], "cpu", torch.float32)
    proposals = FixedShapeProposals(model, head, 128, 96, torch.float32, graphed=False)
    context, block = _inputs(70, model.spec.block_size, "cpu", torch.float32)
    with HostReads() as mode:
        proposals.propose(context, block, 70)
        proposals.propose_sampled(context, block, 70, TokenSampler.seeded(1.0, 0.9, 0, "cpu"))
    assert mode.reads == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_cuda_graph_proposals_equal_eager_ones(name: str) -> None:
    model, head = _drafter(ARCHITECTURES[name], "cuda", torch.float32)
    block_size = model.spec.block_size
    graphed = FixedShapeProposals(model, head, 128, 96, torch.bfloat16, graphed=True)
    eager = FixedShapeProposals(model, head, 128, 96, torch.bfloat16, graphed=False)
    for _ in range(2):  # the second round replays the graphs the first one captured
        for length in LENGTHS:
            context, block = _inputs(length, block_size, "cuda", torch.bfloat16)
            expected = eager.propose(context, block, length).tolist()
            assert graphed.propose(context, block, length).tolist() == expected, length
    # The context grew at 300 rows (graphs of the old buffer dropped); the second round
    # captured every bucket again, each one a graph.
    assert set(graphed.graphs) == {bucket(n) for n in LENGTHS}
    assert all(graph is not None for graph in graphed.graphs.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_cuda_graph_drawn_proposals_equal_eager_ones(name: str) -> None:
    model, head = _drafter(ARCHITECTURES[name], "cuda", torch.float32)
    block_size = model.spec.block_size
    graphed = FixedShapeProposals(model, head, 128, 96, torch.bfloat16, graphed=True)
    eager = FixedShapeProposals(model, head, 128, 96, torch.bfloat16, graphed=False)
    for seed in range(2):  # the second round replays the graphs the first one captured
        for length in LENGTHS:
            context, block = _inputs(length, block_size, "cuda", torch.bfloat16)
            draws = [
                proposals.propose_sampled(
                    context, block, length, TokenSampler.seeded(0.8, 0.95, seed, "cuda")
                )
                for proposals in (graphed, eager)
            ]
            (graphed_drafts, graphed_q), (eager_drafts, eager_q) = draws
            assert graphed_drafts.tolist() == eager_drafts.tolist(), length
            torch.testing.assert_close(graphed_q, eager_q)
    assert all(graph is not None for graph in graphed.graphs.values())
