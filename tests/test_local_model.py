"""A local model for generation (generate/local_model.py): the CPU threads it takes beside
other processes, the context a config gives, the answer length a device gets by default,
the tokenizer of a model directory, the device it resolves, and what `LocalModel.load`
makes of the device, dtype and batch size it is given and of the config's pad id."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlavaConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from ringtrain.generate.defaults import (
    CPU_BATCH_SIZE,
    CPU_MAX_TOKENS,
    GPU_BATCH_SIZE,
    GPU_MAX_TOKENS,
)
from ringtrain.generate.local_model import (
    LocalModel,
    context_length,
    default_batch_size,
    default_cpu_threads,
    default_max_tokens,
    load_tokenizer,
    resolve_device,
)

WORDS = ["<pad>", "<unk>", "</s>", "<eot>", *(f"w{i}" for i in range(28))]
END_ID = WORDS.index("</s>")
TURN_END_ID = WORDS.index("<eot>")
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def write_model(directory: Path, pad_id: int | None, tokenizer: bool = True) -> Path:
    """A one-layer Qwen3 over `WORDS` (context 600), with its word tokenizer or none."""
    config = Qwen3Config(
        vocab_size=len(WORDS),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=600,
        pad_token_id=pad_id,
        eos_token_id=END_ID,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(directory)
    if tokenizer:
        backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, "<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(
            tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="</s>"
        ).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("local-model"), pad_id=0)


@pytest.mark.parametrize(
    ("load", "threads"), [(0.0, 8), (0.9, 8), (2.7, 6), (7.99, 1), (8.0, 1), (13.5, 1)]
)
def test_the_cpu_threads_are_the_usable_cores_less_the_busy_ones_and_at_least_one(
    monkeypatch: pytest.MonkeyPatch, load: float, threads: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the machine's, not this process's
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    assert default_cpu_threads() == threads


def test_the_context_is_the_text_models_positions_or_none() -> None:
    assert context_length(Qwen3Config(max_position_embeddings=600)) == 600
    # A multimodal config keeps the positions in its text config, not on itself.
    vision = LlavaConfig(text_config={"model_type": "llama", "max_position_embeddings": 2048})
    assert getattr(vision, "max_position_embeddings", None) is None
    assert context_length(vision) == 2048
    assert context_length(object()) is None


@pytest.mark.parametrize(
    ("device", "context", "tokens"),
    [
        (CPU, None, CPU_MAX_TOKENS),
        (CUDA, None, GPU_MAX_TOKENS),
        (CPU, 32768, CPU_MAX_TOKENS),
        (CUDA, 32768, GPU_MAX_TOKENS),
        (CPU, 600, 300),
        (CUDA, 4096, 2048),
        (CUDA, 4097, 2048),
        (CPU, 1, 1),
    ],
)
def test_the_default_answer_length_is_the_devices_and_at_most_half_the_context(
    device: torch.device, context: int | None, tokens: int
) -> None:
    assert default_max_tokens(device, context) == tokens


def test_a_model_directory_has_a_tokenizer_when_it_has_either_tokenizer_file(
    tmp_path: Path, model_dir: Path
) -> None:
    without = write_model(tmp_path / "without", pad_id=0, tokenizer=False)
    assert load_tokenizer(without) is None
    assert LocalModel.load(without, "cpu").tokenizer is None
    only_json = tmp_path / "only-json"
    only_json.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (only_json / name).write_bytes((model_dir / name).read_bytes())
    tokenizer = load_tokenizer(only_json)
    assert tokenizer is not None
    assert tokenizer.convert_tokens_to_ids("w3") == WORDS.index("w3")


def test_auto_is_the_gpu_when_there_is_one_and_cuda_needs_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == CUDA
    assert resolve_device("cuda") == CUDA
    assert resolve_device("cpu") == CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == CPU
    with pytest.raises(ValueError, match=r"device 'cuda' asked for, but torch .* sees no CUDA"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="device 'mps' is not one of auto, cpu, cuda"):
        resolve_device("mps")
    assert (default_batch_size(CPU), default_batch_size(CUDA)) == (CPU_BATCH_SIZE, GPU_BATCH_SIZE)


def test_load_keeps_the_dtype_and_batch_size_given_else_the_devices(model_dir: Path) -> None:
    given = LocalModel.load(model_dir, "cpu", "bfloat16", batch_size=5, max_batch_tokens=99)
    assert next(given.model.parameters()).dtype == torch.bfloat16
    assert (given.batch_size, given.max_batch_tokens) == (5, 99)
    assert given.tokenizer is not None
    default = LocalModel.load(model_dir, "cpu")
    assert next(default.model.parameters()).dtype == torch.float32
    assert default.batch_size == CPU_BATCH_SIZE
    assert not default.model.training


def test_the_pad_id_is_the_configs_even_0_else_the_first_stop_id(
    tmp_path: Path, model_dir: Path
) -> None:
    local = LocalModel.load(model_dir, "cpu", "float32")
    assert (local.pad_id, local.stop_ids) == (0, [END_ID])
    unpadded = write_model(tmp_path / "unpadded", pad_id=None)
    local = LocalModel.load(unpadded, "cpu", "float32")
    local.model.generation_config.eos_token_id = [TURN_END_ID, END_ID]
    assert local.stop_ids == [END_ID, TURN_END_ID]  # the generation config's end of turn too
    assert local.pad_id == END_ID
