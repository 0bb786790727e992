"""Batch stream: budget bounds, packed/padded layout, determinism, sharding, resume."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from ringtrain.checkpoint.resume_record import (
    RESUME_FILE,
    ResumeRecord,
    StreamCursor,
    encode_resume_record,
    read_resume_record,
)
from ringtrain.data import (
    BatchStream,
    DatasetError,
    TokenDataset,
    open_dataset,
    write_synthetic_dataset,
)
from ringtrain.data.batching import BATCH_ID_STRIDE
from ringtrain.data.writer import TokenFileWriter
from ringtrain.trainer.ledger import BatchLedger

BUDGET, BUCKET, BLOCK = 2048, 32, 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> TokenDataset:
    directory = tmp_path_factory.mktemp("synthetic")
    write_synthetic_dataset(
        directory, rows=600, vocab_size=500, mean_len=200, seed=3, min_len=40, max_len=900
    )
    return open_dataset(directory, max_len=512, truncate=True, block_size=BLOCK, vocab_size=500)


def _stream(ds: TokenDataset, **kw) -> BatchStream:
    args = {"token_budget": BUDGET, "bucket": BUCKET, "seed": 7, "rank": 0, "world": 1} | kw
    return BatchStream(ds, **args)


def _row_tokens(ds: TokenDataset, row: int) -> tuple[np.ndarray, np.ndarray]:
    seg = ds.segments[ds.row_segment[row]]
    span = slice(ds.row_start[row], ds.row_start[row] + ds.row_length[row])
    return seg.input_ids[span], seg.loss_mask[span]


def _signature(batch) -> tuple:
    return (
        batch.batch_id,
        batch.epoch,
        batch.seq,
        batch.input_ids.tobytes(),
        batch.cu_seqlens.tobytes(),
    )


def _check_one_epoch(dataset: TokenDataset, stream: BatchStream) -> None:
    """Every batch of one epoch obeys the budget and layout; the epoch covers all rows."""
    # Index every row by its content, to check that batches hold whole dataset rows.
    rows = {_row_tokens(dataset, r)[0].tobytes(): r for r in range(dataset.num_rows)}
    seen = []
    for batch in islice(stream, stream.batches_per_epoch):
        padded = batch.padded()
        docs, width = padded.input_ids.shape
        assert docs == batch.num_docs <= stream.max_docs
        assert batch.num_tokens <= docs * width <= BUDGET
        assert width % BUCKET == 0
        cu = batch.cu_seqlens
        assert cu[0] == 0 and cu[-1] == batch.num_tokens and (np.diff(cu) > 0).all()
        assert batch.input_ids.dtype == np.int32 and batch.loss_mask.dtype == np.uint8
        assert batch.position_ids.dtype == np.int32 and cu.dtype == np.int32
        for d in range(docs):
            doc = slice(cu[d], cu[d + 1])
            row = rows[batch.input_ids[doc].tobytes()]
            np.testing.assert_array_equal(batch.loss_mask[doc], _row_tokens(dataset, row)[1])
            np.testing.assert_array_equal(batch.position_ids[doc], np.arange(cu[d + 1] - cu[d]))
            seen.append(row)
            # Padded row d: the document, right-padded; the mask marks it.
            length = cu[d + 1] - cu[d]
            np.testing.assert_array_equal(padded.input_ids[d, :length], batch.input_ids[doc])
            assert (
                padded.attention_mask[d, :length].all()
                and not padded.attention_mask[d, length:].any()
            )
            assert width - length < BUCKET  # a row's padding is only its rounding
        flat = padded.input_ids.reshape(-1)
        np.testing.assert_array_equal(flat[padded.token_index], batch.input_ids)
        assert padded.padding_fraction == pytest.approx(1 - batch.num_tokens / (docs * width))
    # One epoch on one rank covers every row exactly once.
    assert sorted(seen) == list(range(dataset.num_rows))


def test_batches_respect_budget_and_layout(dataset: TokenDataset) -> None:
    _check_one_epoch(dataset, _stream(dataset))


def test_batches_gather_across_files_and_record_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ringtrain.data.writer.MAX_BATCH_TOKENS", 3000)
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        lengths = rng.integers(40, 300, size=60)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        ids = rng.integers(0, 10**6, size=offsets[-1], dtype=np.int32)  # rows are distinct
        mask = (rng.random(offsets[-1]) < 0.8).astype(np.uint8)
        with TokenFileWriter(tmp_path / f"{name}.arrow") as writer:
            writer.write(offsets, ids, mask)
    ds = open_dataset(tmp_path, max_len=256, truncate=True, block_size=BLOCK)
    assert len(ds.segments) >= 8
    _check_one_epoch(ds, _stream(ds))


def test_same_seed_same_batches_and_epochs_reshuffle(dataset: TokenDataset) -> None:
    a, b = _stream(dataset), _stream(dataset)
    n = a.batches_per_epoch
    first = [_signature(x) for x in islice(a, 2 * n)]
    assert first == [_signature(x) for x in islice(b, 2 * n)]
    assert [s[1] for s in first] == [0] * n + [1] * n
    assert [s[0] for s in first[:n]] == list(range(n))
    assert [s[0] - BATCH_ID_STRIDE for s in first[n:]] == list(range(n))
    assert [s[3] for s in first[:n]] != [s[3] for s in first[n:]]  # a new order in epoch 1
    other = _stream(dataset, seed=8)
    assert [_signature(x)[3] for x in islice(other, n)] != [s[3] for s in first[:n]]


def test_shards_are_disjoint_and_cover_the_epoch(dataset: TokenDataset) -> None:
    world = 3
    streams = [_stream(dataset, rank=r, world=world) for r in range(world)]
    per_rank = streams[0].batches_per_rank
    assert per_rank == streams[0].batches_per_epoch // world
    ids = [[b.batch_id for b in islice(s, per_rank)] for s in streams]
    assert all(len(x) == per_rank for x in ids)
    union = sorted(i for x in ids for i in x)
    assert len(set(union)) == len(union) == per_rank * world
    assert union == list(range(per_rank * world))  # only the last n % world are dropped
    assert ids[1][:3] == [1, 1 + world, 1 + 2 * world]
    # The next batch of every rank is in epoch 1.
    assert all(next(s).epoch == 1 for s in streams)


def test_start_and_skip_reproduce_the_tail(dataset: TokenDataset) -> None:
    full = [_signature(b) for b in islice(_stream(dataset, rank=1, world=2), 30)]
    trained_out_of_order = {12, 15, 16}
    resumed = _stream(dataset, rank=1, world=2, start=10, skip=[3, *trained_out_of_order])
    tail = [_signature(b) for b in islice(resumed, 30 - 10 - len(trained_out_of_order))]
    assert tail == [s for s in full[10:] if s[2] not in trained_out_of_order]


def test_a_checkpoints_cursor_resumes_the_stream(dataset: TokenDataset, tmp_path: Path) -> None:
    """What a resumed target does: the ledger's cursor, through a checkpoint's resume
    record, starts a stream that yields exactly the batches not yet trained."""
    stream = _stream(dataset, rank=0, world=2)
    taken = [_signature(b) for b in islice(stream, 5)]
    ledger = BatchLedger()
    for seq in (0, 1, 2, 4):  # batch 3 was produced but not trained
        ledger.record(0, seq)
    (tmp_path / RESUME_FILE).write_bytes(
        encode_resume_record(ResumeRecord(step=4, cursors=ledger.cursors()))
    )
    cursor = read_resume_record(tmp_path).cursors[0]
    assert cursor == StreamCursor(start=3, skip=(4,))
    expected = [taken[3]] + [_signature(b) for b in islice(stream, 5)]
    resumed = _stream(dataset, rank=0, world=2, start=cursor.start, skip=cursor.skip)
    assert [_signature(b) for b in islice(resumed, 6)] == expected


def test_two_batches_stay_valid(dataset: TokenDataset) -> None:
    stream = _stream(dataset)
    current = next(stream)
    kept = current.copy()
    upcoming = next(stream)
    np.testing.assert_array_equal(current.input_ids, kept.input_ids)
    assert not np.shares_memory(current.input_ids, upcoming.input_ids)


def test_padded_with_another_bucket(dataset: TokenDataset) -> None:
    batch = next(_stream(dataset))
    padded = batch.padded(128)
    assert padded.input_ids.shape[1] % 128 == 0
    np.testing.assert_array_equal(padded.input_ids.reshape(-1)[padded.token_index], batch.input_ids)


def test_row_longer_than_budget_is_rejected(dataset: TokenDataset) -> None:
    with pytest.raises(DatasetError, match="does not fit the token budget of 256"):
        _stream(dataset, token_budget=256)


def test_too_few_batches_for_the_ranks(dataset: TokenDataset) -> None:
    with pytest.raises(DatasetError, match="cannot feed 100000 target ranks"):
        _stream(dataset, rank=0, world=100_000)


def test_padding_is_small_for_long_rows(tmp_path: Path) -> None:
    write_synthetic_dataset(tmp_path, rows=3000, vocab_size=1000, mean_len=1000, seed=0)
    ds = open_dataset(tmp_path, max_len=4096, truncate=True, block_size=16)
    stream = _stream(ds, token_budget=16384)
    real = cells = 0
    for batch in islice(stream, stream.batches_per_epoch):
        real += batch.num_tokens
        cells += batch.padded().input_ids.size
    assert 1 - real / cells < 0.03


def _docs(batch) -> frozenset[bytes]:
    """The documents of a batch, by content."""
    cu = batch.cu_seqlens
    return frozenset(batch.input_ids[cu[d] : cu[d + 1]].tobytes() for d in range(batch.num_docs))


def test_batches_of_all_lengths_are_interleaved(dataset: TokenDataset) -> None:
    """An epoch does not run from short rows to long ones: its batches are shuffled."""
    stream = _stream(dataset)
    widths = [b.padded().input_ids.shape[1] for b in islice(stream, stream.batches_per_epoch)]
    assert len(set(widths)) > 3
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)


def test_every_epoch_groups_the_rows_anew(dataset: TokenDataset) -> None:
    """Rows of one padded length are shuffled before they are cut into batches, so the
    batches of epoch 1 hold other row combinations than those of epoch 0."""
    stream = _stream(dataset)
    n = stream.batches_per_epoch
    first = {_docs(b) for b in islice(stream, n)}
    second = {_docs(b) for b in islice(stream, n)}
    assert len(first & second) < n // 2


def test_a_row_padded_to_exactly_the_budget_fits(tmp_path: Path) -> None:
    lengths = np.array([256, 40, 100, 64])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    with TokenFileWriter(tmp_path / "a.arrow") as writer:
        writer.write(
            offsets, np.arange(offsets[-1], dtype=np.int32), np.ones(offsets[-1], np.uint8)
        )
    ds = open_dataset(tmp_path, max_len=256, truncate=False, block_size=BLOCK)
    stream = _stream(ds, token_budget=256)
    batches = list(islice(stream, stream.batches_per_epoch))
    # 40 and 64 share a batch of width 64; 100 pads to 128; 256 fills a batch alone.
    assert sorted(b.num_tokens for b in batches) == [100, 104, 256]
