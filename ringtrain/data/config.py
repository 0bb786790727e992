"""Configuration of the data pipeline ([data] in the TOML config)."""

from __future__ import annotations

from typing import Annotated

import msgspec

Positive = Annotated[int, msgspec.Meta(ge=1)]


class DataConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Dataset location and token-budget batching."""

    # Arrow / parquet dataset directory. Empty: the built-in synthetic dataset.
    path: str = ""
    # Held-out split (a separate directory). Empty: no evaluation data.
    eval_path: str = ""
    # Tokens per batch (real tokens; padding is not counted).
    token_budget: Positive = 16384
    # Longest row, in tokens (see truncate).
    max_len: Positive = 4096
    # Cut rows longer than max_len; if false, such a row is an error.
    truncate: bool = True
    # Padded batch lengths are rounded up to a multiple of this. A row's padding is its
    # rounding only (batches group rows of one padded length), about bucket / 2 tokens:
    # 32 keeps padding near 1.6% for ~1000-token rows (128 would cost ~6%).
    bucket: Positive = 32
    # Seeds the batch order (with the epoch); anchors have their own seed, run.seed.
    seed: Annotated[int, msgspec.Meta(ge=0)] = 0
