"""Held-out evaluation of the drafter: every decoding anchor, and a replay of decoding.

The training metric tau (1 + mean accepted prefix over uniformly sampled anchors)
overestimates speculative decoding: decoding walks through a response in strides of
(accepted + 1) tokens, so it visits easy stretches rarely and hard ones often.
`evaluate_batch` therefore drafts a block at EVERY row p of a batch where decoding could
place an anchor (loss_mask[p] == loss_mask[p + 1] == 1, p + 1 in the document: the token
at p is already generated and the next one is still to come), with the training blocks,
masks and model code, and computes the accepted prefix a(p) of each block: the leading
slots k = 1 .. B - 1 whose proposal is the token at p + k, stopping at the first miss,
the document end or the response end. The proposal is the architecture's own rule (each
slot's argmax for DFlash, the selector's walk for DFlash2: drafter/block_step.py's
score_blocks), so tau_sim predicts tau_real for either.

Replay: a response span is a maximal run q .. r of loss_mask == 1 rows of a document.
Greedy DFlash decoding of it (ringtrain.eval.speculative) gets the token at q from the
target's prefill over the prompt, then drafts with anchor p = q (context: every row
before q), accepts a(q) drafts plus the target's bonus token, and continues at
p + a(p) + 1 until the next anchor reaches r. The walk is replayed on the device for all
spans at once by pointer doubling. tau_sim = tokens gained by verification steps / steps,
which is tau_real of that decoding when the response is the target's own greedy output
(then the teacher-forced features are exactly what decoding sees). The first response
token (produced by the prefill, not by a verification step) is in neither sum, as in
tau_real.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ringtrain.batch import PackedRows
from ringtrain.drafter.block_step import block_masks, checked_workspace, score_blocks
from ringtrain.drafter.blocks import PackedContext, blocks_at, pack_context
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.head import FrozenHead
from ringtrain.drafter.sums import ObjectiveSums

# The replay's sums, after the block sums in EvalSums.as_vector().
REPLAY_FIELDS = ("replay_tokens", "replay_steps")


@dataclass(frozen=True)
class EvalSums:
    """A held-out batch's sums: the block objective's over every decoding anchor (of the
    architecture's sums class: uniform-anchor metrics, weighted CE, per-slot hits,
    accepted prefixes), then the replay's."""

    blocks: ObjectiveSums
    replay_tokens: torch.Tensor  # tokens gained by the replayed verification steps
    replay_steps: torch.Tensor  # replayed verification steps (anchors visited)

    @staticmethod
    def vector_len(sums_type: type[ObjectiveSums], block_size: int) -> int:
        """Length of as_vector() for block sums of `sums_type` and blocks of `block_size`."""
        return sums_type.vector_len(block_size) + len(REPLAY_FIELDS)

    def as_vector(self) -> torch.Tensor:
        """The block sums' vector, then the replay's two sums (fp64)."""
        replay = torch.stack((self.replay_tokens, self.replay_steps)).double()
        return torch.cat((self.blocks.as_vector(), replay))

    @staticmethod
    def summarise(
        vector: torch.Tensor, sums_type: type[ObjectiveSums], block_size: int
    ) -> dict[str, float | list[float]]:
        """The block sums' metrics plus tau_sim, from a (reduced) as_vector()."""
        metrics = sums_type.summarise(vector[: -len(REPLAY_FIELDS)], block_size)
        tokens, steps = vector[-len(REPLAY_FIELDS) :].tolist()
        metrics["tau_sim"] = tokens / steps if steps else 0.0
        metrics["replay_tokens"] = tokens
        metrics["replay_steps"] = steps
        return metrics


def replay_sums(packed: PackedContext, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, steps) of replaying greedy decoding over every response span of a batch.

    accepted [C] holds a(p) at the anchor-eligible rows of `packed` (any value elsewhere);
    a(p) must not reach past the span's last row. Each span q .. r starts at anchor q
    (when q is eligible, i.e. the span has two or more rows) and moves from p to
    p + a(p) + 1 while that stays an eligible row of the same span.
    """
    eligible, supervised = packed.eligible, packed.supervised
    rows, device = eligible.shape[0], eligible.device
    row = torch.arange(rows, device=device)
    doc_start = row == packed.starts[packed.doc]
    previous = torch.cat((supervised.new_zeros(1), supervised[: rows - 1]))
    span_start = supervised[:rows] & (doc_start | ~previous)
    span = span_start.long().cumsum(0)
    step_to = (row + accepted.long() + 1).clamp(max=rows)
    step_to_in = step_to.clamp(max=rows - 1)
    stays = eligible & (step_to < rows) & eligible[step_to_in] & (span[step_to_in] == span)
    sink = rows
    jump = torch.cat((torch.where(stays, step_to, sink), row.new_full((1,), sink)))
    steps = torch.cat((eligible.long(), row.new_zeros(1)))
    tokens = torch.cat((torch.where(eligible, accepted.long() + 1, 0), row.new_zeros(1)))
    for _ in range(max(1, rows.bit_length())):
        steps = steps + steps[jump]
        tokens = tokens + tokens[jump]
        jump = jump[jump]
    starts = span_start & eligible
    return tokens[:rows][starts].sum(), steps[:rows][starts].sum()


@torch.no_grad()
def evaluate_batch(
    model: nn.Module,
    head: FrozenHead,
    rows: PackedRows,
    cfg: DrafterConfig,
    max_tokens: int,
) -> EvalSums:
    """Evaluate the drafter on one packed batch at every decoding anchor (see the module).

    `rows` as for block_objective (no generator: every anchor). Anchors are processed in
    chunks of the training layout's A blocks, so shapes stay static and memory bounded.
    One host sync (the anchor count). Do not call between a training forward and its
    backward with the same model: the mask buffers are shared with training.
    """
    layout, workspace = checked_workspace(model, rows.hidden, cfg, max_tokens)
    ctx_capacity, max_anchors = layout
    packed = pack_context(rows, ctx_capacity)
    device = rows.hidden.device
    anchor_rows = torch.nonzero(packed.eligible).flatten()
    count = anchor_rows.shape[0]
    accepted = torch.zeros(ctx_capacity + 1, dtype=torch.int64, device=device)
    slots = torch.arange(max_anchors, device=device)
    total: ObjectiveSums | None = None
    for first in range(0, max(count, 1), max_anchors):
        chunk = anchor_rows[first : first + max_anchors]
        anchor = torch.zeros(max_anchors, dtype=torch.int64, device=device)
        anchor[: chunk.shape[0]] = chunk
        valid = slots < chunk.shape[0]
        batch = blocks_at(packed, anchor, valid, cfg.block_size, workspace.spec.mask_token_id)
        sums, block_accepted = score_blocks(
            workspace, head, batch, block_masks(workspace, batch), cfg
        )
        accepted[torch.where(valid, anchor, ctx_capacity)] = block_accepted
        total = sums if total is None else total.plus(sums)
    replay_tokens, replay_steps = replay_sums(packed, accepted[:ctx_capacity])
    return EvalSums(total, replay_tokens, replay_steps)
