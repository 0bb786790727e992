"""The packed batch as declared once (ringtrain/batch.py): a ring slot carries exactly the
arrays, dtypes and shapes of the batches a drafter compiles on, and a packed batch a target
writes into a slot reaches the drafter whole."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ringtrain.batch import HIDDEN, TOKEN_ARRAYS, slot_fields
from ringtrain.packed_batch import PackedBatch, random_packed_batch
from tests.helpers import ring_workers as rw

DOC_LENS = [3, 5, 2]


def tensors(batch: PackedBatch) -> dict[str, torch.Tensor]:
    return {
        f.name: getattr(batch, f.name)
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }


@pytest.mark.parametrize(("taps", "hidden", "dtype"), [(2, 4, "bfloat16"), (1, 3, "float32")])
def test_a_slot_has_the_arrays_of_the_batches_a_drafter_compiles_on(
    taps: int, hidden: int, dtype: str
) -> None:
    """Names, dtypes, rows (per token, or documents + 1) and values per row of every slot
    field match random_packed_batch's tensors: a batch from the ring is the same graph."""
    batch = random_packed_batch(DOC_LENS, taps * hidden, 100, "cpu", getattr(torch, dtype), 0)
    fields = slot_fields(taps, hidden, dtype)
    assert fields[-1].name == HIDDEN and fields[:-1] == TOKEN_ARRAYS
    arrays = tensors(batch)
    assert sorted(f.name for f in fields) == sorted(arrays)
    for f in fields:
        rows = batch.num_tokens if f.per == "token" else batch.num_docs + 1
        shape = (rows,) if f.width == 1 else (rows, f.width)
        assert (arrays[f.name].dtype, tuple(arrays[f.name].shape)) == (
            getattr(torch, f.dtype),
            shape,
        ), f.name
    assert batch.cu_seqlens.dtype == torch.int32  # flash-attention's varlen kernels take int32


def test_a_packed_batch_written_into_a_slot_reaches_the_drafter_whole() -> None:
    """A target fills a slot of an in-process CPU ring with a packed batch of three documents
    in bfloat16; the drafter's item has every array with its rows, values and dtype."""
    batch = random_packed_batch(DOC_LENS, 2 * 4, 100, "cpu", torch.bfloat16, 1)
    rings = rw.in_process_ranks(1, 1, fields=slot_fields(2, 4, "bfloat16"))
    try:
        producer, consumer = rings[0].producer(), rings[1].consumer()
        slot = producer.acquire()
        for name, array in tensors(batch).items():
            slot.arrays[name][: len(array)].copy_(array)
        producer.publish(slot, batch.num_tokens, batch.num_docs, {"seq": 0})
        item = consumer.take(timeout=10)
        assert (item.num_tokens, item.num_docs) == (batch.num_tokens, batch.num_docs)
        for name, array in tensors(batch).items():
            got = getattr(item, name)
            assert got.dtype == array.dtype and torch.equal(got, array), name
    finally:
        rw.close_ranks(rings)
