"""A local causal LM that answers prompts greedily, in batches: loaded once, used by both
offline regenerators.

`ringtrain-data regenerate --local` (chat JSONL answered again in this process) and
`tools/recipes/regenerate.py` (token datasets of prompt + answer) load the model and its
tokenizer the same way, stop at the same end-of-sequence ids, pad with the same id and
generate with `ringtrain.generate.greedy.greedy_answers` (prompts of similar length in
left-padded batches, a static KV cache).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ringtrain.generate.defaults import (
    CPU_BATCH_SIZE,
    CPU_MAX_TOKENS,
    GPU_BATCH_SIZE,
    GPU_MAX_TOKENS,
)
from ringtrain.generate.greedy import MAX_BATCH_TOKENS, Answer, GenerationStats, greedy_answers
from ringtrain.generate.model import load_causal_lm, stop_token_ids
from ringtrain.generate.sampling import TokenSampler
from ringtrain.generate.tokenizer_files import has_tokenizer_files

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """``auto``: the GPU when there is one, else the CPU; otherwise the named device."""
    if name not in DEVICES:
        raise ValueError(f"device {name!r} is not one of {', '.join(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device 'cuda' asked for, but torch {torch.__version__} sees no CUDA device "
            "here; run on the cpu (or auto)"
        )
    return torch.device(name)


def default_batch_size(device: torch.device) -> int:
    """Prompts per batch when none is given: many on a GPU, few on a CPU."""
    return GPU_BATCH_SIZE if device.type == "cuda" else CPU_BATCH_SIZE


def default_cpu_threads() -> int:
    """Threads for matrix products on a CPU: the cores this process may use, less those
    that other processes keep busy (the 1-minute load average), at least one. OpenMP
    threads meet at every operation, so one whose core another process holds stalls
    the rest: on a busy 2-core machine one thread decodes several times faster than two."""
    cores = len(os.sched_getaffinity(0))
    return max(1, cores - int(os.getloadavg()[0]))


def context_length(config: object) -> int | None:
    """The positions the model is made for (``max_position_embeddings``), if it says."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    length = getattr(text, "max_position_embeddings", None)
    return int(length) if length else None


def default_max_tokens(device: torch.device, context: int | None) -> int:
    """New tokens per answer when none is given: the device's default, at most half the
    model's context."""
    tokens = GPU_MAX_TOKENS if device.type == "cuda" else CPU_MAX_TOKENS
    return tokens if context is None else max(1, min(tokens, context // 2))


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase | None:
    """The tokenizer of a local model directory, or None when it has no tokenizer files."""
    if not has_tokenizer_files(model_dir):
        return None
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def generation_stop_ids(model: PreTrainedModel) -> list[int]:
    """The ids that end an answer: the config's end-of-sequence ids and those of the
    generation config (an instruct model often lists its end-of-turn token only there,
    and a serving engine stops at both)."""
    ids = stop_token_ids(model.config)
    extra = stop_token_ids(model.generation_config) if model.generation_config else []
    return ids + [token for token in extra if token not in ids]


@dataclass
class LocalModel:
    """A model in this process, its tokenizer (if any) and how it batches."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None
    batch_size: int
    # Padded tokens of one batch at most: rows x (longest prompt + new tokens).
    max_batch_tokens: int = MAX_BATCH_TOKENS

    @classmethod
    def load(
        cls,
        model_dir: Path,
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int = 0,
        max_batch_tokens: int = 0,
    ) -> LocalModel:
        """Load ``model_dir`` (never the hub) onto ``device``; ``batch_size`` 0: the
        device's default; ``max_batch_tokens`` 0: greedy's default (2^19)."""
        where = resolve_device(device)
        model = load_causal_lm(model_dir, where, dtype)
        return cls(
            model,
            load_tokenizer(model_dir),
            batch_size or default_batch_size(where),
            max_batch_tokens or MAX_BATCH_TOKENS,
        )

    @property
    def stop_ids(self) -> list[int]:
        """The ids that end an answer (kept as its last token)."""
        return generation_stop_ids(self.model)

    @property
    def pad_id(self) -> int:
        """The id left-padding a batch: the config's pad id, else the first stop id."""
        pad = self.model.config.pad_token_id
        if pad is not None:
            return int(pad)
        stops = self.stop_ids
        return stops[0] if stops else 0

    @property
    def vocab_size(self) -> int:
        """Size of the model's vocabulary (prompt ids must be below it)."""
        return int(self.model.config.vocab_size)

    def answer(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        on_batch: Callable[[int], None] | None = None,
        sampler: TokenSampler | None = None,
        memory_budget: int | None = None,
        on_tokens: Callable[[int], None] | None = None,
    ) -> tuple[list[Answer], GenerationStats]:
        """Greedy answers to ``prompts`` (token ids), in their order, and what they took;
        with a ``sampler``, answers drawn from it. Batches fit ``memory_budget`` bytes
        when one is given; ``on_tokens`` hears of new tokens as they come."""
        return greedy_answers(
            self.model,
            prompts,
            max_new_tokens,
            self.stop_ids,
            pad_id=self.pad_id,
            batch_size=self.batch_size,
            max_batch_tokens=self.max_batch_tokens,
            on_batch=on_batch,
            sampler=sampler,
            memory_budget=memory_budget,
            on_tokens=on_tokens,
        )
