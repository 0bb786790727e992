"""One block step on a packed batch: the block objective's sums for the trainer to normalise.

`block_objective` samples anchors, builds blocks and BlockMasks, runs the drafter (compiled
on CUDA), and returns *sums* (weighted CE, weights, per-position hits, accepted prefixes:
drafter/sums.py), so the trainer can all-reduce them and normalise by global counts. How
the scored labels are weighted is the configured objective's (drafter/objectives.py);
what the drafter's architecture adds (its proposal rule, its loss parts, its sums) is its
block term's (drafter/arch/base.py). Nothing here syncs with the host.
"""

from __future__ import annotations

import msgspec
import torch
from torch import nn

from ringtrain.batch import PackedRows
from ringtrain.drafter.arch import architecture_named, drafter_of
from ringtrain.drafter.blocks import BlockBatch, build_blocks, layout_sizes
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.head import FrozenHead
from ringtrain.drafter.loss import ChunkFns, chunked_head_loss
from ringtrain.drafter.masks import BlockMaskBuilder
from ringtrain.drafter.objectives import Objective, objective_of
from ringtrain.drafter.sums import ObjectiveSums


class _Workspace:
    """Per-model, per-layout state: the drafter spec, its architecture's block term and
    sums, the objective, mask builder and (compiled) callables."""

    def __init__(self, model: nn.Module, spec, cfg: DrafterConfig, layout, device) -> None:
        ctx_capacity, max_anchors = layout
        self.spec = spec
        architecture = architecture_named(spec.architecture)
        self.sums_type = architecture.sums_type
        compile_mode = cfg.compile_mode if cfg.compile and device.type == "cuda" else None
        # flex_attention is fast only compiled; run eagerly it scores the whole [A*B, C + A*B]
        # matrix, so an eager drafter (any CPU, a GPU with drafter.compile false) attends
        # over each block's gathered keys instead.
        self.gathered_attention = compile_mode is None
        make_term = architecture.block_term
        self.term = (
            make_term(drafter_of(model), cfg, compile_mode) if make_term is not None else None
        )
        self.objective: Objective = objective_of(cfg)
        self.builder = BlockMaskBuilder(
            ctx_capacity,
            max_anchors,
            spec.block_size,
            spec.sliding_windows,
            device,
            spec.sliding_causal,
            compile_backend="inductor" if compile_mode is not None else None,
        )
        self.forward = (
            torch.compile(model, mode=compile_mode, dynamic=False) if compile_mode else model
        )
        self.chunk_fns = ChunkFns(
            compile_mode,
            self.objective.reweight,
            spec.block_size - 1,
            self.term.top_k if self.term is not None else 0,
        )


_WORKSPACES_ATTR = "_ringtrain_workspaces"


def _workspace(model: nn.Module, cfg: DrafterConfig, layout, device) -> _Workspace:
    """The model's workspace for this layout, device and [drafter] config (every setting
    is in its key: a workspace is built from them)."""
    spec = drafter_of(model).spec
    key = (layout, str(device), msgspec.json.encode(cfg))
    per_model = model.__dict__.setdefault(_WORKSPACES_ATTR, {})
    if key not in per_model:
        per_model[key] = _Workspace(model, spec, cfg, layout, device)
    return per_model[key]


def checked_workspace(
    model: nn.Module, hidden: torch.Tensor, cfg: DrafterConfig, max_tokens: int
) -> tuple[tuple[int, int], _Workspace]:
    """The static layout (C, A) and the workspace for batches of max_tokens tokens.

    Raises ValueError when the config's block size or the hidden width do not fit the model.
    """
    spec = drafter_of(model).spec
    if cfg.block_size != spec.block_size:
        raise ValueError(
            f"[drafter] block_size={cfg.block_size} but the model was built with "
            f"{spec.block_size}; rebuild the model or fix the config"
        )
    if hidden.shape[1] != spec.num_taps * spec.hidden_size:
        raise ValueError(
            f"hidden has {hidden.shape[1]} features; the drafter expects "
            f"{spec.num_taps} taps x {spec.hidden_size} = {spec.num_taps * spec.hidden_size}"
        )
    layout = layout_sizes(cfg, max_tokens)
    return layout, _workspace(model, cfg, layout, hidden.device)


def block_masks(workspace: _Workspace, batch: BlockBatch) -> tuple:
    """One attention mask per drafter layer for the blocks of `batch` (a flex_attention
    BlockMask for a compiled drafter, else each block's gathered keys)."""
    masks = workspace.builder.build(
        batch.ctx_lo, batch.ctx_hi, batch.anchor, gathered=workspace.gathered_attention
    )
    return tuple(masks[w] for w in workspace.spec.sliding_windows)


def prepare_batch(
    model: nn.Module,
    rows: PackedRows,
    generator: torch.Generator,
    cfg: DrafterConfig,
    max_tokens: int,
) -> tuple[BlockBatch, tuple, _Workspace]:
    """Blocks, per-layer BlockMasks and the workspace for one batch (no forward yet)."""
    layout, workspace = checked_workspace(model, rows.hidden, cfg, max_tokens)
    batch = build_blocks(rows, generator, cfg, workspace.spec.mask_token_id, *layout)
    return batch, block_masks(workspace, batch), workspace


def score_blocks(
    workspace: _Workspace,
    head: FrozenHead,
    batch: BlockBatch,
    masks: tuple,
    cfg: DrafterConfig,
) -> tuple[ObjectiveSums, torch.Tensor]:
    """Run the drafter on prepared blocks: the objective's sums, and accepted [A].

    accepted[a] is block a's correct prefix: the leading scored slots k = 1 .. B - 1
    whose proposal is the label (0 for padding blocks). The proposal is the drafter's
    own rule: each slot's argmax, or its architecture's block term's (DFlash2: the
    selector's walk), so the per-slot hits, tau_uniform and the held-out replay's tau_sim
    follow what decoding would propose.
    """
    device = batch.ctx_features.device
    block = cfg.block_size
    with torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda"):
        embeds = head.embed[batch.block_ids]
        out = workspace.forward(
            batch.ctx_features, batch.ctx_positions, embeds, batch.block_positions, masks
        )
        num_blocks = batch.valid.shape[0]
        rows = out.view(num_blocks, block, -1)[:, 1:].reshape(num_blocks * (block - 1), -1)
        scored = batch.scored[:, 1:]
        loss_dtype = torch.promote_types(head.lm_head.dtype, torch.float32)
        weights = workspace.objective.row_weights(scored, loss_dtype)
        loss_sum, correct, candidates, candidate_logits = chunked_head_loss(
            rows.to(head.lm_head.dtype),
            head.lm_head,
            batch.labels[:, 1:].reshape(-1),
            weights.reshape(-1),
            cfg.loss_chunk,
            workspace.chunk_fns,
        )
        parts: dict[str, torch.Tensor] = {}
        if workspace.term is not None:
            # The architecture's proposals decide the hits; its loss parts join the loss.
            parts, correct = workspace.term(
                rows, head.lm_head, batch.labels, weights, candidates, candidate_logits,
                cfg.loss_chunk,
            )  # fmt: skip
            for part in parts.values():
                loss_sum = loss_sum + part
    hits = correct.view(num_blocks, block - 1) & scored
    accepted = hits.long().cumprod(1).sum(1)
    sums = workspace.sums_type(
        loss_sum=loss_sum,
        weight_sum=weights.sum(),
        correct=hits.sum(0),
        counted=scored.sum(0),
        accepted_sum=accepted.sum(),
        block_count=batch.valid.sum(),
        **{name: part.detach() for name, part in parts.items()},
    )
    return sums, accepted


def block_objective(
    model: nn.Module,
    head: FrozenHead,
    rows: PackedRows,
    generator: torch.Generator,
    cfg: DrafterConfig,
    max_tokens: int,
) -> ObjectiveSums:
    """Sample blocks from one packed batch, run the drafter, and return the objective's sums.

    `rows` is laid out like a ring slot (PackedRows). max_tokens fixes the static layout
    (pass the ring slot capacity) so shapes never change. The generator (best on the
    batch's device) makes anchor sampling reproducible. Call
    backward on loss_sum before the next call with the same model (the BlockMask buffers
    are reused).
    """
    batch, masks, workspace = prepare_batch(model, rows, generator, cfg, max_tokens)
    return score_blocks(workspace, head, batch, masks, cfg)[0]
