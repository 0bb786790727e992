"""regenerate --local's drivers, driven directly with a tiny real model written with
save_pretrained that never ends its answers: the tokens reported are the answers' own
(a turn refused for memory adds none), an abort fails the turns in flight and those still
queued with the translated failure, a batch turn is refused for memory at its padded
width (one that fits exactly is answered), turns asking a loop pass apart share a batch,
and a stop lets the batch in flight finish while the turns waiting fail with Stopped.

A forward pre-hook holds the model's first forward on the decoding thread until the test
has acted, so "while a turn is in flight" is a fact, not a race."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ringtrain.data.regen_client import Stopped
from ringtrain.data.regen_drivers import Aborted, BatchDriver, SlotDriver, Turn
from ringtrain.generate.continuous import DoesNotFit, TooLong, plan_slots
from ringtrain.generate.greedy import WIDTH_BUCKET, Answer
from ringtrain.generate.local_model import LocalModel
from ringtrain.generate.memory import DecodeFootprint
from tests.helpers.endless_chat_model import write_endless_chat_model

pytestmark = pytest.mark.usefixtures("one_thread")

NEW_TOKENS = 8
LONG_ANSWER = 40
PLENTY = 1 << 30
WAIT_S = 60


class Ended(Exception):
    """What the tests' translate makes of the error that ended generation."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"translated: {error}")
        self.error = error


def _translate(error: BaseException) -> BaseException:
    return Ended(error)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The endless chat model (tests/helpers/endless_chat_model.py), dense."""
    return write_endless_chat_model(tmp_path_factory.mktemp("endless"))


@pytest.fixture
def local(model_dir: Path) -> LocalModel:
    return LocalModel.load(model_dir, "cpu", "float32", batch_size=2)


def _prompt(first: int, length: int) -> list[int]:
    return [3 + (first * 7 + j) % 300 for j in range(length)]


def _turn(prompt: list[int]) -> Turn:
    return Turn(prompt, asyncio.get_running_loop().create_future())


class FirstForwardHeld:
    """Holds the model's first forward, on whichever thread runs it, until ``release``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.entered, self._release = threading.Event(), threading.Event()
        self._handle = model.register_forward_pre_hook(self._hold)

    def _hold(self, module: torch.nn.Module, args: tuple) -> None:
        if not self.entered.is_set():
            self.entered.set()
            assert self._release.wait(WAIT_S), "the test never released the forward"

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, WAIT_S), "no forward started"

    def release(self) -> None:
        self._release.set()
        self._handle.remove()


def _outcome(turn: Turn) -> Answer | BaseException:
    """The settled outcome of ``turn`` (failing the test when it was never settled)."""
    assert turn.answer.done(), "the turn was never answered nor failed"
    return turn.answer.exception() or turn.answer.result()


def _least_budget(footprint: DecodeFootprint, new_tokens: int) -> int:
    """The smallest budget that plans one answer of ``new_tokens`` (by bisection)."""

    def fits(budget: int) -> bool:
        try:
            plan_slots(footprint, budget, 1, new_tokens)
        except DoesNotFit:
            return False
        return True

    low, high = 0, PLENTY
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high


def test_a_turn_refused_for_memory_reports_no_token_the_others_all_theirs(
    local: LocalModel,
) -> None:
    """At the least budget that plans an answer, a prompt longer than that plan is refused
    at admission with TooLong; the tokens reported add up to the other answers' exactly."""
    footprint = DecodeFootprint.of(local.model.config, torch.float32)
    budget = _least_budget(footprint, NEW_TOKENS)
    short = [_prompt(i, 5 + i) for i in range(3)]
    long = _prompt(9, 4 * WIDTH_BUCKET)
    heard: list[int] = []

    async def run() -> list[Turn]:
        driver = SlotDriver(local, 2, NEW_TOKENS, budget, heard.append, _translate)
        turns = [_turn(p) for p in (short[0], long, *short[1:])]
        for turn in turns:
            driver.submit(turn)
        await asyncio.gather(*(t.answer for t in turns), return_exceptions=True)
        await driver.close()
        return turns

    outcomes = [_outcome(turn) for turn in asyncio.run(run())]
    assert isinstance(outcomes[1], TooLong)
    assert f"a prompt of {len(long)} tokens" in str(outcomes[1])
    answers = [outcomes[0], *outcomes[2:]]
    assert [len(a.tokens) for a in answers] == [NEW_TOKENS] * 3
    assert sum(heard) == 3 * NEW_TOKENS


def test_an_abort_fails_the_turn_in_flight_and_those_queued_with_the_translated_error(
    local: LocalModel,
) -> None:
    held = FirstForwardHeld(local.model)

    async def run() -> list[Turn]:
        driver = SlotDriver(local, 1, LONG_ANSWER, PLENTY, None, _translate)
        turns = [_turn(_prompt(i, 6)) for i in range(3)]
        try:
            driver.submit(turns[0])
            await held.wait_entered()  # the first turn is in its slot, the one slot
            driver.submit(turns[1])
            driver.submit(turns[2])
            driver.abort()
        finally:
            held.release()
        await driver.close()
        return turns

    for turn in asyncio.run(run()):
        failure = _outcome(turn)
        assert isinstance(failure, Ended), failure
        assert isinstance(failure.error, Aborted)


def test_a_batch_turn_is_refused_for_memory_at_its_padded_width(local: LocalModel) -> None:
    """The budget is exactly what one answer after a prompt padded to two width buckets
    needs: a prompt one token over one bucket is answered, one over two buckets is
    refused with TooLong (and the other answered all the same)."""
    footprint = DecodeFootprint.of(local.model.config, torch.float32)
    budget = footprint.batch(1, 2 * WIDTH_BUCKET, NEW_TOKENS)
    fits, too_wide = _prompt(1, WIDTH_BUCKET + 1), _prompt(2, 2 * WIDTH_BUCKET + 1)

    async def run() -> list[Turn]:
        driver = BatchDriver(local, 2, NEW_TOKENS, budget, None, _translate)
        turns = [_turn(fits), _turn(too_wide)]
        for turn in turns:
            driver.submit(turn)
        await asyncio.gather(*(t.answer for t in turns), return_exceptions=True)
        await driver.close()
        return turns

    answered, refused = (_outcome(turn) for turn in asyncio.run(run()))
    assert isinstance(answered, Answer) and len(answered.tokens) == NEW_TOKENS
    assert isinstance(refused, TooLong)
    assert f"a prompt of {len(too_wide)} tokens" in str(refused)


def test_turns_asking_a_loop_pass_apart_share_a_batch(local: LocalModel) -> None:
    """A second conversation asks one pass of the event loop after the first (as one does
    that was busy with its last answer): both are answered by one batch, each as alone."""
    prompts = [_prompt(1, 7), _prompt(2, 11)]
    alone = [local.answer([p], NEW_TOKENS)[0][0] for p in prompts]

    async def run() -> tuple[list[Answer | BaseException], int]:
        driver = BatchDriver(local, 2, NEW_TOKENS, PLENTY, None, _translate)
        turns = [_turn(p) for p in prompts]
        driver.submit(turns[0])
        await asyncio.sleep(0)  # one pass of the event loop, not a wait for time
        driver.submit(turns[1])
        await asyncio.gather(*(t.answer for t in turns), return_exceptions=True)
        await driver.close()
        return [_outcome(turn) for turn in turns], driver.batches

    outcomes, batches = asyncio.run(run())
    assert outcomes == alone
    assert batches == 1


def _batch_driver_run(
    local: LocalModel, act: Callable[[BatchDriver], None], heard: list[int]
) -> list[Turn]:
    """Two turns to a one-slot BatchDriver; ``act`` runs while the first one's batch is
    held in its first forward."""
    held = FirstForwardHeld(local.model)

    async def run() -> list[Turn]:
        driver = BatchDriver(local, 1, LONG_ANSWER, PLENTY, heard.append, _translate)
        turns = [_turn(_prompt(i, 6)) for i in range(2)]
        try:
            for turn in turns:
                driver.submit(turn)
            await held.wait_entered()
            act(driver)
        finally:
            held.release()
        await asyncio.gather(turns[0].answer, return_exceptions=True)
        await driver.close()
        return turns

    return asyncio.run(run())


def test_a_stop_finishes_the_batch_in_flight_and_fails_the_waiting_turns(
    local: LocalModel,
) -> None:
    heard: list[int] = []
    in_flight, waiting = _batch_driver_run(local, BatchDriver.stop, heard)
    answer = _outcome(in_flight)
    assert isinstance(answer, Answer)
    assert len(answer.tokens) == LONG_ANSWER and answer.truncated
    stopped = _outcome(waiting)
    assert isinstance(stopped, Stopped) and "the turn was not started" in str(stopped)
    assert sum(heard) == LONG_ANSWER


def test_an_abort_ends_the_batch_in_flight_at_its_next_progress_check(
    local: LocalModel,
) -> None:
    heard: list[int] = []
    in_flight, _ = _batch_driver_run(local, BatchDriver.abort, heard)
    failure = _outcome(in_flight)
    assert isinstance(failure, Ended), failure
    assert isinstance(failure.error, Aborted)
    assert heard == []  # aborted before its first progress report
