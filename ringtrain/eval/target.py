"""The target side of speculative decoding: the full causal LM with its tapped layers.

``VerifyingTarget`` loads a local Hugging Face causal LM (with its LM head), registers
forward hooks that copy the tapped layers' OUTPUTS of the newest positions into a
caller-given buffer, and offers the two forwards speculative decoding needs: a prefill
over the prompt and a verification over one block.

Three verification modes:
- ``own``: batch_decode's cache of one row, cut back by setting its position; every
  verification has the same shapes and is replayed as a CUDA graph on CUDA
  (ringtrain.eval.own_verify). Only targets whose every layer is plain full attention.
- ``cache``: transformers' own KV cache, cut back to the accepted tokens after every
  block (same targets as ``own``; each forward pays the model's Python).
- ``recompute``: every verification runs over the whole sequence so far plus the block,
  without a cache. Exact for every architecture (hybrid Gated DeltaNet targets keep
  recurrent states that cannot be rolled back), and cheap for short toy sequences.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from ringtrain.eval.own_verify import OwnCacheVerifier
from ringtrain.eval.settings import VERIFY_MODES
from ringtrain.generate.model import load_causal_lm, supports_cache_rollback

# Positions an ``own`` verification cache is first made for (grown on demand, by this step).
CAPACITY_STEP = 1024


def _cache_keyword(model: nn.Module) -> str:
    """The forward keyword of the KV cache: ``cache`` (newer transformers) or
    ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class VerifyingTarget:
    """A frozen causal LM whose tapped layers' outputs are captured by forward hooks.

    Attributes: ``model`` (the HF causal LM), ``tap_layers``, ``hidden_size``,
    ``vocab_size``, ``device``, ``dtype``, ``mode`` ("cache" or "recompute"),
    ``cache_keyword`` (the forward keyword that takes a KV cache).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tap_layers: list[int],
        mode: str = "auto",
    ) -> None:
        if mode not in VERIFY_MODES:
            raise ValueError(f"verification mode {mode!r} is not one of {', '.join(VERIFY_MODES)}")
        config = model.config
        layers = model.model.layers
        for layer in tap_layers:
            if not 0 <= layer < len(layers):
                raise ValueError(
                    f"tapped layer {layer} is out of range: the target has {len(layers)} layers "
                    f"(valid 0..{len(layers) - 1}); the drafter belongs to another target"
                )
        rollback = supports_cache_rollback(config)
        if mode in ("own", "cache") and not rollback:
            raise ValueError(
                f"verification mode {mode!r} needs a target whose layers are all full "
                "attention; this one has linear-attention or sliding-window layers: use "
                "'recompute'"
            )
        self.model = model
        self.tap_layers = list(tap_layers)
        self.hidden_size = int(config.hidden_size)
        self.vocab_size = int(config.vocab_size)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.mode = ("own" if rollback else "recompute") if mode == "auto" else mode
        self.cache_keyword = _cache_keyword(model)
        self._cache: DynamicCache | None = None
        self._own: OwnCacheVerifier | None = None
        self._stepper: OwnCacheVerifier | None = None
        self._dest: torch.Tensor | None = None
        for k, layer in enumerate(self.tap_layers):
            layers[layer].register_forward_hook(self._tap_hook(k))

    @property
    def tap_width(self) -> int:
        """Columns of the context features: K tapped layers of H each."""
        return len(self.tap_layers) * self.hidden_size

    def reserve(self, positions: int) -> None:
        """Make room for sequences of ``positions`` (``own`` mode; the others grow as they go)."""
        if self.mode != "own" or (self._own is not None and self._own.capacity >= positions):
            return
        capacity = -(-positions // CAPACITY_STEP) * CAPACITY_STEP
        self._own = OwnCacheVerifier(self.model, capacity, self.tap_width, self._set_sink)

    def stepper(self, positions: int) -> OwnCacheVerifier:
        """``own`` mode: a second cache of one row for plain greedy decoding (verifications
        of one token, graphed apart from the block verification), of ``positions`` at least."""
        if self.mode != "own":
            raise ValueError(f"a greedy stepper needs verification mode 'own', not {self.mode!r}")
        if self._stepper is None or self._stepper.capacity < positions:
            capacity = -(-positions // CAPACITY_STEP) * CAPACITY_STEP
            self._stepper = OwnCacheVerifier(self.model, capacity, self.tap_width, self._set_sink)
        return self._stepper

    def prefill(self, prompt_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Run the prompt [n]; write its taps into ``features`` [n, K*H]; return the next token.

        Starts a new sequence (a fresh cache in ``cache`` mode).
        """
        return self.prefill_logits(prompt_ids, features).argmax()

    def prefill_logits(self, prompt_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """As ``prefill``, returning the logits [V] of the token after the prompt."""
        if self.mode == "own":
            self.reserve(int(prompt_ids.shape[0]) + 1)
            with torch.inference_mode():
                return self._own.prefill(prompt_ids, features)[-1]
        if self.mode == "cache":
            self._cache = DynamicCache(config=self.model.config)
        return self._forward(prompt_ids, features, keep=1)[-1]

    def verify(
        self, sequence: torch.Tensor, committed: int, block_size: int, features: torch.Tensor
    ) -> torch.Tensor:
        """Score one block; return the target's greedy token after each block position.

        ``sequence`` holds the ``committed`` tokens whose taps are known, followed by the
        block [anchor, drafts...] of ``block_size`` tokens. The block's taps go into
        ``features`` [block_size, K*H]. Returns [block_size] token ids: entry k is the
        target's greedy choice for the position after block position k. In the cache
        modes the cache then holds all block tokens: call ``rollback`` with the kept count.
        """
        if self.mode == "own":
            block = sequence[committed : committed + block_size]
            with torch.inference_mode():
                return self._own.verify(block, committed, features)
        return self.verify_logits(sequence, committed, block_size, features).argmax(dim=-1)

    def verify_logits(
        self, sequence: torch.Tensor, committed: int, block_size: int, features: torch.Tensor
    ) -> torch.Tensor:
        """As ``verify``, returning the logits [block_size, V]: row k scores the token after
        block position k (sampling draws from them)."""
        if self.mode == "own":
            block = sequence[committed : committed + block_size]
            with torch.inference_mode():
                self._own.verify(block, committed, features)
                return self._own.logits.clone()
        if self.mode == "cache":
            tokens = sequence[committed : committed + block_size]
        else:
            tokens = sequence[: committed + block_size]
        return self._forward(tokens, features, keep=block_size)

    def rollback(self, length: int) -> None:
        """Cut the cache back to its first ``length`` positions (nothing to do in ``own``
        mode, whose verification starts where it is told, nor in ``recompute`` mode)."""
        if self._cache is None:
            return
        remove = self._cache.get_seq_length() - length
        if remove > 0:
            self._cache.crop(-remove)

    def _set_sink(self, features: torch.Tensor | None) -> None:
        """Point the tap hooks at ``features`` (None: taps off)."""
        self._dest = features

    def _forward(self, tokens: torch.Tensor, features: torch.Tensor, keep: int) -> torch.Tensor:
        """One forward of ``tokens`` [L]; taps of the last ``features.shape[0]`` positions go
        into ``features``; returns the logits [keep, V] of the last ``keep`` positions."""
        kwargs: dict[str, object] = {"use_cache": self.mode == "cache", "logits_to_keep": keep}
        if self._cache is not None and self.mode == "cache":
            kwargs[self.cache_keyword] = self._cache
        self._dest = features
        try:
            with torch.inference_mode():
                output = self.model(input_ids=tokens.unsqueeze(0), **kwargs)
        finally:
            self._dest = None
        return output.logits[0]

    def _tap_hook(self, k: int) -> Callable[[nn.Module, tuple, object], None]:
        columns = slice(k * self.hidden_size, (k + 1) * self.hidden_size)

        def hook(_module: nn.Module, _args: tuple, output: object) -> None:
            if self._dest is None:
                return
            hidden = output[0] if isinstance(output, tuple) else output
            rows = self._dest.shape[0]
            self._dest[:, columns].copy_(hidden[0, -rows:])

        return hook


def load_verifying_target(
    path: str | Path,
    tap_layers: list[int],
    device: torch.device | str = "cpu",
    dtype: str = "auto",
    mode: str = "auto",
) -> VerifyingTarget:
    """Load a local target directory as a VerifyingTarget tapping ``tap_layers``."""
    return VerifyingTarget(load_causal_lm(path, device, dtype), tap_layers, mode)
