"""Configuration of the DFlash drafter and its optimiser ([drafter], [optim]).

Every number carries its bounds (msgspec.Meta), checked when the config is loaded.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

# The DFlash paper's recipe, where it differs from the defaults: its drafter and
# objective ([drafter]) and its optimiser and schedule ([optim]).
PAPER_DRAFTER = {"architecture": "dflash", "objective": "decayed_ce"}
PAPER_OPTIM = {"name": "adamw", "schedule": "cosine"}


class DrafterConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Drafter architecture and training-block sampling. Zero means "follow the target"."""

    # The drafter's architecture (drafter/arch/, one folder each): "dflash2" (DFlash plus a
    # two-tap dynamic convolution around every attention and MLP and a top-k path
    # selector; its checkpoint is what the engines load as DFlash2DraftModel), or "dflash"
    # (the paper's drafter). The defaults of architecture, objective, [optim] name and
    # schedule are the combination that accepted most on the real-model recipe for the
    # same data and steps (BENCHMARKS.md, the recipe variants); the paper's recipe is
    # PAPER_DRAFTER and PAPER_OPTIM below.
    architecture: Literal["dflash", "dflash2"] = "dflash2"
    # Decoder layers of the drafter.
    num_layers: Annotated[int, msgspec.Meta(ge=1)] = 5
    # Tokens per draft block: the anchor token, then block_size - 1 predicted positions.
    block_size: Annotated[int, msgspec.Meta(ge=2)] = 16
    # Anchors sampled per document: num_anchors per anchor_ref_len tokens, scaled.
    num_anchors: Annotated[int, msgspec.Meta(ge=1)] = 512
    # Document length, in tokens, at which num_anchors anchors are sampled.
    anchor_ref_len: Annotated[int, msgspec.Meta(ge=1)] = 3072
    # Mask token id: fills the block positions the drafter predicts, so it must be a token
    # that never occurs in the data (Qwen3: 151669; Qwen3.5/3.6: 248070). -1 (auto): from
    # the target's tokenizer, its mask token, else a special token named as a mask, else the
    # first id past the tokenizer's tokens, else a reserved/unused special token, else the
    # last id of the vocabulary with a warning (see ringtrain.drafter.mask_token).
    mask_token_id: Annotated[int, msgspec.Meta(ge=-1)] = -1
    # Training objective: "dpace" (D-PACE: each slot weighted by the expected number of
    # slots decoding reaches from it, from the drafter's own confidences; see
    # ringtrain.drafter.loss.dpace_weights) or "decayed_ce" (the paper's cross-entropy,
    # slot k weighted exp(-(k-1)/gamma)).
    objective: Literal["decayed_ce", "dpace"] = "dpace"
    # Loss decay gamma; 0 picks the paper's value for the block size (16: 7, 10: 5, 8: 4).
    gamma: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
    # D-PACE confidence smoothing: s_k = alpha + (1 - alpha) * q_k (1: uniform weights).
    dpace_alpha: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.5
    # Attention heads per layer; 0: the target's.
    num_attention_heads: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Key/value heads per layer; 0: the target's.
    num_key_value_heads: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Width of one attention head; 0: the target's.
    head_dim: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Width of the MLP's hidden layer; 0: the target's.
    intermediate_size: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Per-layer sliding window (0 = full attention); empty = all full attention.
    sliding_windows: list[Annotated[int, msgspec.Meta(ge=0)]] = msgspec.field(default_factory=list)
    # What a sliding layer computes inside a block: "bidirectional" (every block token
    # sees the whole block; what the DFlash reference computes for a checkpoint with
    # is_causal = false) or "causal" (block token k sees block tokens 0..k; what SGLang,
    # vLLM and the reference compute for sliding layers of a checkpoint that does not
    # declare is_causal). Full-attention layers are bidirectional either way; the
    # checkpoint's config.json says which, so every engine computes what was trained.
    sliding_attention: Literal["bidirectional", "causal"] = "bidirectional"
    # DFlash2 only (its settings: drafter/arch/dflash2/settings.py; the serving engines'
    # defaults, like the three below): taps of the in-block convolution.
    conv_kernel_size: Annotated[int, msgspec.Meta(ge=1)] = 2
    # DFlash2 only: channels sharing one dynamic tap correction.
    conv_group_size: Annotated[int, msgspec.Meta(ge=1)] = 16
    # DFlash2 only: rank of the selector's token codebooks.
    selector_rank: Annotated[int, msgspec.Meta(ge=1)] = 256
    # DFlash2 only: candidates per slot the selector walks through.
    selector_top_k: Annotated[int, msgspec.Meta(ge=1)] = 16
    # DFlash2 only: weight of the selector's cross-entropy over the top-k candidates.
    selector_loss_weight: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
    # Most anchors per batch (a static shape); 0: ceil(num_anchors * max_tokens / anchor_ref_len).
    max_anchors: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Rows of the LM head + cross-entropy computed at once.
    loss_chunk: Annotated[int, msgspec.Meta(ge=1)] = 4096
    # torch.compile the layer stack, flex_attention and the loss chunks (CUDA only).
    compile: bool = True
    # torch.compile mode ("default", "max-autotune-no-cudagraphs", ...).
    compile_mode: str = "default"


class OptimConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The optimiser and its learning-rate schedule (defaults: Muon, warmup-stable-decay;
    the paper's are AdamW, cosine: PAPER_OPTIM)."""

    # "adamw": AdamW on every trainable parameter. "muon": Muon (torch.optim.Muon's update,
    # stepped a matrix shape at a time) on the decoder layers' weight matrices (attention
    # and MLP projections) and AdamW, in the same step, on the rest: the input projection
    # fc (the drafter's first layer, which the Muon authors leave to AdamW like
    # embeddings and output layers) and the norms.
    # Muon's step on each matrix is scaled by 0.2 * sqrt(max(rows, cols)) (torch's
    # adjust_lr_fn = "match_rms_adamw"), which gives it the RMS of a typical AdamW update:
    # so one lr (and one weight_decay) serves both parts, with their AdamW values. A
    # checkpoint resumes only under the optimiser that wrote it.
    name: Literal["adamw", "muon"] = "muon"
    # Peak learning rate (AdamW's value; Muon's step is scaled to match it, see name).
    lr: Annotated[float, msgspec.Meta(gt=0.0)] = 6e-4
    # Muon's (Nesterov) momentum; the AdamW part uses beta1 and beta2.
    muon_momentum: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.95
    # "cosine": linear warm-up, then cosine to min_lr_ratio * lr. "wsd" (warmup-stable-
    # decay): linear warm-up, lr held, then over the last decay_fraction of the steps a
    # 1 - sqrt decay to min_lr_ratio * lr (see ringtrain.drafter.schedules).
    schedule: Literal["cosine", "wsd"] = "wsd"
    # "wsd": the fraction of max_steps, at the end, over which lr decays.
    decay_fraction: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.2
    # The learning rate the schedule ends at, as a fraction of lr.
    min_lr_ratio: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    # The fraction of max_steps, at the start, over which lr rises linearly to its peak.
    warmup_fraction: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.04
    # Decoupled weight decay (AdamW's; Muon's part takes the same value).
    weight_decay: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
    # AdamW's first-moment decay.
    beta1: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.9
    # AdamW's second-moment decay.
    beta2: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.95
    # AdamW's denominator epsilon.
    eps: Annotated[float, msgspec.Meta(gt=0.0)] = 1e-8
    # Gradient-norm clipping threshold; 0: no clipping.
    grad_clip: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
    # A step whose loss or gradient norm is not finite is skipped (the weights keep their
    # values); this many such steps in a row stop the run.
    max_nonfinite_steps: Annotated[int, msgspec.Meta(ge=1)] = 10
    # Precision of the drafters' gradient reduction: "float32", "bfloat16" (half the
    # bytes on the wire, each bucket rounded to bf16 before the sum; the optimizer still
    # sees fp32 gradients) or "float64" (twice the bytes; the sum no longer depends on
    # which drafter took which batch, so runs repeat weight for weight, also with Muon:
    # see ringtrain.trainer.data_parallel). Only matters with more than one drafter.
    grad_reduce_dtype: Literal["float32", "bfloat16", "float64"] = "float32"
