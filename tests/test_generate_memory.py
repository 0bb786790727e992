"""Generation's memory arithmetic (ringtrain/generate/memory.py): sizes as users write and
read them, what a CPU can still give under a cgroup limit, the budget, and a decode's
footprint from a model's config."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen3Config

from ringtrain.generate import memory
from ringtrain.generate.memory import (
    DecodeFootprint,
    available_memory,
    format_size,
    generation_budget,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "size"),
    [("512MiB", 512 << 20), ("4G", 4 << 30), ("1.5GB", 3 << 29), ("1000000", 1_000_000),
     (" 2 kib ", 2048), ("0.5t", 1 << 39), ("7b", 7)],
)  # fmt: skip
def test_a_size_is_read_in_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "problem"),
    [("lots", "'lots' is not a size; write it like 512MiB"), ("4 GiB free", "is not a size"),
     ("0", "'0' is not a positive size"), ("0.1b", "is not a positive size")],
)  # fmt: skip
def test_a_size_that_is_not_one_is_named(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as refusal:
        parse_size(text)
    assert problem in str(refusal.value)


def test_a_size_is_said_in_the_largest_unit_it_reaches() -> None:
    sizes = (1023, 1024, 1536, (1 << 20) - 1, 3 << 20, 1 << 30, (5 << 30) + (1 << 29))
    assert [format_size(n) for n in sizes] == [
        "1023 bytes", "1.00 KiB", "1.50 KiB", "1024.00 KiB", "3.00 MiB", "1.00 GiB", "5.50 GiB",
    ]  # fmt: skip


def _cgroup(tmp_path: Path, limit: str, usage: str) -> tuple[str, str]:
    """A cgroup's limit and usage files, in a directory of their own."""
    directory = tmp_path / f"cgroup-{limit}-{usage}"
    directory.mkdir()
    (directory / "memory.max").write_text(limit + "\n")
    (directory / "memory.current").write_text(usage + "\n")
    return str(directory / "memory.max"), str(directory / "memory.current")


def test_a_cpu_gives_what_its_cgroup_limit_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 8 << 30)
    missing = (str(tmp_path / "none.max"), str(tmp_path / "none.current"))
    limited = _cgroup(tmp_path, str(3 << 30), str(1 << 30))
    # cgroup v1's "no limit" is a huge number; v2's is "max": the next file's limit holds
    unlimited_v1 = _cgroup(tmp_path, "9223372036854771712", str(1 << 30))
    for files, available in (
        ((missing,), 8 << 30),
        ((missing, limited), 2 << 30),
        ((_cgroup(tmp_path, "max", "5"),), 8 << 30),
        ((unlimited_v1, limited), 2 << 30),
        ((_cgroup(tmp_path, "100", "500"),), 0),  # over its limit already
    ):
        monkeypatch.setattr(memory, "CGROUP_LIMITS", files)
        assert available_memory(cpu) == available, files


def test_the_budget_is_the_limit_given_or_a_share_of_what_is_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "available_memory", lambda _device: 10_000)
    cpu = torch.device("cpu")
    assert generation_budget(cpu) == int(memory.BUDGET_FRACTION * 10_000)
    assert generation_budget(cpu, limit=123) == 123


def test_a_decodes_footprint_follows_the_models_config() -> None:
    config = Qwen3Config(
        vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    )  # fmt: skip
    footprint = DecodeFootprint.of(config, torch.bfloat16)
    # 3 layers x keys and values x 2 heads x 32 x 2 bytes
    assert footprint.cache_per_position == 3 * 2 * 2 * 32 * 2
    assert footprint.activations_per_position == (4 * 64 + (4 + 2 * 2) * 32) * 2 + 3 * 96 * 2
    assert (footprint.score_bytes, footprint.logits_per_row) == (4 * 2, 3 * 1000 * 4)
    assert footprint.cache(rows=5, length=7) == 5 * 7 * footprint.cache_per_position
    forward = 2 * (
        9 * footprint.activations_per_position + 81 * (footprint.score_bytes + 1) + 12_000
    )
    assert footprint.prompt_forward(rows=2, width=9) == forward
    assert footprint.batch(rows=2, width=9, new_tokens=4) == footprint.cache(2, 13) + forward
    # A config that names neither head_dim, nor key/value heads, nor an MLP width.
    bare = SimpleNamespace(hidden_size=64, num_attention_heads=4, num_hidden_layers=1, vocab_size=9)
    bare_footprint = DecodeFootprint.of(bare, torch.float32)
    assert bare_footprint.cache_per_position == 2 * 4 * 16 * 4
    assert bare_footprint.activations_per_position == (4 * 64 + 12 * 16) * 4 + 3 * 256 * 4
