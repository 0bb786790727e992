"""Batched greedy generation with a local causal LM: the target's own answers, fast.

Regenerating a training set and the greedy half of an evaluation both need the
target's greedy continuation of many prompts. Decoding them one by one leaves a GPU
idle behind Python; decoding them in batches with transformers' default cache copies
the whole cache at every step (it grows by concatenation). Here prompts are sorted by
length, cut into batches of similar length (left-padded to a bucketed width, so few
shapes occur), and decoded by ``batch_decode`` with a preallocated cache of its own that
every step writes one position into, the step replayed as a CUDA graph on CUDA. A
decode step reads the whole cache, so its speed is bounded by the cache's size over the
memory bandwidth: the one-token attention reads each key/value head once for all the
query heads that share it (grouped-query attention), where transformers' masked SDPA
path copies the cache once per query head. transformers' own ``generate`` (static or
dynamic cache, optionally with that grouped attention) remains for comparison and for
targets with sliding-window or linear-attention layers (``DecodeOptions``).

Every answer ends after its first stop token (kept) or at ``max_new_tokens``; the
latter is reported as truncated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel

from ringtrain.generate.batch_decode import (
    BATCH_DECODE,
    KERNELS,
    attention_for_decoding,
    decode_batch,
)
from ringtrain.generate.model import supports_cache_rollback
from ringtrain.generate.sampling import TokenSampler

# "own": batch_decode's cache and loop; "static"/"dynamic": transformers' generate with
# that cache (for comparison, and for targets with sliding-window or linear layers).
CACHES = ("own", "static", "dynamic")
WIDTH_BUCKET = 64
# Rows x (longest prompt + new tokens) of one batch: bounds the prefill's attention
# scores (transformers' masked SDPA materialises them) and the cache.
MAX_BATCH_TOKENS = 1 << 19


@dataclass(frozen=True)
class Answer:
    """One greedy continuation: its tokens, and whether it was cut at max_new_tokens."""

    tokens: list[int]
    truncated: bool


@dataclass(frozen=True)
class GenerationStats:
    """What one ``greedy_answers`` call did: prompts, new tokens, seconds, batches."""

    prompts: int
    new_tokens: int
    seconds: float
    batches: int

    @property
    def tokens_per_s(self) -> float:
        """Generated (new) tokens per second of wall time."""
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def length_batches(
    lengths: Sequence[int], batch_size: int, max_tokens: int, new_tokens: int
) -> list[list[int]]:
    """Indices of ``lengths`` grouped by length into batches of at most ``batch_size``
    prompts whose padded rows (longest prompt + ``new_tokens``) hold at most ``max_tokens``
    in all: prefill attention and the cache grow with rows x width."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        width = lengths[i] + new_tokens
        if (
            batches
            and len(batches[-1]) < batch_size
            and (len(batches[-1]) + 1) * width <= max_tokens
        ):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def left_padded(
    prompts: Sequence[Sequence[int]], pad_id: int, bucket: int = WIDTH_BUCKET
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask [B, W] of left-padded prompts, W a multiple of ``bucket``."""
    longest = max(map(len, prompts))
    width = -(-longest // bucket) * bucket
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def cut_answer(row: Sequence[int], stop_ids: set[int], max_new_tokens: int) -> Answer:
    """The answer in a generated row: up to and including the first stop token."""
    for i, token in enumerate(row[:max_new_tokens]):
        if token in stop_ids:
            return Answer(list(row[: i + 1]), truncated=False)
    return Answer(list(row[:max_new_tokens]), truncated=True)


def _generate_batch(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
    options: DecodeOptions,
    sampler: TokenSampler | None = None,
) -> torch.Tensor:
    """The new tokens [B, <= max_new_tokens] of one batch (padding after a row's stop),
    greedy or drawn from ``sampler``."""
    device = next(model.parameters()).device
    ids, mask = left_padded(prompts, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    if options.cache == "own":
        return decode_batch(
            model,
            ids,
            mask.bool(),
            max_new_tokens,
            stop_ids,
            pad_id,
            options.kernel,
            options.graph,
            sampler,
        )
    extra: dict[str, object] = {"disable_compile": not options.compile}
    if options.cache == "static":
        extra["cache_implementation"] = "static"
    if sampler is not None:  # transformers draws from the global generator: seed it
        torch.manual_seed(sampler.fork_seed())
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=sampler is not None,
            temperature=sampler.temperature if sampler else None,
            top_p=sampler.top_p if sampler else None,
            top_k=None,
            eos_token_id=stop_ids or None,
            pad_token_id=pad_id,
            **extra,
        )
    return out[:, ids.shape[1] :]


@dataclass(frozen=True)
class DecodeOptions:
    """How batches are decoded: the cache (``CACHES``), and for "own" the one-token kernel
    (batch_decode.KERNELS) and CUDA graphs; for transformers' generate whether its
    attention is ours (grouped one-token) and whether it compiles the step."""

    cache: str = "own"
    kernel: str = "sdpa"
    graph: bool = True
    grouped_attention: bool = True
    compile: bool = False

    def checked(self, model: PreTrainedModel) -> DecodeOptions:
        """These options, valid for ``model``: "own" needs all layers full attention
        (else transformers' static cache is used)."""
        if self.cache not in CACHES:
            raise ValueError(f"cache {self.cache!r} is not one of {', '.join(CACHES)}")
        if self.kernel not in KERNELS:
            raise ValueError(f"decode kernel {self.kernel!r} is not one of {', '.join(KERNELS)}")
        if self.cache == "own" and not supports_cache_rollback(model.config):
            return replace(self, cache="static")
        return self

    def attention(self) -> str | None:
        """The attention implementation decoding runs with (None: the model's own)."""
        return BATCH_DECODE if self.cache == "own" or self.grouped_attention else None


def greedy_answers(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    *,
    pad_id: int,
    batch_size: int,
    max_batch_tokens: int = MAX_BATCH_TOKENS,
    options: DecodeOptions = DecodeOptions(),
    on_batch: Callable[[int], None] | None = None,
    sampler: TokenSampler | None = None,
) -> tuple[list[Answer], GenerationStats]:
    """Greedy answers to ``prompts`` (in their order) and what generating them took.

    A batch holds at most ``batch_size`` prompts and ``max_batch_tokens`` padded tokens.
    ``on_batch`` is called with the number of prompts of each finished batch (progress).
    With a ``sampler`` the answers are drawn from it instead (temperature, top-p).
    """
    options = options.checked(model)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    stops = set(stop_ids)
    answers: list[Answer | None] = [None] * len(prompts)
    lengths = [len(p) for p in prompts]
    batches = length_batches(lengths, batch_size, max_batch_tokens, max_new_tokens)
    started = time.perf_counter()
    with attention_for_decoding(model, options.attention()):
        for rows in batches:
            batch = [prompts[i] for i in rows]
            new = _generate_batch(
                model, batch, max_new_tokens, list(stop_ids), pad_id, options, sampler
            )
            for i, row in zip(rows, new.tolist(), strict=True):
                answers[i] = cut_answer(row, stops, max_new_tokens)
            if on_batch is not None:
                on_batch(len(rows))
    seconds = time.perf_counter() - started
    done = [a for a in answers if a is not None]
    stats = GenerationStats(
        prompts=len(done),
        new_tokens=sum(len(a.tokens) for a in done),
        seconds=seconds,
        batches=len(batches),
    )
    return done, stats
