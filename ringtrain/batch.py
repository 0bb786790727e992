"""The packed batch, declared once: what a target hands a drafter through the ring.

One packed batch is documents back to back. Its arrays, in slot order, are the token
arrays the data pipeline builds (`TOKEN_ARRAYS`: per token, or per document boundary)
and the tapped hidden states the target writes (`HIDDEN`, K * H values per token in the
run's dtype, last: the part of a slot an item uses is then one prefix). Everything else
is derived from this list: the data pipeline's buffers (data/batching.py), the ring's
slot layout and views (`slot_fields` feeds RingSpec.fields; the ring itself knows no
field name), what the target loop fills and what the drafter reads (`PackedRows`).

This module imports neither numpy nor torch: dtypes are named ("int32"), as both spell them.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec

# A field has one row per token, or one per document boundary (documents + 1 rows).
Per = Literal["token", "document"]


class BatchField(msgspec.Struct, frozen=True, array_like=True):
    """One array of a packed batch: its name, element dtype, rows and values per row."""

    name: str
    dtype: str
    per: Per
    width: int = 1


TOKEN_ARRAYS: tuple[BatchField, ...] = (
    BatchField("input_ids", "int32", "token"),
    BatchField("loss_mask", "uint8", "token"),
    BatchField("position_ids", "int32", "token"),  # restart at 0 in every document
    BatchField("cu_seqlens", "int32", "document"),  # document boundaries, from 0 to N
)
# The target's tapped hidden states: num_taps * hidden_size values per token.
HIDDEN = "hidden"


def slot_fields(num_taps: int, hidden_size: int, hidden_dtype: str) -> tuple[BatchField, ...]:
    """Every array of a ring slot, in slot order: the token arrays, then the hidden rows."""
    return (*TOKEN_ARRAYS, BatchField(HIDDEN, hidden_dtype, "token", num_taps * hidden_size))


class PackedRows(Protocol):
    """One packed batch as a ring slot carries it (the ring's ReadItem is one).

    Every field of `slot_fields`, as an attribute: hidden [>= num_tokens, K*H] (bf16 on
    GPU), the token arrays with the dtypes of TOKEN_ARRAYS, cu_seqlens [>= num_docs + 1];
    only the first num_tokens rows are read."""

    num_tokens: int
    num_docs: int

    def __getattr__(self, name: str) -> Any: ...
