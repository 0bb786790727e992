"""The target runner on CPU: the device it runs on, the prefetch/forward pairing, the
batches it refuses (and the row it names), and token ids of a real-sized vocabulary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel

from ringtrain.target.loader import load_target
from ringtrain.target.runner import TargetRunner
from ringtrain.target.tapped import TappedTarget
from ringtrain.target.tiny import build_tiny_target

# Past 32767: a real target's vocabulary (Qwen's has 151,936 ids) is wider than 16 bits.
VOCAB_SIZE = 33_000


class Batch:
    """A padded batch as the data pipeline hands it over."""

    def __init__(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        self.input_ids = input_ids
        self.attention_mask = attention_mask


def right_padded(docs: list[list[int]], width: int) -> Batch:
    ids = np.zeros((len(docs), width), dtype=np.int64)
    mask = np.zeros((len(docs), width), dtype=np.int64)
    for row, doc in enumerate(docs):
        ids[row, : len(doc)] = doc
        mask[row, : len(doc)] = 1
    return Batch(ids, mask)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dense target with a vocabulary wider than 16 bits."""
    root = tmp_path_factory.mktemp("runner")
    return build_tiny_target(
        root / "dense", vocab_size=VOCAB_SIZE, hidden_size=32, num_layers=4, hybrid=False
    )


@pytest.fixture(scope="module")
def target(target_dir: Path) -> TappedTarget:
    return load_target(target_dir, tap_layers=[0, 1], device="cpu")


def taps(runner: TargetRunner, batch: Batch) -> torch.Tensor:
    rows = runner.prefetch(batch)
    out = torch.full((rows, len(runner.tap_layers) * runner.hidden_size), float("nan"))
    runner.forward_into(out)
    return out


def test_the_runner_runs_on_its_target_s_device_only(target: TappedTarget) -> None:
    assert TargetRunner(target, "cpu").device == torch.device("cpu")
    assert TargetRunner(target).device == torch.device("cpu")
    with pytest.raises(ValueError, match=r"TargetRunner on meta for a target loaded on cpu"):
        TargetRunner(target, "meta")


def test_each_forward_needs_its_own_prefetched_batch(target: TappedTarget) -> None:
    runner = TargetRunner(target)
    out = torch.empty(3, 2 * target.hidden_size)
    with pytest.raises(RuntimeError, match=r"without a prefetched batch; call prefetch first"):
        runner.forward_into(out)
    assert runner.prefetch(right_padded([[5, 6, 7]], width=4)) == 3
    runner.forward_into(out)
    with pytest.raises(RuntimeError, match=r"call prefetch first"):
        runner.forward_into(out)


@pytest.mark.parametrize(
    ("input_ids", "attention_mask", "reason"),
    [
        (np.array([1, 2, 3]), np.array([1, 1, 1]), r"input_ids \(3,\) and attention_mask \(3,\)"),
        (np.ones((2, 3), np.int64), np.ones((2, 4), np.int64), r"must both be \[B, L\]"),
        (np.ones((1, 3)), np.ones((1, 3), np.int64), r"input_ids must be integers, got float64"),
        (np.array([[4, -1, 2]]), np.ones((1, 3), np.int64), r"token ids must lie in 0\.\.32999"),
        (np.array([[4, VOCAB_SIZE]]), np.ones((1, 2), np.int64), r"got 4\.\.33000"),
    ],
    ids=["one-dimensional", "mask-of-another-shape", "float-ids", "negative-id", "id-past-end"],
)
def test_malformed_batches_are_refused_with_the_reason(
    target: TappedTarget, input_ids: np.ndarray, attention_mask: np.ndarray, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        TargetRunner(target).prefetch(Batch(input_ids, attention_mask))


def test_the_first_row_that_is_not_right_padded_is_named(target: TappedTarget) -> None:
    batch = right_padded([[1, 2, 3], [4, 5], [6]], width=3)
    batch.attention_mask[1] = [0, 1, 1]  # left-padded
    batch.attention_mask[2] = [1, 0, 1]  # a hole
    with pytest.raises(ValueError, match=r"padded batch row 1: attention_mask is not right-pad"):
        TargetRunner(target).prefetch(batch)


def test_packed_rows_follow_the_documents_in_row_order(
    target: TappedTarget, target_dir: Path
) -> None:
    """Ids past 32767 reach the target intact, and the packed rows are each document's
    real tokens in turn, equal to the full model's hidden states after the tapped layers."""
    docs = [[VOCAB_SIZE - 1, 40_000 - 7_500, 256, 12], [32_768, 7], [1, 32_767, 2]]
    batch = right_padded(docs, width=5)
    out = taps(TargetRunner(target), batch)
    assert out.shape == (sum(map(len, docs)), 2 * target.hidden_size)
    model = AutoModel.from_pretrained(target_dir, local_files_only=True, dtype=torch.float32)
    start, hidden = 0, target.hidden_size
    for doc in docs:
        with torch.no_grad():
            states = model.eval()(input_ids=torch.tensor([doc]), output_hidden_states=True)
        for k, layer in enumerate(target.tap_layers):
            expected = states.hidden_states[layer + 1][0]
            got = out[start : start + len(doc), k * hidden : (k + 1) * hidden]
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        start += len(doc)
