"""Chat completions from a local model, for `ringtrain-data regenerate --local`.

`LocalChat` has the interface of `regen_client.ChatClient` (`complete`, `open`,
`aclose`, `check_model`, `sampling`, `requests`), so `regenerate` and
`regen_records.regenerate_record` drive it as they drive a server: many conversations
in flight, the turns of each in order. Each `complete` renders its conversation with
the tokenizer's chat template (and `chat_template_kwargs`), as a server does, and waits;
one batching task gathers the waiting turns of up to `batch_size` conversations, answers
them in one `LocalModel.answer` call (greedy, static KV cache), and hands each its
`Completion`: the text decoded without special tokens, `finish_reason` `stop` or
`length` (cut at `max_tokens`), and the prompt and answer token counts (the stop token
counted, as servers count it).

Generation blocks the event loop while a batch runs; in between, the conversations
answered take their next turn or the next record, so the next batch is full again. A
batch starts once `batch_size` turns wait or a pass of the event loop adds none (every
conversation in flight is waiting).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import torch

from ringtrain.data.errors import DatasetError
from ringtrain.data.regen_client import Completion, RequestFailed, Sampling
from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.greedy import Answer
from ringtrain.generate.local_model import DEVICES, LocalModel, load_tokenizer
from ringtrain.generate.prompts import PromptFileError
from ringtrain.target.loader import DTYPES

LOCAL_DTYPES = ("auto", *DTYPES)


@dataclass(frozen=True)
class LocalEngine:
    """Which local model answers, where, and how many conversations per batch."""

    model_dir: Path
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 0  # 0: the device's default


def check_local(engine: LocalEngine, sampling: Sampling) -> None:
    """Refuse what `--local` cannot do before anything is written; raises DatasetError."""
    if sampling.temperature != 0:
        raise DatasetError(
            f"--local generates greedily only (temperature 0), not at temperature "
            f"{sampling.temperature}: drop --temperature, or serve the model with vLLM or "
            "SGLang and pass --server to sample"
        )
    if sampling.max_tokens is None or sampling.max_tokens < 1:
        raise DatasetError(f"--local needs --max-tokens of at least 1, not {sampling.max_tokens}")
    if engine.device not in DEVICES or engine.dtype not in LOCAL_DTYPES:
        raise DatasetError(
            f"--device {engine.device!r} / --dtype {engine.dtype!r}: choose --device from "
            f"{', '.join(DEVICES)} and --dtype from {', '.join(LOCAL_DTYPES)}"
        )
    if engine.batch_size < 0:
        raise DatasetError(f"--batch-size must be at least 1, not {engine.batch_size}")
    directory = engine.model_dir
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


@dataclass
class _Turn:
    """A conversation waiting for its next answer."""

    prompt: list[int]
    answer: asyncio.Future


class LocalChat:
    """The `ChatClient` interface over a model in this process, batched across conversations."""

    def __init__(self, engine: LocalEngine, sampling: Sampling) -> None:
        self.sampling = sampling
        self.requests = 0
        self.batches = 0
        self._engine = engine
        self._model: LocalModel | None = None
        self._renderer: ChatRenderer | None = None
        self._waiting: list[_Turn] = []
        self._arrived = asyncio.Event()
        self._batcher: asyncio.Task | None = None

    async def open(self) -> None:
        """Load the model and start the batching task (needs the running event loop)."""
        engine = self._engine
        self._model = LocalModel.load(
            engine.model_dir, engine.device, engine.dtype, engine.batch_size
        )
        self._renderer = ChatRenderer(self._model.tokenizer, self.sampling.chat_template_kwargs)
        self._batcher = asyncio.ensure_future(self._serve())

    async def aclose(self) -> None:
        """Stop the batching task."""
        if self._batcher is not None:
            self._batcher.cancel()
            await asyncio.gather(self._batcher, return_exceptions=True)

    async def check_model(self) -> None:
        """Nothing to ask: `check_local` checked the directory and `open` loaded the model."""

    async def complete(self, messages: list[dict[str, str]]) -> Completion:
        """The model's greedy answer to `messages`; raises RequestFailed when the chat
        template refuses them."""
        assert self._renderer is not None, "open() first"
        try:
            prompt = self._renderer.render(messages, "the conversation")
        except PromptFileError as exc:
            raise RequestFailed(str(exc), retryable=False) from None
        turn = _Turn(prompt, asyncio.get_running_loop().create_future())
        self._waiting.append(turn)
        self.requests += 1
        self._arrived.set()
        return await turn.answer

    async def _serve(self) -> None:
        """Answer the waiting turns, a batch at a time, until cancelled."""
        assert self._model is not None
        batch_size = self._model.batch_size
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            waiting = -1
            while waiting != len(self._waiting) and len(self._waiting) < batch_size:
                waiting = len(self._waiting)
                await asyncio.sleep(0)  # let the other conversations ask too
            batch, self._waiting = self._waiting[:batch_size], self._waiting[batch_size:]
            if self._waiting:
                self._arrived.set()
            self._answer(batch)

    def _answer(self, batch: list[_Turn]) -> None:
        """Generate the answers of one batch and hand each to its conversation."""
        assert self._model is not None
        try:
            answers, _ = self._model.answer([t.prompt for t in batch], self.sampling.max_tokens)
        except Exception as exc:  # every conversation of the batch learns why, and stops
            error = exc
            if isinstance(exc, torch.OutOfMemoryError):
                error = DatasetError(
                    f"out of memory generating a batch of {len(batch)} conversations; the "
                    "records written are kept: rerun with a smaller --batch-size (or "
                    "--max-tokens)"
                )
            for turn in batch:
                if not turn.answer.done():
                    turn.answer.set_exception(error)
            return
        self.batches += 1
        for turn, answer in zip(batch, answers, strict=True):
            if not turn.answer.done():
                turn.answer.set_result(self._completion(turn.prompt, answer))

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
