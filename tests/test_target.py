"""Target side on CPU: tap spread, loading and truncation, tapped outputs, errors."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModel

from ringtrain.generate.model import load_causal_lm
from ringtrain.target.loader import load_target
from ringtrain.target.model_dir import TargetLoadError
from ringtrain.target.runner import TargetRunner
from ringtrain.target.structure import read_target_config
from ringtrain.target.taps import check_tap_layers, default_tap_layers
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.tiny_families import record_handed_keys

NUM_LAYERS = 8
DOC_LENGTHS = (37, 5, 64, 20)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """Tiny hybrid (True) and dense (False) targets on disk."""
    root = tmp_path_factory.mktemp("targets")
    return {
        hybrid: build_tiny_target(root / f"hybrid{int(hybrid)}", seed=3, hybrid=hybrid)
        for hybrid in (True, False)
    }


class Padded:
    """A right-padded batch of documents, as the data pipeline hands it over."""

    def __init__(self, docs: list[np.ndarray], width: int) -> None:
        self.input_ids = np.zeros((len(docs), width), dtype=np.int64)
        self.attention_mask = np.zeros((len(docs), width), dtype=np.int64)
        for row, doc in enumerate(docs):
            self.input_ids[row, : len(doc)] = doc
            self.attention_mask[row, : len(doc)] = 1


def make_docs(seed: int, lengths: tuple[int, ...], vocab_size: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=n) for n in lengths]


def run_taps(
    runner: TargetRunner, batch: Padded, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    rows = runner.prefetch(batch)
    out = torch.full((rows, len(runner.tap_layers) * runner.hidden_size), float("nan"), dtype=dtype)
    runner.forward_into(out)
    return out


def full_model(path: Path) -> torch.nn.Module:
    return AutoModel.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()


@pytest.mark.parametrize(
    ("num_layers", "k", "expected"),
    [(36, 5, [1, 9, 17, 25, 33]), (8, 5, [1, 2, 3, 4, 5]), (64, 5, [1, 16, 31, 46, 61])],
)
def test_default_tap_layers_known_values(num_layers: int, k: int, expected: list[int]) -> None:
    assert default_tap_layers(num_layers, k) == expected


@pytest.mark.parametrize(("num_layers", "k"), [(28, 5), (48, 3), (40, 7), (64, 6)])
def test_default_tap_layers_follow_formula(num_layers: int, k: int) -> None:
    spread = default_tap_layers(num_layers, k)
    assert spread == [round(1 + i * (num_layers - 4) / (k - 1)) for i in range(k)]
    assert spread[0] == 1 and spread[-1] == num_layers - 3


def test_default_tap_layers_rejects_too_many_taps() -> None:
    with pytest.raises(ValueError, match=r"lower target\.num_taps to at most 5"):
        default_tap_layers(8, 6)


def test_default_tap_layers_of_one_tap_and_of_the_smallest_target() -> None:
    """One tap is layer 1 at any depth; a 4-layer target takes one tap (layers 1..L-3 is
    layer 1 alone), not two; fewer than 4 layers have no spread."""
    assert default_tap_layers(36, 1) == [1]
    assert default_tap_layers(4, 1) == [1]
    with pytest.raises(ValueError, match=r"2 taps do not fit between layers 1 and 1"):
        default_tap_layers(4, 2)
    with pytest.raises(ValueError, match=r"at least 4 layers, this one has 3"):
        default_tap_layers(3, 1)


def test_listed_tap_layers_keep_their_order_and_refuse_negatives_and_repeats() -> None:
    assert check_tap_layers([5, 0, 7], 8, "t") == [5, 0, 7]
    with pytest.raises(ValueError, match=r"t: tapped layer -1 is out of range"):
        check_tap_layers([2, -1], 8, "t")
    with pytest.raises(ValueError, match=r"t: tapped layers \[2, 4, 2\] repeat an index"):
        check_tap_layers([2, 4, 2], 8, "t")


@pytest.mark.parametrize("taps", [[1, 3, 6], [6, 0, NUM_LAYERS - 1]])
@pytest.mark.parametrize("hybrid", [True, False])
def test_taps_equal_full_model_hidden_states(
    tiny_dirs: dict[bool, Path], hybrid: bool, taps: list[int]
) -> None:
    """Tap k's columns hold hidden_states[layer + 1] of the k-th listed layer, in the
    listed order; a tap of the last layer is taken after the final norm, as HF's last
    hidden state."""
    target = load_target(tiny_dirs[hybrid], tap_layers=taps, device="cpu")
    assert target.tap_layers == taps
    runner = TargetRunner(target)
    docs = make_docs(0, DOC_LENGTHS, target.vocab_size)
    batch = Padded(docs, width=128)
    out = run_taps(runner, batch)

    with torch.no_grad():
        reference = full_model(tiny_dirs[hybrid])(
            input_ids=torch.from_numpy(batch.input_ids),
            attention_mask=torch.from_numpy(batch.attention_mask),
            output_hidden_states=True,
        ).hidden_states
    real = torch.from_numpy(batch.attention_mask.reshape(-1).astype(bool))
    hidden = target.hidden_size
    for k, layer in enumerate(target.tap_layers):
        expected = reference[layer + 1].reshape(-1, hidden)[real]
        torch.testing.assert_close(
            out[:, k * hidden : (k + 1) * hidden], expected, atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("hybrid", [True, False])
def test_padded_rows_equal_documents_run_alone(tiny_dirs: dict[bool, Path], hybrid: bool) -> None:
    target = load_target(tiny_dirs[hybrid], num_taps=3, device="cpu")
    runner = TargetRunner(target)
    docs = make_docs(1, DOC_LENGTHS, target.vocab_size)
    packed = run_taps(runner, Padded(docs, width=128))
    start = 0
    for doc in docs:
        alone = run_taps(runner, Padded([doc], width=len(doc)))
        torch.testing.assert_close(packed[start : start + len(doc)], alone, atol=1e-5, rtol=0)
        start += len(doc)
    assert start == packed.shape[0]


def test_runner_alternates_buffers_and_grows(tiny_dirs: dict[bool, Path]) -> None:
    """Batches of growing shapes, each prefetched while the previous one is pending."""
    target = load_target(tiny_dirs[True], num_taps=2, device="cpu")
    runner = TargetRunner(target)
    batches = [
        Padded(make_docs(seed, lengths, target.vocab_size), width=width)
        for seed, lengths, width in [(2, (9, 3), 16), (3, (40, 30, 12), 64), (4, (100,), 128)]
    ]
    expected = [run_taps(TargetRunner(target), b) for b in batches]
    rows = runner.prefetch(batches[0])
    for i in range(len(batches)):
        out = torch.empty(rows, target.tap_width)
        runner.forward_into(out)
        if i + 1 < len(batches):
            rows = runner.prefetch(batches[i + 1])
        torch.testing.assert_close(out, expected[i], atol=0, rtol=0)


def test_targets_and_generating_models_load_without_hub_kernels(
    tiny_dirs: dict[bool, Path],
) -> None:
    """transformers (5.23 and newer, with its kernels dependency) would swap layers' code
    for kernels fetched from the model hub as a model loads: ringtrain's own kernels run,
    offline."""
    target = load_target(tiny_dirs[False], num_taps=2, device="cpu")
    assert getattr(target.module, "use_kernels", False) is False
    assert getattr(load_causal_lm(tiny_dirs[False]), "use_kernels", False) is False


def test_bf16_output_from_float32_target(tiny_dirs: dict[bool, Path]) -> None:
    target = load_target(tiny_dirs[True], num_taps=2, device="cpu")
    runner = TargetRunner(target)
    batch = Padded(make_docs(5, (12, 7), target.vocab_size), width=16)
    as_bf16 = run_taps(runner, batch, dtype=torch.bfloat16)
    torch.testing.assert_close(as_bf16, run_taps(runner, batch).to(torch.bfloat16))


def test_truncation_keeps_only_layers_up_to_deepest_tap(
    tiny_dirs: dict[bool, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    handed = record_handed_keys(monkeypatch)
    path = tiny_dirs[True]
    target = load_target(path, tap_layers=[4, 1], device="cpu")

    assert len(target.module.layers) == 5
    assert target.module.config.layer_types == target.config.layer_types[:5]
    assert target.num_layers == NUM_LAYERS and target.tap_layers == [4, 1]
    assert not hasattr(target.module, "lm_head")
    assert isinstance(target.module.norm, torch.nn.Identity)
    assert all(not p.requires_grad for p in target.module.parameters())
    kept = ("model.embed_tokens.", *(f"model.layers.{i}." for i in range(5)))
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        stored_keys = handle.keys()
        kept_keys = [key for key in stored_keys if key.startswith(kept)]
        expected_params = sum(math.prod(handle.get_slice(key).get_shape()) for key in kept_keys)
    assert sorted(handed) == sorted(key.removeprefix("model.") for key in kept_keys)
    assert sum(p.numel() for p in target.module.parameters()) == expected_params


def test_multimodal_layout_with_sharded_index(tiny_dirs: dict[bool, Path], tmp_path: Path) -> None:
    """Text config under text_config, weights under model.language_model., two shards."""
    plain = tiny_dirs[True]
    nested = tmp_path / "nested"
    nested.mkdir()
    text_config = json.loads((plain / "config.json").read_text())
    (nested / "config.json").write_text(
        json.dumps({"model_type": "qwen3_5", "text_config": text_config})
    )
    with safe_open(str(plain / "model.safetensors"), framework="pt") as handle:
        stored_keys = handle.keys()
        tensors = {
            key.replace("model.", "model.language_model.", 1): handle.get_tensor(key)
            for key in stored_keys
        }
    tensors["model.visual.patch_embed.weight"] = torch.zeros(2, 2)
    keys = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": keys[::2],
        "model-00002-of-00002.safetensors": keys[1::2],
    }
    for name, shard_keys in shards.items():
        save_file({key: tensors[key] for key in shard_keys}, str(nested / name))
    weight_map = {key: name for name, shard_keys in shards.items() for key in shard_keys}
    (nested / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    config = read_target_config(nested)
    assert (config.model_type, config.num_hidden_layers) == ("qwen3_5_text", NUM_LAYERS)
    batch = Padded(make_docs(6, (30, 11), 512), width=32)
    from_nested = run_taps(TargetRunner(load_target(nested, num_taps=3)), batch)
    from_plain = run_taps(TargetRunner(load_target(plain, num_taps=3)), batch)
    torch.testing.assert_close(from_nested, from_plain, atol=0, rtol=0)


def test_error_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(TargetLoadError, match=r"does not exist; set target.path"):
        load_target(tmp_path / "absent")


def test_error_no_config(tmp_path: Path) -> None:
    with pytest.raises(TargetLoadError, match=r"no config.json"):
        load_target(tmp_path)


def test_error_no_weights(tiny_dirs: dict[bool, Path], tmp_path: Path) -> None:
    shutil.copy(tiny_dirs[False] / "config.json", tmp_path / "config.json")
    with pytest.raises(TargetLoadError, match=r"no weights \(\*\.safetensors\) found"):
        load_target(tmp_path)


def test_error_tap_out_of_range(tiny_dirs: dict[bool, Path]) -> None:
    with pytest.raises(
        ValueError, match=r"tapped layer 8 is out of range.*valid indices are 0\.\.7"
    ):
        load_target(tiny_dirs[False], tap_layers=[2, 8])


def test_error_model_without_decoder_layers(tiny_dirs: dict[bool, Path], tmp_path: Path) -> None:
    config = json.loads((tiny_dirs[False] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    shutil.copy(tiny_dirs[False] / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(
        TargetLoadError,
        match=r"model type 'gpt2' \(GPT2Model\) cannot be a target: it lacks 'layers'",
    ):
        load_target(tmp_path)


def test_error_model_type_unknown_to_transformers(
    tiny_dirs: dict[bool, Path], tmp_path: Path
) -> None:
    config = json.loads((tiny_dirs[False] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "qwen9_future"}))
    shutil.copy(tiny_dirs[False] / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(
        TargetLoadError, match=r"'qwen9_future' is unknown to the installed transformers; upgrade"
    ):
        read_target_config(tmp_path)


def test_error_left_padded_batch(tiny_dirs: dict[bool, Path]) -> None:
    runner = TargetRunner(load_target(tiny_dirs[False], num_taps=2))
    batch = Padded(make_docs(7, (4, 6), 512), width=6)
    batch.attention_mask[0] = [0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match=r"row 0: attention_mask is not right-padded"):
        runner.prefetch(batch)


def test_error_token_outside_vocabulary(tiny_dirs: dict[bool, Path]) -> None:
    runner = TargetRunner(load_target(tiny_dirs[False], num_taps=2))
    batch = Padded([np.array([1, 2, 512])], width=4)
    with pytest.raises(ValueError, match=r"token ids must lie in 0\.\.511"):
        runner.prefetch(batch)


def test_tap_of_the_last_layer_warns_that_engines_cannot_serve_it(
    tiny_dirs: dict[bool, Path], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="ringtrain.target.loader"):
        target = load_target(tiny_dirs[False], tap_layers=[1, NUM_LAYERS - 1])
    assert not isinstance(target.module.norm, torch.nn.Identity)  # the tap is after it
    assert "tapping the last layer (7)" in caplog.text and "cannot serve" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="ringtrain.target.loader"):
        load_target(tiny_dirs[False], tap_layers=[1, NUM_LAYERS - 2])
    assert "tapping the last layer" not in caplog.text
