"""Chat completions from a local model, for `ringtrain-data regenerate --local`.

`LocalChat` has the interface of `regen_client.ChatClient` (`complete`, `open`,
`aclose`, `check_model`, `sampling`, `requests`, `stop`, `abort`), so `regenerate` and
`regen_records.regenerate_record` drive it as they drive a server: many conversations
in flight, the turns of each in order. Each `complete` renders its conversation with
the tokenizer's chat template (and `chat_template_kwargs`), as a server does, and waits
for its `Completion`: the text decoded without special tokens, `finish_reason` `stop`
or `length` (cut at `max_tokens`), and the prompt and answer token counts (the stop
token counted, as servers count it). A prompt whose length plus `max_tokens` exceeds
the model's context (`max_position_embeddings`) is refused as a server refuses it
(`RequestFailed`, listed in the errors file), never generated past the context.

Answers are greedy, or drawn at ``--temperature`` (and ``--top-p``) by one generator
seeded with ``--seed``: sampled answers teach a drafter the target's distribution, what
it meets when the target is served at that temperature. Which answer gets which draws
depends on how the turns were batched, so a rerun draws alike only batch for batch.

`prepare_local` sizes the run to the device before anything is written: the default
`--max-tokens` and `--batch-size` of the CPU or the GPU, a `--max-tokens` beyond the
context refused, `--device cuda` without CUDA refused, and one answer's memory
(`generate.memory`) checked against what generation may use. Once the model is loaded,
`open` plans how many answers fit at once (fewer than `--batch-size` when memory is
short, said in `description`) and starts the generating thread (`regen_drivers`):
continuous batching on a CPU, batches on a GPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ringtrain.cpu_math import settle_cpu_math
from ringtrain.data.errors import DatasetError
from ringtrain.data.regen_client import Completion, RequestFailed, Sampling, Stopped
from ringtrain.data.regen_drivers import BatchDriver, SlotDriver, Turn
from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.continuous import DoesNotFit, TooLong, plan_slots
from ringtrain.generate.defaults import REGENERATE_CPU_BATCH_SIZE
from ringtrain.generate.greedy import Answer
from ringtrain.generate.local_model import (
    DEVICES,
    LocalModel,
    context_length,
    default_batch_size,
    default_cpu_threads,
    default_max_tokens,
    load_tokenizer,
    resolve_device,
)
from ringtrain.generate.memory import DecodeFootprint, format_size, generation_budget
from ringtrain.generate.model import IncompleteModelError, supports_cache_rollback
from ringtrain.generate.prompts import PromptFileError
from ringtrain.generate.sampling import TokenSampler
from ringtrain.target.loader import DTYPES, resolve_dtype

LOCAL_DTYPES = ("auto", *DTYPES)


@dataclass(frozen=True)
class LocalEngine:
    """Which local model answers, where, how many answers at once, the memory generation
    may use beside the model (None: ``BUDGET_FRACTION`` of what is free) and the CPU
    threads (0: ``default_cpu_threads``)."""

    model_dir: Path
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 0  # 0: the device's default
    memory_limit: int | None = None
    threads: int = 0
    seed: int = 0  # of the sampling generator (a temperature above 0)


def prepare_local(engine: LocalEngine, sampling: Sampling) -> tuple[LocalEngine, Sampling]:
    """``engine`` and ``sampling`` with the device's defaults filled in (``max_tokens``
    None: the device's), checked before anything is written; raises DatasetError."""
    _check_options(engine, sampling)
    try:
        device = resolve_device(engine.device)
    except ValueError as exc:
        raise DatasetError(f"--device {engine.device}: {exc}") from None
    config = _model_config(engine.model_dir)
    context = context_length(config)
    max_tokens = sampling.max_tokens or default_max_tokens(device, context)
    if context is not None and max_tokens > context:
        raise DatasetError(
            f"--max-tokens {max_tokens} is more than the model's context of {context} tokens "
            f"(max_position_embeddings in {engine.model_dir / 'config.json'}): no answer "
            "can be that long; lower --max-tokens"
        )
    footprint = DecodeFootprint.of(config, resolve_dtype(engine.dtype, device, "--dtype"))
    try:
        plan_slots(footprint, generation_budget(device, engine.memory_limit), 1, max_tokens)
    except DoesNotFit as exc:
        raise DatasetError(str(exc)) from None
    cpu = REGENERATE_CPU_BATCH_SIZE
    batch_size = engine.batch_size or (default_batch_size(device) if device.type == "cuda" else cpu)
    return replace(engine, batch_size=batch_size), replace(sampling, max_tokens=max_tokens)


def _check_options(engine: LocalEngine, sampling: Sampling) -> None:
    """Refuse settings `--local` cannot use; raises DatasetError."""
    if not sampling.temperature >= 0 or not 0 < sampling.top_p <= 1:
        raise DatasetError(
            f"--temperature {sampling.temperature} / --top-p {sampling.top_p}: the "
            "temperature must be at least 0 (0: greedy) and top-p in (0, 1]"
        )
    if sampling.max_tokens is not None and sampling.max_tokens < 1:
        raise DatasetError(f"--local needs --max-tokens of at least 1, not {sampling.max_tokens}")
    if engine.device not in DEVICES or engine.dtype not in LOCAL_DTYPES:
        raise DatasetError(
            f"--device {engine.device!r} / --dtype {engine.dtype!r}: choose --device from "
            f"{', '.join(DEVICES)} and --dtype from {', '.join(LOCAL_DTYPES)}"
        )
    if engine.batch_size < 0:
        raise DatasetError(f"--batch-size must be at least 1, not {engine.batch_size}")
    if engine.threads < 0:
        raise DatasetError(f"--threads must be at least 1, not {engine.threads}")


def _model_config(directory: Path) -> object:
    """The config of a local chat model directory (with a tokenizer and a chat template);
    raises DatasetError naming what is missing."""
    from transformers import AutoConfig

    if not (directory / "config.json").is_file():
        what = "no config.json in" if directory.is_dir() else "no such directory:"
        raise DatasetError(
            f"--local {directory}: {what} {directory}; pass a local Hugging Face model "
            "directory (config.json, weights, tokenizer with a chat template)"
        )
    tokenizer = load_tokenizer(directory)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        missing = "tokenizer" if tokenizer is None else "chat template"
        raise DatasetError(
            f"--local {directory}: the model directory has no {missing}; regenerate with "
            "the instruct (chat) checkpoint, whose tokenizer_config.json (or "
            "chat_template.jinja) holds the chat template"
        )
    try:
        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except (ValueError, OSError) as exc:
        raise DatasetError(f"--local {directory}: unreadable config.json ({exc})") from None


def _failure(error: BaseException) -> BaseException:
    """What a conversation learns when generation fails: out of memory (a GPU's
    OutOfMemoryError, or the CPU allocator's RuntimeError) named, anything else as is."""
    allocator = isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
    if isinstance(error, torch.OutOfMemoryError) or allocator:
        return DatasetError(
            "out of memory while generating; the records written are kept: rerun with a "
            "smaller --batch-size (or --max-tokens, or a lower --memory-limit)"
        )
    return error


class LocalChat:
    """The `ChatClient` interface over a model in this process."""

    def __init__(
        self,
        engine: LocalEngine,
        sampling: Sampling,
        on_tokens: Callable[[int], None] | None = None,
    ) -> None:
        self.sampling = sampling
        self.requests = 0
        self.description = ""
        self._engine = engine
        self._on_tokens = on_tokens
        self._renderer: ChatRenderer | None = None
        self._driver: SlotDriver | BatchDriver | None = None
        self._context: int | None = None
        self._stopping = False

    async def open(self) -> None:
        """Load the model, plan the answers at once and start generating (needs the
        running event loop); raises DatasetError when not even one answer fits."""
        engine, max_tokens = self._engine, int(self.sampling.max_tokens or 0)
        if engine.threads or resolve_device(engine.device).type == "cpu":
            torch.set_num_threads(engine.threads or default_cpu_threads())
        settle_cpu_math()
        try:
            model = await asyncio.to_thread(
                LocalModel.load, engine.model_dir, engine.device, engine.dtype, engine.batch_size
            )
        except IncompleteModelError as exc:
            raise DatasetError(f"--local {exc}") from None
        self._renderer = ChatRenderer(model.tokenizer, self.sampling.chat_template_kwargs)
        config = model.model.config
        self._context = context_length(config)
        parameter = next(model.model.parameters())
        budget = generation_budget(parameter.device, engine.memory_limit)
        try:
            slots, _ = plan_slots(
                DecodeFootprint.of(config, parameter.dtype), budget, model.batch_size, max_tokens
            )
        except DoesNotFit as exc:
            raise DatasetError(str(exc)) from None
        continuous = parameter.device.type == "cpu" and supports_cache_rollback(config)
        driver = SlotDriver if continuous else BatchDriver
        model.batch_size = slots
        sampler = None
        if self.sampling.temperature > 0:
            sampling = self.sampling
            sampler = TokenSampler.seeded(
                sampling.temperature, sampling.top_p, engine.seed, parameter.device
            )
        self._driver = driver(model, slots, max_tokens, budget, self._on_tokens, _failure, sampler)
        count = torch.get_num_threads()
        threads = f", {count} thread{'s' * (count > 1)}" if parameter.device.type == "cpu" else ""
        self.description = (
            f"{engine.model_dir.name} on {parameter.device.type} "
            f"({str(parameter.dtype).removeprefix('torch.')}{threads}), "
            f"{'continuous batching' if continuous else 'batches'} of up to {slots} answers "
            f"of at most {max_tokens} tokens; generation may use {format_size(budget)}"
        )
        if slots < engine.batch_size:
            self.description += (
                f" (--batch-size {engine.batch_size} would need more: cut to {slots})"
            )

    async def aclose(self) -> None:
        """Stop generating and wait for the generating thread."""
        if self._driver is not None:
            await self._driver.close()

    async def check_model(self) -> None:
        """Nothing to ask: `prepare_local` checked the directory and `open` loaded it."""

    def stop(self) -> None:
        """Finish the answers in flight; turns not started fail with Stopped."""
        self._stopping = True
        if self._driver is not None:
            self._driver.stop()

    def abort(self) -> None:
        """End generation at its next step."""
        if self._driver is not None:
            self._driver.abort()

    async def complete(self, messages: list[dict[str, str]]) -> Completion:
        """The model's answer to `messages` (greedy, or sampled); raises RequestFailed when the chat
        template refuses them or the context cannot hold the answer, Stopped once
        stopping."""
        assert self._renderer is not None and self._driver is not None, "open() first"
        if self._stopping:
            raise Stopped("stopping: the turn was not started")
        try:
            prompt = self._renderer.render(messages, "the conversation")
        except PromptFileError as exc:
            raise RequestFailed(str(exc), retryable=False) from None
        self.requests += 1
        self._check_context(len(prompt))
        turn = Turn(prompt, asyncio.get_running_loop().create_future())
        self._driver.submit(turn)
        try:
            answer = await turn.answer
        except TooLong as exc:
            raise RequestFailed(str(exc), retryable=False) from None
        return self._completion(prompt, answer)

    def _check_context(self, prompt: int) -> None:
        """Refuse a prompt the context cannot hold with its answer, as a server does."""
        total = prompt + int(self.sampling.max_tokens or 0)
        if self._context is not None and total > self._context:
            raise RequestFailed(
                f"too long: the prompt has {prompt} tokens and --max-tokens is "
                f"{self.sampling.max_tokens}, {total} in all, more than the model's context "
                f"of {self._context} tokens (a server refuses such a request); lower "
                "--max-tokens or shorten the conversation",
                retryable=False,
            )

    def _completion(self, prompt: list[int], answer: Answer) -> Completion:
        """What a server returns for this answer."""
        assert self._renderer is not None
        return Completion(
            content=self._renderer.answer_text(answer.tokens),
            reasoning_content=None,
            finish_reason="length" if answer.truncated else "stop",
            prompt_tokens=len(prompt),
            completion_tokens=len(answer.tokens),
        )
