"""Regenerate the assistant turns of a chat JSONL file with the target behind a serving engine
or in this process.

DFlash drafters learn the target's own outputs, so a training set is the conversations
of a chat dataset answered again by the target. Here the target runs in any engine with
the OpenAI chat-completions API (vLLM, SGLang), behind one or several URLs, or, with
`local`, in this process (`regen_local.LocalChat`: greedy, batched across the
conversations in flight), and `concurrency` conversations are in flight at once (the
turns of one conversation go in order, each given the regenerated turns before it; see
`regen_records`).

The output is a journal (`regen_journal`): records are appended as they finish, in
completion order, each with its input line; a rerun skips what is done and retries what
failed; one client at a time writes an output (`regen_lock`). Records that fail (bad
input lines, requests that still fail after the retries of `regen_client`) go to
`<output>.errors.jsonl` with the reason. When `max_failures` records in a row fail for
a reason a retry could have fixed, the server is taken to be gone and the run stops with
`ServerGone`. Progress (records, requests/s, generated tokens/s, errors, ETA) is a tqdm
bar; the summary counts the answers cut at `max_tokens` (finish reason `length`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tqdm import tqdm

from ringtrain.data.errors import DatasetError
from ringtrain.data.regen_client import ChatClient, RequestFailed, RetryPolicy, Sampling
from ringtrain.data.regen_journal import Journal, check_settings, errors_path
from ringtrain.data.regen_lock import OutputLock
from ringtrain.data.regen_records import (
    REGENERATION_KEY,
    InputRecord,
    parse_record,
    regenerate_record,
)

if TYPE_CHECKING:
    from ringtrain.data.regen_local import LocalChat, LocalEngine

POSTFIX_INTERVAL_S = 0.5


class ServerGone(Exception):
    """Too many records in a row failed for a server-side reason; the message says what to do."""


@dataclass
class RegenerateOptions:
    """What `regenerate` does: where to send (or, with `local`, which model to run
    here; `sampling.model` then names its directory), what to read and write, how hard
    to try."""

    servers: list[str]
    sampling: Sampling
    input: Path
    output: Path
    concurrency: int = 64
    timeout_s: float = 1800.0
    api_key: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_failures: int = 32
    resume: bool = False
    local: LocalEngine | None = None

    def settings(self) -> dict[str, Any]:
        """The settings that decide the output records (kept beside the output)."""
        return {
            "input": str(self.input.resolve()),
            "model": self.sampling.model,
            "max_tokens": self.sampling.max_tokens,
            "temperature": self.sampling.temperature,
            "chat_template_kwargs": self.sampling.chat_template_kwargs,
        }


@dataclass
class RegenerateTotals:
    """What a run did."""

    records: int = 0  # conversations in the input
    done_before: int = 0  # already in the output when the run started
    written: int = 0
    failed: int = 0
    requests: int = 0
    generated_tokens: int = 0
    truncated: int = 0  # answers cut at max_tokens (finish reason "length")
    seconds: float = 0.0


class _Run:
    """The shared state of one run: totals, the failure streak, the progress bar."""

    def __init__(self, options: RegenerateOptions, journal: Journal, bar: tqdm) -> None:
        self.options = options
        self.journal = journal
        self.bar = bar
        self.totals = RegenerateTotals()
        self.streak = 0
        self.started = self.last_postfix = time.monotonic()

    def record_failed(self, line: int, reason: str, server_fault: bool) -> None:
        """List a failed record; raises ServerGone after `max_failures` server faults in a row."""
        self.journal.write_error(line, f"{self.options.input}:{line}", reason)
        self.totals.failed += 1
        if server_fault:
            self.streak += 1
        else:
            self.note(f"skipped {reason}")
        self._advance()
        if self.streak >= self.options.max_failures:
            raise ServerGone(
                f"stopped: {self.streak} records in a row failed after "
                f"{self.options.retry.retries} retries each; the server looks gone (last "
                f"error: {reason}). Nothing is lost: "
                f"{self.totals.done_before + self.totals.written} records are in "
                f"{self.options.output}; rerun the same command to continue"
            )

    def note(self, message: str) -> None:
        """A line on stderr that leaves the progress bar intact."""
        tqdm.write(f"ringtrain-data: {message}", file=sys.stderr)

    def record_written(self, record: dict[str, Any], tokens: int) -> None:
        """Append a regenerated record; a success ends the failure streak."""
        self.journal.write(record)
        self.totals.written += 1
        turns = record[REGENERATION_KEY]["turns"]
        self.totals.truncated += sum(turn["finish_reason"] == "length" for turn in turns)
        self.totals.generated_tokens += tokens
        self.streak = 0
        self._advance()

    def _advance(self) -> None:
        """One more record on the bar; the rates beside it at most every half second."""
        now = time.monotonic()
        if now - self.last_postfix >= POSTFIX_INTERVAL_S:
            elapsed = now - self.started
            self.bar.set_postfix_str(
                f"{self.totals.requests / elapsed:.1f} req/s, "
                f"{self.totals.generated_tokens / elapsed:.0f} tok/s, "
                f"{self.totals.failed} errors",
                refresh=False,
            )
            self.last_postfix = now
        self.bar.update(1)


def count_records(path: Path) -> int:
    """Non-blank lines of the input file."""
    with path.open("rb") as lines:
        return sum(1 for line in lines if line.strip())


async def _feed(queue: asyncio.Queue, run: _Run, workers: int) -> None:
    """Queue the input's conversations not done yet; bad lines go to the errors file."""
    with run.options.input.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip() or number in run.journal.done:
                continue
            try:
                record = parse_record(line, number, str(run.options.input))
            except DatasetError as exc:
                run.record_failed(number, str(exc), server_fault=False)
                continue
            await queue.put(record)
    for _ in range(workers):
        await queue.put(None)


async def _work(queue: asyncio.Queue, client: ChatClient | LocalChat, run: _Run) -> None:
    """Regenerate queued conversations until the end-of-input marker."""
    while (record := await queue.get()) is not None:
        assert isinstance(record, InputRecord)
        try:
            output, tokens = await regenerate_record(client, record)
        except RequestFailed as error:
            run.record_failed(record.line, str(error), server_fault=error.retryable)
        else:
            run.record_written(output, tokens)
        run.totals.requests = client.requests


async def _regenerate_all(run: _Run, client: ChatClient | LocalChat) -> None:
    """Run the feeder and the workers until the input is done or one of them raises
    (ServerGone from a worker, an unreadable input from the feeder)."""
    workers = run.options.concurrency
    queue: asyncio.Queue = asyncio.Queue(maxsize=2 * workers)
    tasks = [asyncio.ensure_future(_feed(queue, run, workers))]
    tasks += [asyncio.ensure_future(_work(queue, client, run)) for _ in range(workers)]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()


def _client(options: RegenerateOptions) -> ChatClient | LocalChat:
    """The servers' client, or the local model's."""
    if options.local is not None:
        from ringtrain.data.regen_local import LocalChat  # torch: only when asked for

        return LocalChat(options.local, options.sampling)
    return ChatClient(
        options.servers,
        options.sampling,
        concurrency=options.concurrency,
        timeout_s=options.timeout_s,
        api_key=options.api_key,
        retry=options.retry,
    )


async def _main(run: _Run) -> None:
    client = _client(run.options)
    await client.open()
    try:
        try:
            await client.check_model()
        except RequestFailed as error:
            raise ServerGone(str(error)) from None
        await _regenerate_all(run, client)
    finally:
        run.totals.requests = client.requests
        await client.aclose()


def regenerate(
    options: RegenerateOptions, progress: TextIO | None = sys.stderr
) -> RegenerateTotals:
    """Regenerate `options.input` into `options.output` (resuming it); returns the totals.

    Raises DatasetError for unusable settings or files or an output another client is
    writing, ServerGone when the server stops answering; bad records and failed requests
    are listed in the errors file instead."""
    if not options.input.is_file():
        raise DatasetError(f"{options.input}: no such input file")
    if options.concurrency < 1:
        raise DatasetError(f"concurrency must be at least 1, not {options.concurrency}")
    if options.local is not None:
        from ringtrain.data.regen_local import check_local  # torch: only when asked for

        check_local(options.local, options.sampling)
    with OutputLock(options.output) as lock:
        check_settings(options.output, options.settings(), options.resume)
        return _regenerate_locked(options, progress, lock)


def _regenerate_locked(
    options: RegenerateOptions, progress: TextIO | None, lock: OutputLock
) -> RegenerateTotals:
    """`regenerate` once this client holds the output's lock."""
    journal = Journal(options.output)
    records = count_records(options.input)
    bar = tqdm(
        total=records,
        initial=len(journal.done),
        desc="regenerate",
        unit="rec",
        file=progress,
        disable=progress is None,
        dynamic_ncols=True,
    )
    run = _Run(options, journal, bar)
    run.totals.records, run.totals.done_before = records, len(journal.done)
    if lock.taken_over:
        run.note(f"took over the lock of {lock.taken_over}, which is no longer running")
    if journal.cut_bytes:
        run.note(f"dropped the torn last line of {options.output} ({journal.cut_bytes} bytes)")
    try:
        asyncio.run(_main(run))
    finally:
        bar.close()
        journal.close()
        run.totals.seconds = time.monotonic() - run.started
    return run.totals


def summary(options: RegenerateOptions, totals: RegenerateTotals) -> str:
    """One line on what a finished run did."""
    line = (
        f"{options.output}: {totals.written} records regenerated in {totals.seconds:.1f} s "
        f"({totals.done_before} done before, {totals.records} in the input), "
        f"{totals.requests} requests, {totals.generated_tokens} tokens generated, "
        f"{totals.truncated} answers cut at --max-tokens"
    )
    if totals.failed:
        line += (
            f"; {totals.failed} records failed, listed with the reason in "
            f"{errors_path(options.output)} (a rerun retries them)"
        )
    return line
