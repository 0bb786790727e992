"""A drafter's block proposals over a fixed-size context, replayed as CUDA graphs.

An eager proposal runs the drafter's layers as a few hundred small kernels launched one
by one from Python; for a drafter of a few layers that launch time, not the GPU, sets the
pace of every speculative step, several times the target's verification, which is
replayed as one CUDA graph (ringtrain.eval.own_verify). Here the context lives in a
buffer of fixed rows: a proposal after n context rows runs over the first ``bucket(n)``
rows (n rounded up to a multiple of ``BUCKET_ROWS``) with the rows from n on masked out
(the drafter's ``ctx_valid``), so each bucket has fixed shapes. On CUDA a bucket's
proposal is captured as a CUDA graph at its first use (after one eager run) and replayed
for every later proposal of that size, whatever the prompt. The masked rows hold finite
values (zeros, or features of an earlier, longer context), so they weigh exactly nothing.

Proposals drawn at a temperature (ringtrain.eval.draft_sampling) are graphed the same
way, one graph per bucket and sampling setting; their noise is drawn into a buffer of
the graph before each replay.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from torch import nn

from ringtrain.drafter import FrozenHead
from ringtrain.eval.draft_sampling import sample_drafts
from ringtrain.generate.batch_decode import captured
from ringtrain.generate.sampling import TokenSampler

# Context rows per bucket: a few graphs per prompt length, little padding per proposal.
BUCKET_ROWS = 64


def bucket(rows: int) -> int:
    """``rows`` rounded up to a multiple of BUCKET_ROWS (at least one bucket)."""
    return max(1, -(-rows // BUCKET_ROWS)) * BUCKET_ROWS


class FixedShapeProposals:
    """Block proposals of ``model`` (a drafter of drafter/arch/) with its frozen
    ``head``, over a context of up to ``capacity`` rows of ``tap_width`` features; grown
    (graphs dropped) when a longer context comes. ``graphed``: capture and replay CUDA
    graphs (CUDA only); otherwise every proposal runs eagerly on the same buffers."""

    def __init__(
        self,
        model: nn.Module,
        head: FrozenHead,
        capacity: int,
        tap_width: int,
        dtype: torch.dtype,
        graphed: bool,
    ) -> None:
        self.model = model
        self.head = head
        self.graphed = graphed
        self.device = head.embed.device
        block_size = model.spec.block_size
        self.block = torch.zeros(block_size, dtype=torch.long, device=self.device)
        self.start = torch.zeros((), dtype=torch.long, device=self.device)
        self.offsets = torch.arange(block_size, device=self.device)
        self.drafts = torch.zeros(block_size - 1, dtype=torch.long, device=self.device)
        vocab = head.lm_head.shape[0]
        # Sampled proposals: the draws' distributions and their exponential noise.
        self.draft_probs = torch.zeros(block_size - 1, vocab, device=self.device)
        self.noise = torch.ones(block_size - 1, vocab, device=self.device)
        self.tap_width, self.dtype = tap_width, dtype
        self._context_rows(bucket(capacity))

    def _context_rows(self, rows: int) -> None:
        """A zeroed context buffer of ``rows`` rows; graphs of an older buffer dropped."""
        self.context = torch.zeros(rows, self.tap_width, dtype=self.dtype, device=self.device)
        self.positions = torch.arange(rows, device=self.device)
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph | None] = {}

    def propose(self, context: torch.Tensor, block: torch.Tensor, start: int) -> torch.Tensor:
        """Draft tokens [B-1] after ``context`` [start, K*H] for ``block`` [B] at positions
        ``start``.. (the BlockDrafter contract of ringtrain.eval.speculative)."""
        rows = self._load(context, block, start)
        self._run(rows, lambda: self._propose(rows))
        return self.drafts.clone()

    def propose_sampled(
        self, context: torch.Tensor, block: torch.Tensor, start: int, sampler: TokenSampler
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts [B-1] drawn at the ``sampler``'s temperature and top-p (noise from its
        generator), and the distributions [B-1, V] they were drawn from."""
        rows = self._load(context, block, start)
        self.noise.exponential_(generator=sampler.generator)
        key = (rows, sampler.temperature, sampler.top_p)
        self._run(key, lambda: self._propose_sampled(rows, sampler))
        return self.drafts.clone(), self.draft_probs.clone()

    def _load(self, context: torch.Tensor, block: torch.Tensor, start: int) -> int:
        """Copy a proposal's inputs into the fixed buffers; return its bucket's rows."""
        rows = bucket(start)
        if rows > self.context.shape[0]:
            self._context_rows(bucket(2 * rows))
        self.context[:start].copy_(context)
        self.block.copy_(block)
        self.start.fill_(start)
        return rows

    def _run(self, key: Hashable, step: Callable[[], None]) -> None:
        """Run ``step``: replay its graph, or capture it on first use (CUDA; captured()
        runs it once eagerly first, so its outputs are in place); a step whose capture
        failed (None), or any step off CUDA, runs eagerly."""
        if self.graphed and key not in self.graphs:
            self.graphs[key] = captured(step)
        elif self.graphs.get(key) is not None:
            self.graphs[key].replay()
        else:
            step()

    def _propose(self, rows: int) -> None:
        """One proposal over the first ``rows`` context rows: what a bucket's graph holds."""
        drafts = self.model.propose(
            self.head,
            self.context[:rows],
            self.positions[:rows],
            self.block,
            self.start + self.offsets,
            ctx_valid=self.positions[:rows] < self.start,
        )
        self.drafts.copy_(drafts)

    def _propose_sampled(self, rows: int, sampler: TokenSampler) -> None:
        """One drawn proposal over the first ``rows`` context rows (a graph per setting)."""
        context = (self.context[:rows], self.positions[:rows], self.positions[:rows] < self.start)
        drafts, probs = sample_drafts(
            self.model,
            self.head,
            context,
            self.block,
            self.start + self.offsets,
            sampler,
            self.noise,
        )
        self.drafts.copy_(drafts)
        self.draft_probs.copy_(probs)
