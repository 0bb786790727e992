"""How much memory a batch of generation needs, and how much there is, before allocating.

A decode keeps every layer's keys and values for every position of every row (the KV
cache), and its prompt forward briefly holds one layer's activations, the attention
scores of the prompt (transformers' masked SDPA materialises them) and the last
position's logits. ``DecodeFootprint`` estimates these from the model's config, so a
batch can be sized, cut or refused before the allocator fails: on a GPU with
``torch.OutOfMemoryError``, on a CPU with a plain ``RuntimeError``, or not at all while
the machine swaps.

``available_memory`` is what the device can still give: on CUDA the free memory
``torch.cuda.mem_get_info`` reports; on a CPU ``MemAvailable`` of ``/proc/meminfo``,
lowered to what a cgroup memory limit leaves. Generation plans with
``BUDGET_FRACTION`` of it, or with an explicit limit (``parse_size``: ``--memory-limit``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ringtrain.generate.defaults import BUDGET_FRACTION

UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", re.IGNORECASE)
CGROUP_LIMITS = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    ),
)


def parse_size(text: str) -> int:
    """Bytes of a size like ``512MiB``, ``4G``, ``1.5GB`` or ``1000000`` (binary units);
    raises ValueError naming the text."""
    match = SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size; write it like 512MiB, 4GiB or 2G")
    size = int(float(match.group(1)) * UNITS[match.group(2).lower()])
    if size < 1:
        raise ValueError(f"{text!r} is not a positive size")
    return size


def format_size(size: int) -> str:
    """``size`` bytes in the largest binary unit it reaches (GiB, MiB or KiB), two decimals."""
    for prefix in "gmk":
        if size >= UNITS[prefix]:
            return f"{size / UNITS[prefix]:.2f} {prefix.upper()}iB"
    return f"{size} bytes"


def _meminfo_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cgroup_headroom() -> int | None:
    """What this process's cgroup memory limit still allows (None: no limit found)."""
    for limit_file, usage_file in CGROUP_LIMITS:
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            return max(0, int(limit) - usage)
    return None


def available_memory(device: torch.device) -> int:
    """Bytes the device can still give to this process."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    available = _meminfo_available()
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    headroom = _cgroup_headroom()
    return available if headroom is None else min(available, headroom)


def generation_budget(device: torch.device, limit: int | None = None) -> int:
    """Bytes generation may plan with: ``limit`` when given, else ``BUDGET_FRACTION`` of
    the memory available now (call it once the model is loaded)."""
    if limit is not None:
        return limit
    return int(BUDGET_FRACTION * available_memory(device))


@dataclass(frozen=True)
class DecodeFootprint:
    """Bytes a decode needs beyond the weights, per position and per row, from the
    model's config and the dtype it runs in."""

    cache_per_position: int  # keys and values of every layer for one position of one row
    activations_per_position: int  # one layer's activations of one position in a forward
    score_bytes: int  # one prompt attention score (all heads): heads x dtype size
    logits_per_row: int  # the last position's logits and their argmax temporaries

    @classmethod
    def of(cls, config: object, dtype: torch.dtype) -> DecodeFootprint:
        """The footprint of a model with this (text) config run in ``dtype``."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = int(text.num_attention_heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        hidden = int(text.hidden_size)
        head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
        intermediate = int(getattr(text, "intermediate_size", None) or 4 * hidden)
        size = torch.empty(0, dtype=dtype).element_size()
        layers = int(text.num_hidden_layers)
        return cls(
            cache_per_position=layers * 2 * kv_heads * head_dim * size,
            activations_per_position=(4 * hidden + (heads + 2 * kv_heads) * head_dim) * size
            + 3 * intermediate * size,
            score_bytes=heads * size,
            logits_per_row=3 * int(text.vocab_size) * 4,
        )

    def cache(self, rows: int, length: int) -> int:
        """A KV cache of ``rows`` rows of ``length`` positions."""
        return rows * length * self.cache_per_position

    def prompt_forward(self, rows: int, width: int) -> int:
        """The prompt forward of ``rows`` left-padded prompts of ``width`` tokens, beside
        the cache: one layer's activations, the scores and boolean mask, the logits."""
        per_row = width * self.activations_per_position + width * width * (self.score_bytes + 1)
        return rows * (per_row + self.logits_per_row)

    def batch(self, rows: int, width: int, new_tokens: int) -> int:
        """A whole batch: its cache of ``width + new_tokens`` positions and its prompt
        forward (the larger of a prompt forward and a decode step)."""
        return self.cache(rows, width + new_tokens) + self.prompt_forward(rows, width)
