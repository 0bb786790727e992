"""The DFlash drafter network: Qwen3-style layers that attend to fused target features.

The K tapped target layers are fused into one context stream, `ctx = hidden_norm(fc(taps))`.
Every layer's attention takes its queries from the block tokens only and its keys/values
from `[ctx ; block]` through the same projections, so the context is shared by all layers.
Parameter names match the DFlash checkpoint layout (`layers.N.self_attn.q_proj.weight`,
`fc.weight`, `hidden_norm.weight`, `norm.weight`, ...), so state_dict() is saved as is.

Two entry points share one layer stack: `forward` (training: many blocks of a packed batch,
flex_attention with a BlockMask) and `draft_hidden` / `draft_logits` / `propose` (speculative
decoding of one sequence: dense SDPA, the block sees all of the context before it). Sliding layers
limit a block token at position q to keys with q - kv < window, and with
``spec.sliding_causal`` also to kv <= q (block tokens 0..k for slot k).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from ringtrain.drafter.head import FrozenHead
from ringtrain.drafter.masks import GatheredMask
from ringtrain.drafter.spec import DrafterSpec
from ringtrain.generate.sampling import TokenSampler, race

# (q [1, Hq, L, D], k [1, Hkv, S, D], v [1, Hkv, S, D]) -> [1, Hq, L, D]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

INIT_STD = 0.02


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in (at least) fp32, scaled in the input's dtype (as Qwen3)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension."""
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(x.dtype) * normed.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[a, b] -> [-b, a] over the last dimension (RoPE's pairing of the two halves)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [L, heads, D] by per-position cos/sin [L, D]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class Attention(nn.Module):
    """Queries from the block; keys/values from [ctx ; block] with the same projections."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.num_heads = spec.num_attention_heads
        self.num_kv_heads = spec.num_key_value_heads
        self.head_dim = spec.head_dim
        self.q_proj = nn.Linear(spec.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(spec.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(spec.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, spec.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, spec.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, spec.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: Attend,
    ) -> torch.Tensor:
        """x [L, H] block tokens, ctx [C, H]; cos/sin [C + L, D] for [ctx ; block]."""
        return self.o_proj(self.attended(x, ctx, cos, sin, attend))

    def attended(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: Attend,
    ) -> torch.Tensor:
        """The heads' outputs before o_proj, [L, heads * D] (arguments as forward)."""
        length, num_ctx = x.shape[0], ctx.shape[0]
        q = self.q_norm(self.q_proj(x).view(length, self.num_heads, self.head_dim))
        kv_in = torch.cat((ctx.to(x.dtype), x), dim=0)
        k = self.k_norm(self.k_proj(kv_in).view(num_ctx + length, self.num_kv_heads, -1))
        v = self.v_proj(kv_in).view(num_ctx + length, self.num_kv_heads, self.head_dim)
        q = apply_rope(q, cos[num_ctx:], sin[num_ctx:])
        k = apply_rope(k, cos, sin)
        out = attend(
            q.transpose(0, 1).unsqueeze(0),
            k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0),
        )
        return out[0].transpose(0, 1).reshape(length, -1)


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """down(silu(gate(x)) * up(x))."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP; the context bypasses input_layernorm (it is already normed)."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.self_attn = Attention(spec)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: Attend,
    ) -> torch.Tensor:
        """One residual attention step and one residual MLP step."""
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


def _flex_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask, scale: float
) -> torch.Tensor:
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


def _dense_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def _gathered_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: GatheredMask, scale: float
) -> torch.Tensor:
    """Attention of each block's query rows over its gathered keys (`GatheredMask`).

    q [1, heads, A * B, D], k and v [1, kv_heads, C + A * B, D] as `_dense_attend` takes
    them; the keys and values of block a are gathered as rows, and the query heads that
    share a key head are scored together, so one SDPA call covers every block."""
    _, heads, length, head_dim = q.shape
    kv_heads = k.shape[1]
    blocks, width = mask.keys.shape
    block, group = length // blocks, heads // kv_heads

    def gathered(x: torch.Tensor) -> torch.Tensor:  # [1, kv_heads, N, D] -> [A, kv_heads, W, D]
        rows = x[0].transpose(0, 1).reshape(-1, kv_heads * head_dim)
        picked = rows.index_select(0, mask.keys.view(-1))
        return picked.view(blocks, width, kv_heads, head_dim).transpose(1, 2)

    queries = q[0].view(kv_heads, group, blocks, block, head_dim).permute(2, 0, 1, 3, 4)
    visible = mask.visible[:, None].expand(blocks, group, block, width)
    out = F.scaled_dot_product_attention(
        queries.reshape(blocks, kv_heads, group * block, head_dim),
        gathered(k),
        gathered(v),
        attn_mask=visible.reshape(blocks, 1, group * block, width),
        scale=scale,
    )
    out = out.view(blocks, kv_heads, group, block, head_dim).permute(1, 2, 0, 3, 4)
    return out.reshape(1, heads, length, head_dim)


def _training_attend(mask: BlockMask | GatheredMask, scale: float) -> Attend:
    """The attention of a training forward for one layer's mask."""
    if isinstance(mask, BlockMask):
        return partial(_flex_attend, block_mask=mask, scale=scale)
    return partial(_gathered_attend, mask=mask, scale=scale)


class DFlashDrafter(nn.Module):
    """The drafter: fc + hidden_norm over the taps, `num_layers` decoder layers, final norm."""

    # The decoder layer of this architecture (a variant swaps in its own, same signature).
    layer_class: type[nn.Module] = DecoderLayer

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.spec = spec.validate()
        self.layers = nn.ModuleList(self.layer_class(spec) for _ in range(spec.num_layers))
        self.fc = nn.Linear(spec.num_taps * spec.hidden_size, spec.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        exponents = torch.arange(0, spec.head_dim, 2, dtype=torch.float64) / spec.head_dim
        inv_freq = (1.0 / spec.rope_theta**exponents).float()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Linear weights ~ N(0, 0.02), norm weights 1 (the Qwen3 initialisation)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=INIT_STD)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    @torch.no_grad()
    def fit_output_scale(self, head: FrozenHead) -> float:
        """Start the final norm at the scale where `head` gives logits of unit spread.

        A fresh drafter's block slots carry the mask token's embedding in the residual
        stream, and the final norm brings it to RMS 1; a trained target's head (tied to
        its embedding, as in SmolLM2) scores that direction with logits in the tens, so
        the first loss was far above ln(vocab) and the first gradients huge. The norm's
        weight starts at 1 / (spread of the head's logits for that state), capped at 1
        (a head of small weights keeps the Qwen3 initialisation). Returns the scale.
        """
        mask_embed = head.embed[self.spec.mask_token_id].float()
        unit_rms = mask_embed * mask_embed.pow(2).mean().clamp_min(1e-12).rsqrt()
        spread = float((head.lm_head.float() @ unit_rms).std())
        scale = min(1.0, 1.0 / spread) if spread > 0 else 1.0
        self.norm.weight.fill_(scale)
        return scale

    def rope(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, head_dim] for integer positions [N] (computed in fp32)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _run(
        self,
        ctx_features: torch.Tensor,
        ctx_positions: torch.Tensor,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
        attends: Sequence[Attend],
    ) -> torch.Tensor:
        ctx = self.hidden_norm(self.fc(ctx_features))
        x = block_embeds
        cos, sin = self.rope(torch.cat((ctx_positions, block_positions)), x.dtype)
        for index, layer in enumerate(self.layers):
            x = layer(x, ctx, cos, sin, attends[index])
        return self.norm(x)

    def forward(
        self,
        ctx_features: torch.Tensor,
        ctx_positions: torch.Tensor,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
        block_masks: Sequence[BlockMask | GatheredMask],
    ) -> torch.Tensor:
        """Training path: hidden states [L, H] of all block tokens of a packed batch.

        ctx_features [C, K*H] and ctx_positions [C] are the (padded) context; block_embeds
        [L, H] and block_positions [L] the blocks laid out one after another; block_masks
        holds one mask per layer over keys [ctx ; blocks]: a flex_attention BlockMask (a
        compiled drafter), or each block's keys gathered with what its rows see (an eager
        one: flex_attention has no CPU backward and runs unfused without torch.compile).
        """
        scale = self.spec.head_dim**-0.5
        attends = [_training_attend(m, scale) for m in block_masks]
        return self._run(ctx_features, ctx_positions, block_embeds, block_positions, attends)

    @torch.no_grad()
    def draft_hidden(
        self,
        head: FrozenHead,
        ctx_features: torch.Tensor,
        ctx_positions: torch.Tensor,
        block_ids: torch.Tensor,
        block_positions: torch.Tensor,
        ctx_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Inference entry: final hidden states [B, H] of one block after the context of one
        sequence.

        ctx_features [n, K*H] are the tapped target states of the tokens before the block
        (positions ctx_positions [n]); block_ids [B] = [last accepted token, MASK...] at
        block_positions [B]. ``ctx_valid`` [n] (bool), where given, marks the context rows
        the block may attend; the others are padding (a fixed-size context, as a CUDA
        graph replays it). Runs under bf16 autocast on CUDA.
        """
        device = block_ids.device
        with torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda"):
            embeds = head.embed[block_ids]
            scale = self.spec.head_dim**-0.5
            key_positions = torch.cat((ctx_positions, block_positions))
            visible = None
            if ctx_valid is not None:
                in_block = torch.ones_like(block_positions, dtype=torch.bool)
                visible = torch.cat((ctx_valid, in_block))[None, :]
            attends = []
            for window in self.spec.sliding_windows:
                mask = visible
                if window:
                    distance = block_positions[:, None] - key_positions[None, :]
                    mask = distance < window
                    if self.spec.sliding_causal:
                        mask = mask & (distance >= 0)
                    if visible is not None:
                        mask = mask & visible
                attends.append(partial(_dense_attend, mask=mask, scale=scale))
            return self._run(
                ctx_features.to(embeds.dtype), ctx_positions, embeds, block_positions, attends
            )

    @staticmethod
    def head_logits(head: FrozenHead, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of hidden states [N, H] (fp32, or fp64 for an fp64 head)."""
        logits = hidden.to(head.lm_head.dtype) @ head.lm_head.t()
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    @torch.no_grad()
    def draft_logits(
        self,
        head: FrozenHead,
        ctx_features: torch.Tensor,
        ctx_positions: torch.Tensor,
        block_ids: torch.Tensor,
        block_positions: torch.Tensor,
        ctx_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, V] of one block (arguments as draft_hidden); slot k's logits predict
        the token at block_positions[k]."""
        hidden = self.draft_hidden(
            head, ctx_features, ctx_positions, block_ids, block_positions, ctx_valid
        )
        return self.head_logits(head, hidden)

    @torch.no_grad()
    def propose(
        self,
        head: FrozenHead,
        ctx_features: torch.Tensor,
        ctx_positions: torch.Tensor,
        block_ids: torch.Tensor,
        block_positions: torch.Tensor,
        ctx_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The B-1 tokens this drafter proposes for block slots 1..B-1 (greedy: each slot's
        argmax; arguments as draft_hidden)."""
        logits = self.draft_logits(
            head, ctx_features, ctx_positions, block_ids, block_positions, ctx_valid
        )
        return logits[1:].argmax(-1)

    @torch.no_grad()
    def sampled_proposal(
        self,
        hidden: torch.Tensor,
        logits: torch.Tensor,
        anchor: torch.Tensor,
        sampler: TokenSampler,
        noise: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(drafts [S], the distributions q [S, V] they were drawn from) for slots with
        final hidden states ``hidden`` [S, H] and ``logits`` [S, V] after token ``anchor``:
        each slot drawn independently (they see the same masked block) from softmax(logits
        / T) within top-p, by the exponential race over ``noise`` [S, V] (i.i.d. Exp(1))."""
        q = sampler.probabilities(logits)
        return race(q, noise), q

    @torch.no_grad()
    def draft_tokens(
        self,
        head: FrozenHead,
        ctx_features: torch.Tensor,
        ctx_positions: torch.Tensor,
        last_token: int,
        start_position: int,
    ) -> torch.Tensor:
        """Greedy draft: the B-1 tokens proposed after `last_token` (at `start_position`)."""
        device = ctx_features.device
        block_size = self.spec.block_size
        block_ids = torch.full((block_size,), self.spec.mask_token_id, device=device)
        block_ids[0] = last_token
        positions = start_position + torch.arange(block_size, device=device)
        return self.propose(head, ctx_features, ctx_positions, block_ids, positions)
