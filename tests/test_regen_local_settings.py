"""regenerate --local's settings, before anything is written (data/regen_local.py,
`prepare_local`): what it refuses by name, the device's defaults it fills in, the context's
and the memory's bounds, and the failure a conversation learns when generation runs out of
memory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from ringtrain.data.errors import DatasetError
from ringtrain.data.regen_client import Sampling
from ringtrain.data.regen_local import LocalEngine, _failure, prepare_local
from ringtrain.generate.defaults import CPU_MAX_TOKENS, REGENERATE_CPU_BATCH_SIZE
from tests.helpers.word_chat_model import build_word_chat_model

CONTEXT = 4096  # the word chat model's max_position_embeddings


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LocalEngine:
    return LocalEngine(build_word_chat_model(tmp_path_factory.mktemp("word-chat")), "cpu")


@pytest.mark.parametrize(
    ("engine_change", "sampling_change", "message"),
    [
        ({}, {"max_tokens": 0}, "--local needs --max-tokens of at least 1, not 0"),
        ({}, {"temperature": -0.5}, "--temperature -0.5 / --top-p 1.0: the temperature must"),
        ({}, {"top_p": 0.0}, "--temperature 0.0 / --top-p 0.0: the temperature must"),
        ({"device": "tpu"}, {}, "--device 'tpu' / --dtype 'auto': choose --device from auto"),
        ({"dtype": "int8"}, {}, "--device 'cpu' / --dtype 'int8': choose --device from auto"),
        ({"batch_size": -1}, {}, "--batch-size must be at least 1, not -1"),
        ({"threads": -2}, {}, "--threads must be at least 1, not -2"),
        ({}, {"max_tokens": CONTEXT + 1},
         f"--max-tokens {CONTEXT + 1} is more than the model's context of {CONTEXT} tokens"),
        ({"memory_limit": 1024}, {},
         "one answer of 512 tokens needs 423.77 KiB (its KV cache and the prompt's forward) and "
         "generation may use 1.00 KiB: lower --max-tokens"),
    ],
)  # fmt: skip
def test_a_setting_local_generation_cannot_use_is_refused_by_name(
    engine: LocalEngine,
    engine_change: dict[str, Any],
    sampling_change: dict[str, Any],
    message: str,
) -> None:
    sampling = replace(Sampling("local", max_tokens=None), **sampling_change)
    with pytest.raises(DatasetError) as refusal:
        prepare_local(replace(engine, **engine_change), sampling)
    assert message in str(refusal.value)


def test_a_cpu_run_gets_the_cpus_defaults_and_keeps_what_was_given(engine: LocalEngine) -> None:
    filled, sampling = prepare_local(engine, Sampling("local", max_tokens=None))
    assert (filled.batch_size, sampling.max_tokens) == (REGENERATE_CPU_BATCH_SIZE, CPU_MAX_TOKENS)
    given = replace(engine, batch_size=3)
    filled, sampling = prepare_local(given, Sampling("local", max_tokens=CONTEXT))
    assert (filled, sampling.max_tokens) == (given, CONTEXT)  # the whole context is allowed


def test_running_out_of_memory_is_named_with_what_to_lower() -> None:
    for error in (
        torch.OutOfMemoryError("CUDA out of memory"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 GB"),
    ):
        failure = _failure(error)
        assert isinstance(failure, DatasetError)
        assert "out of memory while generating; the records written are kept" in str(failure)
        assert "smaller --batch-size" in str(failure)
    other = ValueError("something else")
    assert _failure(other) is other


def test_the_model_directory_is_named_when_it_is_not_one(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=f"--local {tmp_path / 'nothing'}: no such directory"):
        prepare_local(LocalEngine(tmp_path / "nothing", "cpu"), Sampling("local"))
