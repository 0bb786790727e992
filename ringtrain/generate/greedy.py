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
from transformers import PreTrainedModel, StoppingCriteria, StoppingCriteriaList

from ringtrain.generate.batch_decode import (
    BATCH_DECODE,
    KERNELS,
    StepState,
    attention_for_decoding,
    decode_batch,
)
from ringtrain.generate.memory import DecodeFootprint
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

    def __add__(self, other: GenerationStats) -> GenerationStats:
        """Two calls' figures together."""
        return GenerationStats(
            self.prompts + other.prompts,
            self.new_tokens + other.new_tokens,
            self.seconds + other.seconds,
            self.batches + other.batches,
        )


def length_batches(
    lengths: Sequence[int],
    batch_size: int,
    max_tokens: int,
    new_tokens: int,
    fits: Callable[[int, int], bool] | None = None,
) -> list[list[int]]:
    """Indices of ``lengths`` grouped by length into batches of at most ``batch_size``
    prompts whose padded rows (longest prompt + ``new_tokens``) hold at most ``max_tokens``
    in all: prefill attention and the cache grow with rows x width. ``fits(rows,
    longest prompt)`` may refuse a batch besides (memory)."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        width = lengths[i] + new_tokens
        rows = len(batches[-1]) + 1 if batches else 1
        if (
            batches
            and rows <= batch_size
            and rows * width <= max_tokens
            and (fits is None or fits(rows, lengths[i]))
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


class TokenCounter:
    """Reports the new tokens of a batch while it decodes: ``on_tokens`` gets the increase
    since its last call (each row counted up to its first stop token)."""

    def __init__(self, on_tokens: Callable[[int], None], stop_ids: Sequence[int]) -> None:
        self.on_tokens = on_tokens
        self.stop_ids = list(stop_ids) or [-1]
        self.reported = 0

    def seen(self, new: torch.Tensor) -> None:
        """``new`` [B, n]: the tokens generated so far."""
        stopped = torch.isin(new, torch.tensor(self.stop_ids, device=new.device))
        first = stopped.int().argmax(dim=1) + 1
        self.report(int(torch.where(stopped.any(dim=1), first, new.shape[1]).sum()))

    def report(self, total: int) -> None:
        """The batch has generated ``total`` tokens so far."""
        if total > self.reported:
            self.on_tokens(total - self.reported)
            self.reported = total

    def own_check(self, state: StepState) -> None:
        """``decode_batch``'s check hook."""
        self.seen(state.out[:, : int(state.column)])

    def criterion(self, prompt_width: int) -> StoppingCriteria:
        """A stopping criterion for transformers' ``generate`` that only counts."""
        counter = self

        class _Counting(StoppingCriteria):
            def __call__(
                self, input_ids: torch.Tensor, scores: object, **kwargs: object
            ) -> torch.Tensor:
                counter.seen(input_ids[:, prompt_width:])
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        return _Counting()


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
    counter: TokenCounter | None = None,
) -> torch.Tensor:
    """The new tokens [B, <= max_new_tokens] of one batch (padding after a row's stop),
    greedy or drawn from ``sampler``; ``counter`` sees them as they come."""
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
            counter.own_check if counter is not None else None,
        )
    extra: dict[str, object] = {"disable_compile": not options.compile}
    if options.cache == "static":
        extra["cache_implementation"] = "static"
    if sampler is not None:  # transformers draws from the global generator: seed it
        torch.manual_seed(sampler.fork_seed())
    if counter is not None:
        extra["stopping_criteria"] = StoppingCriteriaList([counter.criterion(ids.shape[1])])
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
    memory_budget: int | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> tuple[list[Answer], GenerationStats]:
    """Greedy answers to ``prompts`` (in their order) and what generating them took.

    A batch holds at most ``batch_size`` prompts and ``max_batch_tokens`` padded tokens,
    and needs at most ``memory_budget`` bytes (``DecodeFootprint``) when one is given.
    ``on_batch`` is called with the number of prompts of each finished batch, and
    ``on_tokens`` with the new tokens as they are generated (every few decode steps).
    With a ``sampler`` the answers are drawn from it instead (temperature, top-p).
    """
    options = options.checked(model)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    stops = set(stop_ids)
    answers: list[Answer | None] = [None] * len(prompts)
    lengths = [len(p) for p in prompts]
    fits = _memory_fit(model, memory_budget, max_new_tokens)
    batches = length_batches(lengths, batch_size, max_batch_tokens, max_new_tokens, fits)
    started = time.perf_counter()
    with attention_for_decoding(model, options.attention()):
        for rows in batches:
            batch = [prompts[i] for i in rows]
            counter = TokenCounter(on_tokens, stop_ids) if on_tokens is not None else None
            new = _generate_batch(
                model, batch, max_new_tokens, list(stop_ids), pad_id, options, sampler, counter
            )
            for i, row in zip(rows, new.tolist(), strict=True):
                answers[i] = cut_answer(row, stops, max_new_tokens)
            if counter is not None:
                counter.report(sum(len(answers[i].tokens) for i in rows))
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


def _memory_fit(
    model: PreTrainedModel, budget: int | None, new_tokens: int
) -> Callable[[int, int], bool] | None:
    """Whether a batch of (rows, longest prompt) fits ``budget`` bytes (None: no budget)."""
    if budget is None:
        return None
    footprint = DecodeFootprint.of(model.config, next(model.parameters()).dtype)

    def fits(rows: int, longest: int) -> bool:
        width = -(-longest // WIDTH_BUCKET) * WIDTH_BUCKET
        return footprint.batch(rows, width, new_tokens) <= budget

    return fits
