"""What a target rank publishes with each batch on the ring, read back by the drafters."""

from __future__ import annotations

import enum

import msgspec


class BatchKind(enum.IntEnum):
    """A training batch, or a batch of the held-out split (trainer/heldout.py)."""

    TRAIN = 0
    EVAL = 1


class BatchMeta(msgspec.Struct, frozen=True, kw_only=True):
    """The identity of one published batch."""

    batch_id: int  # the batch's id in its dataset epoch (data.Batch.batch_id)
    epoch: int
    seq: int  # the batch's place in its target's stream (what the ledger records)
    producer: int  # the target's index among all target ranks
    kind: BatchKind = BatchKind.TRAIN
    round: int = 0  # the evaluation round of an EVAL batch
