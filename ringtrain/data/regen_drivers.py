"""The generation loops behind `regenerate --local`: they run the model on a thread of
their own, so the event loop keeps writing records, drawing the progress bar and
hearing Ctrl-C while a batch decodes.

`SlotDriver` (a CPU, a model whose layers are all full attention) runs
`continuous.SlotDecoder`: a conversation's turn enters a free slot at the next step and
its answer is handed back the step it ends. `BatchDriver` (a GPU, CUDA graphs; other
layer kinds) answers the waiting turns a batch at a time with `greedy_answers`: a batch
starts once `slots` turns wait or a pass of the event loop adds none (every conversation
in flight is waiting).

Both answer greedily, or draw from a `TokenSampler` when given one. Both take turns with `submit`,
hand each its `Answer` (or the exception that ended it) through the turn's future, and report
generated tokens to `on_tokens` as they come. `stop` lets the answers in flight finish and fails the
turns still waiting with `Stopped`; `abort` ends generation at the next step with `Aborted`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ringtrain.data.regen_client import Stopped
from ringtrain.generate.continuous import Request, SlotDecoder, TooLong
from ringtrain.generate.greedy import WIDTH_BUCKET, Answer
from ringtrain.generate.local_model import LocalModel
from ringtrain.generate.memory import DecodeFootprint
from ringtrain.generate.sampling import TokenSampler


class Aborted(Exception):
    """Generation was aborted (a second Ctrl-C)."""


@dataclass
class Turn:
    """A conversation waiting for its next answer."""

    prompt: list[int]
    answer: asyncio.Future


class _Settler:
    """Hands outcomes and token counts from the generating thread to the event loop."""

    def __init__(self, on_tokens: Callable[[int], None] | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.on_tokens = on_tokens

    def settle(self, turn: Turn, outcome: Answer | BaseException) -> None:
        """Resolve ``turn`` with ``outcome`` (from any thread)."""
        self._call(_resolve, turn.answer, outcome)

    def tokens(self, count: int) -> None:
        """``count`` more tokens were generated (from any thread)."""
        if self.on_tokens is not None and count:
            self._call(self.on_tokens, count)

    def _call(self, function: Callable[..., None], *args: object) -> None:
        """Run ``function`` on the event loop, unless it has closed (nobody waits)."""
        with contextlib.suppress(RuntimeError):  # raised once the loop has closed
            self.loop.call_soon_threadsafe(function, *args)


def _resolve(future: asyncio.Future, outcome: Answer | BaseException) -> None:
    if future.done():  # its conversation was cancelled meanwhile
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class SlotDriver:
    """Continuous batching on a thread of its own."""

    def __init__(
        self,
        model: LocalModel,
        slots: int,
        max_new_tokens: int,
        budget: int,
        on_tokens: Callable[[int], None] | None,
        translate: Callable[[BaseException], BaseException],
        sampler: TokenSampler | None = None,
    ) -> None:
        self.decoder = SlotDecoder(
            model.model, slots, max_new_tokens, model.stop_ids, model.pad_id, budget, sampler
        )
        self.slots = self.decoder.slots
        self.max_new_tokens = max_new_tokens
        self._settler = _Settler(on_tokens)
        self._translate = translate
        self._inbox: queue.SimpleQueue[Turn | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._aborted = threading.Event()
        self._thread = threading.Thread(target=self._run, name="regenerate-decode", daemon=True)
        self._thread.start()

    def submit(self, turn: Turn) -> None:
        """Queue ``turn`` for the next free slot."""
        self._inbox.put(turn)

    def stop(self) -> None:
        """Finish the answers in flight; fail the waiting turns with Stopped."""
        self._stopping.set()

    def abort(self) -> None:
        """End generation at the next step."""
        self._aborted.set()
        self._inbox.put(None)  # wakes an idle thread

    async def close(self) -> None:
        """Abort whatever is left and wait for the thread to end."""
        self.abort()
        await asyncio.to_thread(self._thread.join)

    def _run(self) -> None:
        in_flight: dict[int, Turn] = {}
        try:
            with self.decoder.decoding():
                while True:  # until aborted (close aborts too)
                    self._pass(in_flight)
        except BaseException as error:  # every waiting conversation learns why
            failure = self._translate(error)
            for turn in [*in_flight.values(), *self._drain()]:
                self._settler.settle(turn, failure)

    def _pass(self, in_flight: dict[int, Turn]) -> None:
        """Admit what waits, run one step, hand back what ended; raises Aborted."""
        taken = self._take(block=not in_flight)
        if self._aborted.is_set():
            in_flight.update((id(turn), turn) for turn in taken)
            raise Aborted("generation aborted")
        requests = [Request(id(turn), turn.prompt, self.max_new_tokens) for turn in taken]
        in_flight.update((id(turn), turn) for turn in taken)
        settled = self.decoder.admit(requests)
        generated = len(requests) - sum(isinstance(o, Exception) for _, o in settled)
        generated += len(self.decoder.active)
        settled += self.decoder.step()
        self._settler.tokens(generated)
        for request, outcome in settled:
            self._settler.settle(in_flight.pop(request.key), outcome)

    def _take(self, block: bool) -> list[Turn]:
        """Turns for the free slots (waiting for one when ``block``); while stopping, the
        waiting turns fail with Stopped instead."""
        taken: list[Turn] = []
        while len(taken) < self.decoder.free or self._stopping.is_set():
            try:
                turn = self._inbox.get(block=block and not taken)
            except queue.Empty:
                break
            if turn is None:
                break
            if self._stopping.is_set():
                self._settler.settle(turn, Stopped("stopping: the turn was not started"))
            else:
                taken.append(turn)
        return taken

    def _drain(self) -> list[Turn]:
        """The turns still queued."""
        turns = []
        while True:
            try:
                turn = self._inbox.get_nowait()
            except queue.Empty:
                return turns
            if turn is not None:
                turns.append(turn)


class BatchDriver:
    """Batches of waiting turns answered by ``greedy_answers`` on a thread of its own."""

    def __init__(
        self,
        model: LocalModel,
        slots: int,
        max_new_tokens: int,
        budget: int,
        on_tokens: Callable[[int], None] | None,
        translate: Callable[[BaseException], BaseException],
        sampler: TokenSampler | None = None,
    ) -> None:
        self.model = model
        self.sampler = sampler
        self.slots = slots
        self.max_new_tokens = max_new_tokens
        self.budget = budget
        parameter = next(model.model.parameters())
        self._footprint = DecodeFootprint.of(model.model.config, parameter.dtype)
        self.batches = 0
        self._settler = _Settler(on_tokens)
        self._translate = translate
        self._waiting: list[Turn] = []
        self._arrived = asyncio.Event()
        self._stopping = False
        self._aborted = threading.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="regenerate-decode")
        self._batcher = asyncio.ensure_future(self._serve())

    def submit(self, turn: Turn) -> None:
        """Queue ``turn`` for the next batch; one whose answer alone does not fit the
        memory budget fails with TooLong."""
        prompt = len(turn.prompt)
        width = -(-prompt // WIDTH_BUCKET) * WIDTH_BUCKET
        need = self._footprint.batch(1, width, self.max_new_tokens)
        if need > self.budget:
            self._settler.settle(
                turn, TooLong.of(prompt, self.max_new_tokens, need, self.budget, 1)
            )
            return
        self._waiting.append(turn)
        self._arrived.set()

    def stop(self) -> None:
        """Finish the batch in flight; fail the waiting turns with Stopped."""
        self._stopping = True
        self._fail_waiting(Stopped("stopping: the turn was not started"))

    def abort(self) -> None:
        """End the batch in flight at its next progress check."""
        self._aborted.set()

    async def close(self) -> None:
        """Abort the batch in flight, if any, and wait for it."""
        self.abort()
        self._batcher.cancel()
        await asyncio.gather(self._batcher, return_exceptions=True)
        await asyncio.to_thread(self._executor.shutdown)

    def _fail_waiting(self, error: BaseException) -> None:
        for turn in self._waiting:
            self._settler.settle(turn, error)
        self._waiting = []

    async def _serve(self) -> None:
        """Answer the waiting turns, a batch at a time, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            waiting = -1
            while waiting != len(self._waiting) and len(self._waiting) < self.slots:
                waiting = len(self._waiting)
                await asyncio.sleep(0)  # let the other conversations ask too
            batch, self._waiting = self._waiting[: self.slots], self._waiting[self.slots :]
            if self._waiting:
                self._arrived.set()
            if batch and not self._stopping:
                await loop.run_in_executor(self._executor, self._answer, batch)

    def _answer(self, batch: list[Turn]) -> None:
        """Generate the answers of one batch (on the thread) and hand each back."""
        try:
            answers, _ = self.model.answer(
                [turn.prompt for turn in batch],
                self.max_new_tokens,
                sampler=self.sampler,
                memory_budget=self.budget,
                on_tokens=self._tokens,
            )
        except BaseException as error:  # every conversation of the batch learns why
            failure = self._translate(error)
            for turn in batch:
                self._settler.settle(turn, failure)
            return
        self.batches += 1
        for turn, answer in zip(batch, answers, strict=True):
            self._settler.settle(turn, answer)

    def _tokens(self, count: int) -> None:
        """Progress from the decode loop; raises Aborted there once aborted."""
        if self._aborted.is_set():
            raise Aborted("generation aborted")
        self._settler.tokens(count)
