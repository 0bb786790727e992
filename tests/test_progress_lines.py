"""The lead drafter's progress lines and summary: a line at the last step, figures over
the line's own window, and a resumed session told apart from the run."""

from __future__ import annotations

import logging
from dataclasses import replace
from importlib import resources

import pytest

from ringtrain.config import Config, parse_config
from ringtrain.monitor.verdict import ring_judgement
from ringtrain.ring import RingSnapshot, with_interval
from ringtrain.trainer import progress as progress_module
from ringtrain.trainer.logs import LOGGER_NAME
from ringtrain.trainer.progress import Progress
from ringtrain.trainer.step_record import StepRecord
from tests.helpers.clock import Clock, set_clock
from tests.helpers.monitor_records import lead_step
from tests.helpers.ring_snapshots import rank, snapshot


class ScriptedRing:
    """A ring whose snapshots are given in advance, one per call."""

    def __init__(self, snapshots: list[RingSnapshot]) -> None:
        self._snapshots = iter(snapshots)

    def snapshot(self) -> RingSnapshot:
        return next(self._snapshots)


def _config(*overrides: str) -> Config:
    text = resources.files("ringtrain").joinpath("tiny.toml").read_text(encoding="utf-8")
    return parse_config(text, "<tiny.toml>", list(overrides))


def _ring_at(t: float, produced: int, consumed: int) -> RingSnapshot:
    """1 target blocked 60% of its time and 1 drafter never starved, attached at t = 0."""
    ranks = [rank(0, "target", produced, t, 0.6 * t), rank(1, "drafter", consumed, t, 0.0)]
    return snapshot(ranks, taken_s=t)


def _record(step: int, tokens: int = 1000) -> StepRecord:
    return lead_step(step, tokens, seconds=1.0)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return set_clock(monkeypatch, progress_module)


def _lines(caplog: pytest.LogCaptureFixture, prefix: str) -> list[str]:
    return [m for m in caplog.messages if m.startswith(prefix)]


def test_the_last_step_has_a_line_off_the_log_every_grid(caplog: pytest.LogCaptureFixture) -> None:
    ring = ScriptedRing([_ring_at(1.0, 0, 0), _ring_at(40.0, 30, 4)])
    progress = Progress(_config("run.max_steps=3", "run.log_every=2"), ring)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        entries = [progress.step(_record(s), _ring_at(10.0 * s, 5 * s, s)) for s in (1, 2, 3)]
    assert entries[0] is None
    assert [entry["steps"] for entry in entries[1:]] == [[1, 2], [2, 3]]
    assert len(_lines(caplog, "step 2/3 |")) == 1 and len(_lines(caplog, "step 3/3 |")) == 1


def test_a_line_shows_the_steps_loss_first_slot_accuracy_tau_uniform_and_lr(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ring = ScriptedRing([_ring_at(1.0, 0, 0)])
    progress = Progress(_config("run.max_steps=10", "run.log_every=1"), ring)
    record = replace(_record(1), loss=1.23456, accuracy=[0.75, 0.5, 0.25], tau_uniform=2.5, lr=3e-4)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        progress.step(record, _ring_at(10.0, 5, 1))
    (line,) = _lines(caplog, "step 1/10 |")
    assert "| loss 1.2346 | acc@1 0.750 | tau_uniform 2.500 | lr 3.00e-04 |" in line, line


def test_a_lines_rate_and_verdict_are_over_its_own_window(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Steps 1-2 of 1000 tokens take 12 s with start-up; steps 3-4 of 3000 tokens 4 s: the
    second line says 6000 tokens / 4 s, its verdict in tok/s at 3000 tokens a batch."""
    ring = ScriptedRing([_ring_at(1.0, 0, 0)])
    progress = Progress(_config("run.max_steps=8", "run.log_every=2"), ring)
    timeline = {1: (10.0, 1000), 2: (12.0, 1000), 3: (14.0, 3000), 4: (16.0, 3000)}
    snapshots = {s: _ring_at(t, 5 * s, s) for s, (t, _) in timeline.items()}
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        for step, (t, tokens) in timeline.items():
            clock.now = t
            entry = progress.step(_record(step, tokens), snapshots[step])
    (line,) = _lines(caplog, "step 4/8 |")
    assert "| 1,500 tok/s |" in line
    expected = ring_judgement(
        with_interval(snapshots[2], snapshots[4]), snapshots[2], tokens_per_item=3000
    )
    assert expected.advice
    assert entry == {"steps": [2, 4], "line": expected.line, "advice": expected.advice}


def test_a_resumed_session_shows_the_runs_last_round_and_counts_its_own_steps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    evaluation = {"step": 4, "tau_sim": 1.25, "loss": 1.5, "accuracy": 0.4}
    start, end = _ring_at(50.0, 40, 8), _ring_at(80.0, 60, 10)
    ring = ScriptedRing([start, end])
    config = _config("run.max_steps=6", "run.log_every=1")
    progress = Progress(config, ring, resumed_step=4, evaluation=evaluation)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        progress.step(_record(5), _ring_at(60.0, 50, 9))
        progress.step(_record(6), end)
        progress.summary()
    (line,) = _lines(caplog, "step 5/6 |")
    assert "| tau_sim 1.250 (step 4) |" in line
    (done,) = _lines(caplog, "done: ")
    assert done.startswith("done: this session 2 steps (5 to 6), 2,000 tokens in ")
    assert "; run: 6 steps |" in done


def test_a_one_step_session_is_judged_over_that_step(caplog: pytest.LogCaptureFixture) -> None:
    """With one step there is nothing after the first step: the summary judges the whole
    session (from the resumed step 5), not an empty window."""
    start, after = _ring_at(50.0, 40, 8), _ring_at(60.0, 50, 9)
    progress = Progress(_config("run.max_steps=6"), ScriptedRing([start]), resumed_step=5)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        progress.step(_record(6), after)
        progress.summary()
    expected = ring_judgement(after, start, tokens_per_item=1000)
    assert f"ring over steps 5-6: {expected.line}" in caplog.messages
    assert expected.advice and caplog.messages[-len(expected.advice) :] == expected.advice


def test_the_summary_judges_the_steps_not_the_checkpoint_after_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After the last step the drafter saves a checkpoint and runs an evaluation round,
    not starved and consuming nothing: the summary's rates end at the last step, so its
    advice measures the training (1 batch a second here), not 2 batches in 12 s."""
    start = _ring_at(1.0, 0, 0)
    steps = {s: _ring_at(float(s), 5 * s, s) for s in (1, 2, 3)}
    after_the_checkpoint = _ring_at(13.0, 15, 3)
    progress = Progress(
        _config("run.max_steps=3", "run.log_every=10"), ScriptedRing([start, after_the_checkpoint])
    )
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        for step, ring in steps.items():
            progress.step(_record(step), ring)
        progress.summary()
    expected = ring_judgement(steps[3], steps[1], tokens_per_item=1000)
    assert f"ring over steps 1-3: {expected.line}" in caplog.messages
    assert any("one drafter takes 1,000 tok/s" in line for line in expected.advice)
    assert caplog.messages[-len(expected.advice) :] == expected.advice
