"""The lead drafter's reports: every step and evaluation round as a metrics record, the
terminal progress line, and the end-of-run summary.

The ring's verdict (monitor/verdict.py) is judged over the window since the previous
progress line (the first window starts after the first step: start-up excluded) and kept
in that step's record (`verdict`: the window's steps, the line and the split analysis),
so ringtrain-stat shows the very verdict the terminal shows. The summary judges the whole
session after its first step by the same function.
"""

from __future__ import annotations

import time

from ringtrain.config import Config
from ringtrain.monitor.ring_figures import ring_figures
from ringtrain.monitor.verdict import Verdict, ring_judgement
from ringtrain.ring import Ring, RingSnapshot, with_interval
from ringtrain.trainer.logs import MetricsWriter, get_logger
from ringtrain.trainer.step_record import StepRecord


class Progress:
    """Prints `step | tau_sim | tokens/s | loss | acc | tau_uniform | ring` every log_every steps.

    tau_sim (the held-out replay of speculative decoding, from the latest evaluation round)
    leads: it predicts real speed. tau_uniform is the training batches' uniform-anchor
    figure; it overestimates acceptance and is named so nobody mistakes it for it.

    A resumed session starts from `resumed_step`, with `evaluation` (the last held-out
    round in metrics.jsonl, as its record) until it completes a round of its own; its
    summary tells this session's figures from the run's.
    """

    def __init__(
        self, config: Config, ring: Ring, resumed_step: int = 0, evaluation: dict | None = None
    ) -> None:
        self._ring = ring
        self._resumed_step = resumed_step
        self._max_steps = config.run.max_steps
        self._every = max(config.run.log_every, 1)
        self._started = time.perf_counter()
        self._window_start = self._started
        self._window_tokens = 0
        self._tokens = 0
        self._items = 0
        self._window_items = 0
        self._first: StepRecord | None = None
        self._last: StepRecord | None = None
        self._last_ring: RingSnapshot | None = None  # the ring right after the last step
        self._session_start = ring.snapshot()
        # Where the next line's window starts: (step, the ring then); after the first step
        # (start-up excluded) unless the first step has a line of its own.
        self._line_from: tuple[int, RingSnapshot] = (resumed_step, self._session_start)
        self._after_first: tuple[int, RingSnapshot] | None = None
        self._evaluated = evaluation
        self._evaluated_step = 0 if evaluation is None else int(evaluation["step"])

    def snapshot(self) -> RingSnapshot:
        """The ring's statistics now."""
        return self._ring.snapshot()

    def step(self, record: StepRecord, snapshot: RingSnapshot) -> dict | None:
        """Count a completed step (`snapshot`: the ring right after it); every log_every
        steps and at the last, print the progress line and return the verdict entry of the
        step's record (None on other steps)."""
        if self._first is None:
            self._first = record
            self._after_first = (record.step, snapshot)
        self._last, self._last_ring = record, snapshot
        self._tokens += record.tokens
        self._items += len(record.batches)
        self._window_tokens += record.tokens
        self._window_items += len(record.batches)
        if record.step % self._every and record.step != self._max_steps:
            if record.step == self._first.step:
                self._line_from = (record.step, snapshot)
            return None
        now = time.perf_counter()
        rate = self._window_tokens / max(now - self._window_start, 1e-9)
        from_step, before = self._line_from
        window = with_interval(before, snapshot)
        verdict = ring_judgement(window, before, self._window_tokens / max(self._window_items, 1))
        get_logger().info(
            "step %d/%d | %s | %s tok/s | loss %.4f | acc@1 %.3f | tau_uniform %.3f | lr %.2e | %s",
            record.step,
            self._max_steps,
            self._tau_sim_text(),
            f"{rate:,.0f}",
            record.loss,
            record.accuracy[0],
            record.tau_uniform,
            record.lr,
            self._ring_line(window, verdict),
        )
        self._window_start, self._window_tokens, self._window_items = now, 0, 0
        self._line_from = (record.step, snapshot)
        return {"steps": [from_step, record.step], "line": verdict.line, "advice": verdict.advice}

    def _tau_sim_text(self) -> str:
        if self._evaluated is None:
            return "tau_sim - (no evaluation yet)"
        return f"tau_sim {self._evaluated['tau_sim']:.3f} (step {self._evaluated_step})"

    def _session_steps(self, last_step: int) -> str:
        """The steps this session trained: all of them, or after a resume which ones."""
        if not self._resumed_step:
            return f"{last_step} steps"
        count = last_step - self._resumed_step
        return f"this session {count} steps ({self._resumed_step + 1} to {last_step})"

    @staticmethod
    def _ring_line(window: RingSnapshot, verdict: Verdict) -> str:
        """Ring occupancy, the verdict over the window, silent targets and GPU busy."""
        busy = {
            role: [r.gpu_busy for r in window.ranks if r.label == role and r.gpu_busy is not None]
            for role in ("target", "drafter")
        }
        gpu = " ".join(
            f"{role}s {sum(values) / len(values):.0%}" for role, values in busy.items() if values
        )
        silent = "".join(
            f" | target rank {r.rank} silent {r.progress_age_s:.0f} s"
            for r in window.ranks
            if r.label == "target" and r.silent
        )
        return (
            f"ring {window.occupancy:.0%} occupied | {verdict.line}"
            + silent
            + (f" | GPU busy: {gpu}" if gpu else "")
        )

    def evaluation(self, step: int, metrics: dict) -> None:
        """One line per completed held-out evaluation round."""
        self._evaluated, self._evaluated_step = metrics, step
        get_logger().info(
            "eval round %d after step %d | tau_sim %.3f (replayed decoding) | loss %.4f | "
            "acc %.3f | tau_uniform %.3f",
            metrics["round"],
            step,
            metrics["tau_sim"],
            metrics["loss"],
            metrics["accuracy"],
            metrics["tau_uniform"],
        )

    def summary(self) -> None:
        """Closing lines: the held-out tau_sim first, then throughput, loss first -> last,
        tau_uniform, and the split of the node into targets and drafters that the measured
        rates favour."""
        if self._first is None or self._last is None:
            get_logger().info("no training step completed")
            return
        seconds = time.perf_counter() - self._started
        if self._evaluated is not None:
            get_logger().info(
                "held-out after step %d: tau_sim %.3f (replayed speculative decoding), "
                "loss %.4f, acc %.3f",
                self._evaluated_step,
                self._evaluated["tau_sim"],
                self._evaluated["loss"],
                self._evaluated["accuracy"],
            )
        get_logger().info(
            "done: %s, %s tokens in %.1f s (%s tok/s)%s | loss %.4f -> %.4f | "
            "tau_uniform %.3f -> %.3f (training batches, uniform anchors: not acceptance)",
            self._session_steps(self._last.step),
            f"{self._tokens:,}",
            seconds,
            f"{self._tokens / max(seconds, 1e-9):,.0f}",
            f"; run: {self._last.step} steps" if self._resumed_step else "",
            self._first.loss,
            self._last.loss,
            self._first.tau_uniform,
            self._last.tau_uniform,
        )
        self._ring_summary(self._last.step, self._last_ring)

    def _ring_summary(self, last: int, end: RingSnapshot) -> None:
        """The verdict over the session's steps after its first (start-up excluded; the whole
        session when it had one step) up to its last (what follows, a checkpoint and an
        evaluation round, is no training: counted, it would read as a slow drafter) and its
        split analysis; `end`: the ring right after step `last`."""
        start = self._after_first
        if start is None or start[0] >= last:
            start = (self._resumed_step, self._session_start)
        verdict = ring_judgement(end, start[1], self._tokens / max(self._items, 1))
        get_logger().info("ring over steps %d-%d: %s", start[0], last, verdict.line)
        for line in verdict.advice:
            get_logger().info("%s", line)


class LeadReporter:
    """The lead drafter's one reporter of steps and evaluation rounds (trainer/step_record.py's
    Reporter): each becomes one record written through `metrics` and a progress line."""

    def __init__(self, metrics: MetricsWriter, progress: Progress) -> None:
        self.metrics = metrics
        self.progress = progress

    def step(self, record: StepRecord) -> None:
        """A completed training step: its record carries the ring's counters and, at a
        progress line, the line's verdict."""
        snapshot = self.progress.snapshot()
        entry = {"event": "step", **record.as_json(), "ring": ring_figures(snapshot)}
        verdict = self.progress.step(record, snapshot)
        self.metrics.write(entry if verdict is None else {**entry, "verdict": verdict})

    def evaluation(self, step: int, metrics: dict) -> None:
        """A completed held-out evaluation round, after training step `step`."""
        self.metrics.write({"event": "eval", "step": step, **metrics})
        self.progress.evaluation(step, metrics)

    def close(self) -> None:
        """Print the run's summary and close the metrics file."""
        self.progress.summary()
        self.metrics.close()
