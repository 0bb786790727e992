"""The target loop's runner: stage padded numpy batches, overlap H2D with the forward.

``prefetch`` stages the NEXT batch's token ids and packed token index into pinned host
buffers and copies them to the GPU on a side stream while the current forward runs;
``forward_into`` makes the compute stream wait for that copy (no host sync) and runs the
target into the caller's output tensor. Two buffer sets alternate; each is reused only
after the forward that read it has finished on the GPU (stream-ordered, no host wait)
and its previous host-to-device copy has completed. On CPU the same calls are plain
copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from transformers import PretrainedConfig

from ringtrain.target.tapped import TappedTarget


class PaddedRows(Protocol):
    """A right-padded batch as the data pipeline produces it (e.g. its PaddedBatch)."""

    input_ids: np.ndarray  # integer [B, L]
    attention_mask: np.ndarray  # [B, L], 1 on real tokens, then 0 on padding


@dataclass(eq=False)
class _StagedBatch:
    """One alternating set of host staging buffers and their device copies."""

    host_ids: torch.Tensor
    host_index: torch.Tensor
    device_ids: torch.Tensor
    device_index: torch.Tensor
    copied: torch.cuda.Event | None
    consumed: torch.cuda.Event | None


class TargetRunner:
    """Feeds right-padded numpy batches to a TappedTarget with prefetching.

    ``prefetch(padded_batch)`` then ``forward_into(out)``; the packed rows of ``out``
    follow the row-major order of the real tokens (row 0's tokens, then row 1's, ...),
    matching the ring slot's packed layout (and the data pipeline's ``token_index``).
    """

    def __init__(self, target: TappedTarget, device: torch.device | str | None = None) -> None:
        if device is not None and torch.device(device) != target.device:
            raise ValueError(
                f"TargetRunner on {device} for a target loaded on {target.device}; pass the "
                f"device the target was loaded on (or none)"
            )
        self.target = target
        self.device = target.device
        self._cuda = self.device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._sets = [self._new_set(0), self._new_set(0)]
        self._next_set = 0
        self._pending: tuple[_StagedBatch, int, int, int] | None = None

    @property
    def tap_layers(self) -> list[int]:
        """Tapped layer indices, in the order of their columns in ``out``."""
        return self.target.tap_layers

    @property
    def hidden_size(self) -> int:
        """The target's hidden size H (``out`` has K*H columns)."""
        return self.target.hidden_size

    @property
    def num_layers(self) -> int:
        """The target's FULL layer count (before truncation)."""
        return self.target.num_layers

    @property
    def vocab_size(self) -> int:
        """The target's vocabulary size."""
        return self.target.vocab_size

    @property
    def config(self) -> PretrainedConfig:
        """The target's full HF text config."""
        return self.target.config

    def prefetch(self, batch: PaddedRows) -> int:
        """Stage a right-padded [B, L] batch and start its copy to the device.

        Returns N, the number of real tokens: ``forward_into`` expects ``out`` of shape
        [N, K*H]. Raises ValueError on a malformed batch (shape, padding side, ids out
        of the vocabulary).
        """
        input_ids = np.asarray(batch.input_ids)
        mask = np.asarray(batch.attention_mask).astype(bool, copy=False)
        self._check_batch(input_ids, mask)
        rows_in_batch, length = input_ids.shape
        padded = rows_in_batch * length
        token_index = np.flatnonzero(mask)
        rows = token_index.shape[0]
        which = self._next_set
        self._next_set ^= 1
        staged = self._sets[which]
        if staged.copied is not None:
            staged.copied.synchronize()  # its host buffers may still feed an earlier copy
        if staged.host_ids.numel() < padded:
            staged = self._sets[which] = self._grown(staged, padded)
        np.copyto(staged.host_ids.numpy()[:padded], input_ids.reshape(-1), casting="same_kind")
        np.copyto(staged.host_index.numpy()[:rows], token_index)
        if self._cuda:
            with torch.cuda.stream(self._copy_stream):
                self._copy_stream.wait_event(staged.consumed)
                staged.device_ids[:padded].copy_(staged.host_ids[:padded], non_blocking=True)
                staged.device_index[:rows].copy_(staged.host_index[:rows], non_blocking=True)
                staged.copied.record(self._copy_stream)
        self._pending = (staged, rows_in_batch, length, rows)
        return rows

    def forward_into(self, out: torch.Tensor) -> None:
        """Run the prefetched batch; the tapped layers' real rows land in ``out`` [N, K*H].

        Enqueued on the current stream; on CUDA record an event on it (or synchronize)
        before ``out`` is published to a reader.
        """
        if self._pending is None:
            raise RuntimeError(
                "forward_into called without a prefetched batch; call prefetch first"
            )
        staged, batch, length, rows = self._pending
        self._pending = None
        if self._cuda:
            torch.cuda.current_stream(self.device).wait_event(staged.copied)
        input_ids = staged.device_ids[: batch * length].view(batch, length)
        self.target.forward_into(input_ids, staged.device_index[:rows], out)
        if self._cuda:
            staged.consumed.record(torch.cuda.current_stream(self.device))

    def _check_batch(self, input_ids: np.ndarray, mask: np.ndarray) -> None:
        if input_ids.ndim != 2 or mask.shape != input_ids.shape:
            raise ValueError(
                f"padded batch: input_ids {input_ids.shape} and attention_mask {mask.shape} "
                f"must both be [B, L]"
            )
        if not np.issubdtype(input_ids.dtype, np.integer):
            raise ValueError(f"padded batch: input_ids must be integers, got {input_ids.dtype}")
        lengths = mask.sum(axis=1)
        right_padded = np.arange(mask.shape[1]) < lengths[:, None]
        if not np.array_equal(mask, right_padded):
            row = int(np.flatnonzero((mask != right_padded).any(axis=1))[0])
            raise ValueError(
                f"padded batch row {row}: attention_mask is not right-padded (ones then "
                f"zeros); the target needs each row's real tokens first"
            )
        if input_ids.size and (input_ids.min() < 0 or input_ids.max() >= self.vocab_size):
            raise ValueError(
                f"padded batch: token ids must lie in 0..{self.vocab_size - 1} (the target's "
                f"vocabulary), got {input_ids.min()}..{input_ids.max()}; was the data "
                f"tokenized with this target's tokenizer?"
            )

    def _new_set(self, capacity: int) -> _StagedBatch:
        pin = self._cuda
        host_ids = torch.empty(capacity, dtype=torch.int32, pin_memory=pin)
        host_index = torch.empty(capacity, dtype=torch.int64, pin_memory=pin)
        if not self._cuda:
            return _StagedBatch(host_ids, host_index, host_ids, host_index, None, None)
        return _StagedBatch(
            host_ids,
            host_index,
            torch.empty(capacity, dtype=torch.int32, device=self.device),
            torch.empty(capacity, dtype=torch.int64, device=self.device),
            torch.cuda.Event(),
            torch.cuda.Event(),
        )

    def _grown(self, staged: _StagedBatch, padded: int) -> _StagedBatch:
        """A larger replacement for ``staged`` (rare: only while new batch shapes appear).

        The device is synchronised first, so no pending copy or forward still uses the
        buffers being freed.
        """
        if self._cuda:
            torch.cuda.synchronize(self.device)
        return self._new_set(max(padded, 2 * staged.host_ids.numel()))
