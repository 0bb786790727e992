"""The DFlash2 drafter: DFlash plus an in-block dynamic convolution and a top-k path selector.

Two modules are added to the DFlash drafter (drafter/arch/dflash/model.py), with the parameter names
the serving engines load for ``DFlash2DraftModel`` (docs/dflash2.md):

- ``layers.N.attention_conv`` / ``layers.N.mlp_conv``: a grouped dynamic depthwise
  convolution over block positions, wrapped around each attention and each MLP.
  ``out[t, c] = sum_j (base[j, c] + delta[t, j, c // group]) * x[t - j, c]``, taps never
  reach across a block boundary (block position t < j reads zero). One projection of the
  sublayer's (normed) input gives the corrections ``delta`` of both convolutions: the one
  before the sublayer (side 0 of ``base_kernel``) and the one after it (side 1). The
  target context is not convolved. The convolution itself is one op with its own
  backward (block_conv.py).
- ``candidate_selector``: instead of each slot's argmax, the drafter keeps each slot's
  top-k tokens and walks greedily from the last accepted token, scoring candidate ``b``
  after predecessor ``a`` as ``logit(b) + <A[a] * P(h), B[b]>`` (``A``, ``B``: token
  codebooks ``[V, rank]``; ``P``: a projection of the slot's final hidden state); see
  selector.py.

Both start as the identity (unit self tap, no correction; zero successor codebook), so a
fresh DFlash2 drafter computes exactly what DFlash computes.
"""

from __future__ import annotations

import torch
from torch import nn

from ringtrain.drafter.arch.dflash.model import Attend, DecoderLayer, DFlashDrafter
from ringtrain.drafter.arch.dflash2.block_conv import block_conv
from ringtrain.drafter.arch.dflash2.selector import CandidateSelector
from ringtrain.drafter.arch.dflash2.settings import DFlash2Settings
from ringtrain.drafter.head import FrozenHead
from ringtrain.drafter.spec import DrafterSpec
from ringtrain.generate.sampling import TokenSampler


class BlockConv(nn.Module):
    """The two dynamic convolutions (before and after) around one sublayer."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.taps = spec.settings.conv_kernel_size
        self.groups = spec.hidden_size // spec.settings.conv_group_size
        self.block_size = spec.block_size
        self.base_kernel = nn.Parameter(torch.zeros(2, self.taps, spec.hidden_size))
        self.kernel_projection = nn.Linear(
            spec.hidden_size, 2 * self.taps * self.groups, bias=False
        )

    def reset_parameters(self) -> None:
        """The identity: unit self tap on both sides, every correction zero."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def before(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Convolve the sublayer input; also return the corrections of the after-side."""
        delta = self.kernel_projection(x).view(x.shape[0], 2, self.taps, self.groups)
        return block_conv(x, delta[:, 0], self.base_kernel[0], self.block_size), delta[:, 1]

    def after(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Convolve the sublayer output with the corrections `before` returned."""
        return block_conv(y, delta, self.base_kernel[1], self.block_size)


class DFlash2DecoderLayer(DecoderLayer):
    """The DFlash decoder layer with a BlockConv around its attention and its MLP."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__(spec)
        self.attention_conv = BlockConv(spec)
        self.mlp_conv = BlockConv(spec)

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: Attend,
    ) -> torch.Tensor:
        """x [L, H]: whole blocks laid out one after another."""
        h, delta = self.attention_conv.before(self.input_layernorm(x))
        x = x + self.attention_conv.after(self.self_attn(h, ctx, cos, sin, attend), delta)
        h, delta = self.mlp_conv.before(self.post_attention_layernorm(x))
        return x + self.mlp_conv.after(self.mlp(h), delta)


class DFlash2Drafter(DFlashDrafter):
    """DFlash with BlockConv-wrapped layers and a candidate selector for its proposals."""

    layer_class = DFlash2DecoderLayer

    def __init__(self, spec: DrafterSpec) -> None:
        if not isinstance(spec.settings, DFlash2Settings):
            raise ValueError(
                f"DFlash2Drafter built from a spec of architecture {spec.architecture!r}"
            )
        super().__init__(spec)
        self.candidate_selector = CandidateSelector(spec)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DFlash's initialisation, then the added modules at their identity start."""
        super().reset_parameters()
        for module in self.modules():
            if isinstance(module, (BlockConv, CandidateSelector)):
                module.reset_parameters()

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
        """The selector's greedy path through slots 1..B-1, starting after block_ids[0]
        (arguments as draft_hidden)."""
        hidden = self.draft_hidden(
            head, ctx_features, ctx_positions, block_ids, block_positions, ctx_valid
        )
        logits = self.head_logits(head, hidden[1:])
        return self.candidate_selector.walk(hidden[1:], logits, block_ids[0])

    @torch.no_grad()
    def sampled_proposal(
        self,
        hidden: torch.Tensor,
        logits: torch.Tensor,
        anchor: torch.Tensor,
        sampler: TokenSampler,
        noise: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The selector's walk with each step drawn, not argmaxed (arguments and result
        as DFlashDrafter.sampled_proposal; q is zero outside each slot's candidates)."""
        return self.candidate_selector.sampled_walk(hidden, logits, anchor, sampler, noise)
