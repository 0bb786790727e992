"""Prefill and block verification of one sequence with batch_decode's cache, the
verification replayed as a CUDA graph.

Speculative decoding of one prompt is a chain of small forwards (one block of B tokens
each); with transformers' own cache every one of them pays the model's Python and kernel
launches, several times the GPU work of a 135M target. Here the target keeps its keys
and values in a ``DecodeCache`` of one row and ``capacity`` positions: a verification
writes the block at the position it is given (the count of committed tokens, set on the
device before the forward) and attends to every position up to each block token (a mask
made on the device from that position). Cutting back to the accepted tokens so needs no
work: the next verification starts at the first rejected position and writes over the
rejected keys before any query can see them. Every
verification has the same shapes, so on CUDA it is captured once as a CUDA graph (after
one eager run) and replayed. The model uses batch_decode's attention only within these
forwards (set and restored around each; a replayed graph runs no Python), so other users
of the same model object keep their own. The tapped layers' outputs go to a buffer of
the graph and are copied out after each replay.

Only for targets whose layers are all full attention (``supports_cache_rollback``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ringtrain.generate.batch_decode import (
    BATCH_DECODE,
    DecodeCache,
    attention_for_decoding,
    captured,
    prompt_mask,
)

TapSink = Callable[[torch.Tensor | None], None]


class OwnCacheVerifier:
    """Prefill and verification forwards of one sequence of at most ``capacity`` positions.

    ``set_tap_sink`` points the target's tap hooks at a features buffer (None: off).
    """

    def __init__(
        self, model: PreTrainedModel, capacity: int, tap_width: int, set_tap_sink: TapSink
    ) -> None:
        self.model = model
        self.tap_width = tap_width
        self.set_tap_sink = set_tap_sink
        self.device = next(model.parameters()).device
        self.cache = DecodeCache(model, 1, capacity, "sdpa", self.device)
        self.graphed = self.device.type == "cuda"
        self._block_buffers(0)

    def _block_buffers(self, block_size: int) -> None:
        """The fixed inputs and outputs of a verification of ``block_size`` tokens."""
        dtype = next(self.model.parameters()).dtype
        self.block_size = block_size
        self.graph: torch.cuda.CUDAGraph | None = None
        self.block = torch.zeros(1, block_size, dtype=torch.long, device=self.device)
        self.taps = torch.zeros(block_size, self.tap_width, dtype=dtype, device=self.device)
        self.choices = torch.zeros(block_size, dtype=torch.long, device=self.device)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        self.logits = torch.zeros(block_size, vocab, dtype=dtype, device=self.device)
        self.block_offsets = torch.arange(block_size, device=self.device)

    @property
    def capacity(self) -> int:
        """Positions one sequence may reach (prompt, answer and one block)."""
        return self.cache.length

    def prefill(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Run the prompt [n] from position 0; its taps into ``features`` [n, K*H]; the
        logits [1, V] of its last position."""
        n = int(tokens.shape[0])
        if n + self.block_size > self.capacity:
            raise ValueError(
                f"a prompt of {n} tokens and a block of {self.block_size} exceed the "
                f"verification capacity of {self.capacity} positions"
            )
        self.cache.position.zero_()
        valid = torch.ones(1, n, dtype=torch.bool, device=tokens.device)
        self.set_tap_sink(features)
        try:
            with attention_for_decoding(self.model, BATCH_DECODE):
                logits = self.model(
                    input_ids=tokens[None],
                    attention_mask=prompt_mask(valid),
                    position_ids=self.cache.offsets[:n][None],
                    use_cache=False,
                    logits_to_keep=1,
                    decode_cache=self.cache,
                ).logits[0]
        finally:
            self.set_tap_sink(None)
        return logits

    def verify(self, tokens: torch.Tensor, committed: int, features: torch.Tensor) -> torch.Tensor:
        """The target's greedy choice after each of the block's tokens [B] at positions
        ``committed``..; their taps into ``features`` [B, K*H]. The logits [B, V] behind
        the choices are in ``logits`` until the next verification."""
        if committed + tokens.shape[0] > self.capacity:
            raise ValueError(
                f"position {committed + tokens.shape[0]} is past the verification capacity "
                f"of {self.capacity} positions"
            )
        if tokens.shape[0] != self.block_size:
            self._block_buffers(int(tokens.shape[0]))
        self.block.copy_(tokens[None])
        self.cache.position.fill_(committed)
        if self.graph is not None:
            self.graph.replay()
        elif self.graphed:
            self.graph = captured(self._verify_step)
            self.graphed = self.graph is not None
        else:
            self._verify_step()
        features.copy_(self.taps)
        return self.choices.clone()

    def _verify_step(self) -> None:
        """The block forward on the fixed buffers: what the CUDA graph holds."""
        positions = self.cache.position + self.block_offsets
        visible = self.cache.offsets[None, :] <= positions[:, None]
        self.set_tap_sink(self.taps)
        try:
            with attention_for_decoding(self.model, BATCH_DECODE):
                logits = self.model(
                    input_ids=self.block,
                    attention_mask=visible[None, None],
                    position_ids=positions[None],
                    use_cache=False,
                    logits_to_keep=self.block_size,
                    decode_cache=self.cache,
                ).logits[0]
        finally:
            self.set_tap_sink(None)
        self.logits.copy_(logits)
        self.choices.copy_(logits.argmax(dim=-1))
