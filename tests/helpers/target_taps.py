"""The taps a target directory's loaded target writes for one random sequence, on the CPU:
what tests compare between two layouts or encodings of the same weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ringtrain.target.loader import load_target
from ringtrain.target.runner import TargetRunner


def cpu_taps(directory: Path, taps: list[int], vocab: int, length: int = 17) -> torch.Tensor:
    """The taps of one `length`-token sequence of ids below `vocab`, float32."""
    target = load_target(directory, tap_layers=taps, device="cpu", dtype="float32")
    runner = TargetRunner(target)
    ids = np.random.default_rng(0).integers(1, vocab, size=(1, length))

    class Batch:
        input_ids = ids
        attention_mask = np.ones_like(ids)

    out = torch.empty(runner.prefetch(Batch()), target.tap_width)
    runner.forward_into(out)
    return out
