"""The DFlash2 drafter: DFlash plus an in-block dynamic convolution and a top-k path selector.

Two modules are added to the DFlash drafter (drafter/arch/dflash/model.py), with the parameter names
the serving engines load for ``DFlash2DraftModel`` (docs/dflash2.md):

- ``layers.N.attention_conv`` / ``layers.N.mlp_conv``: a grouped dynamic depthwise
  convolution over block positions, wrapped around each attention and each MLP.
  ``out[t, c] = sum_j (base[j, c] + delta[t, j, c // group]) * x[t - j, c]``, taps never
  reach across a block boundary (block position t < j reads zero). One projection of the
  sublayer's (normed) input gives the corrections ``delta`` of both convolutions: the one
  before the sublayer (side 0 of ``base_kernel``) and the one after it (side 1). The
  target context is not convolved.
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
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ringtrain.drafter.arch.dflash.model import Attend, DecoderLayer, DFlashDrafter
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
        self.group_size = spec.settings.conv_group_size
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

    def _convolve(
        self,
        x: torch.Tensor,
        delta: torch.Tensor,
        side: int,
        projection: nn.Linear | None = None,
    ) -> torch.Tensor:
        """x [L, H] (whole blocks; [L, in] with `projection`, applied to it first), delta
        [L, taps, groups] -> [L, H]."""
        if projection is not None:
            x = projection(x)
        blocks = x.view(-1, self.block_size, self.groups, self.group_size)
        delta = delta.reshape(-1, self.block_size, self.taps, self.groups, 1)
        base = self.base_kernel[side].to(x.dtype).view(self.taps, self.groups, self.group_size)
        out = (base[0] + delta[:, :, 0]) * blocks
        for tap in range(1, self.taps):
            earlier = F.pad(blocks[:, : self.block_size - tap], (0, 0, 0, 0, tap, 0))
            out = out + (base[tap] + delta[:, :, tap]) * earlier
        return out.reshape(x.shape)

    def before(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Convolve the sublayer input; also return the corrections of the after-side."""
        delta = self.kernel_projection(x).view(x.shape[0], 2, self.taps, self.groups)
        return self._recomputed(x, delta[:, 0], 0), delta[:, 1]

    def after(
        self, y: torch.Tensor, delta: torch.Tensor, projection: nn.Linear | None = None
    ) -> torch.Tensor:
        """Convolve the sublayer output with the corrections `before` returned; with
        `projection`, y is the sublayer's output before its last projection, and the
        projection is redone in backward with the convolution (below)."""
        return self._recomputed(y, delta, 1, projection)

    def _recomputed(
        self,
        x: torch.Tensor,
        delta: torch.Tensor,
        side: int,
        projection: nn.Linear | None = None,
    ) -> torch.Tensor:
        """_convolve, its output formed again in backward instead of kept: backward keeps
        the input and the corrections only (a few multiply-adds per element to redo, where
        keeping the before-side's output for the sublayer's projections cost two more
        [L, H] tensors per convolution pair, a quarter more activation memory per layer).
        A `projection` inside is redone too: backward then keeps its input, which the
        projection's own gradient keeps anyway, instead of its output as well."""
        if not torch.is_grad_enabled():
            return self._convolve(x, delta, side, projection)
        return checkpoint(self._convolve, x, delta, side, projection, use_reentrant=False)


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
        # o_proj inside the after-side's recomputation: one [L, heads * D] x [heads * D, H]
        # GEMM redone in backward (about 1.5% of the 8B drafter's step) for one [L, H]
        # tensor a layer less kept (0.19 GiB a layer on that shape). The MLP's down_proj
        # stays outside: its GEMM is three times wider.
        attended = self.self_attn.attended(h, ctx, cos, sin, attend)
        x = x + self.attention_conv.after(attended, delta, self.self_attn.o_proj)
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
