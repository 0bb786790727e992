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
`ServerGone`. Progress (records, requests/s, errors, ETA, and with `local` the tokens
generated and their rate, updated as the model generates them) is a tqdm bar; the
summary counts the answers cut at `max_tokens` (finish reason `length`).

With `local`, the first Ctrl-C (or SIGTERM, ringtrain.interrupts) stops taking new
conversations: the answers in flight finish and their records are written, then the run
ends (`RegenerateTotals.stopped_by`); a second aborts at once (KeyboardInterrupt, or
`Terminated` for SIGTERM). With servers, whose answers in flight
are not this process's work, the first Ctrl-C aborts. Either way the output keeps every
record written and a rerun continues it. A run that leaves the output without a record
removes it with its settings and lock files, so a failed first try never blocks the
next one.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tqdm import tqdm

from ringtrain.data.errors import DatasetError
from ringtrain.data.regen_client import ChatClient, RequestFailed, RetryPolicy, Sampling, Stopped
from ringtrain.data.regen_journal import Journal, check_settings, errors_path, remove_if_empty
from ringtrain.data.regen_lock import OutputLock
from ringtrain.data.regen_records import (
    REGENERATION_KEY,
    InputRecord,
    parse_record,
    regenerate_record,
)
from ringtrain.interrupts import CTRL_C, SIGTERM, Terminated, raise_taken_stop

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
        """The settings that decide the output records (kept beside the output); a local
        model is named by its files' content, not its path."""
        model = self.sampling.model
        if self.local is not None:
            from ringtrain.generate.fingerprint import model_fingerprint

            model = f"local model, files {model_fingerprint(self.local.model_dir)}"
        settings = {
            "input": str(self.input.resolve()),
            "model": model,
            "max_tokens": self.sampling.max_tokens,
            "temperature": self.sampling.temperature,
            "chat_template_kwargs": self.sampling.chat_template_kwargs,
        }
        if self.sampling.top_p < 1:
            settings["top_p"] = self.sampling.top_p
        if self.local is not None and self.sampling.temperature > 0:
            settings["seed"] = self.local.seed
        return settings


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
    # What ended the run early, after the answers in flight ("Ctrl-C" or "SIGTERM"; "": none).
    stopped_by: str = ""


class _Run:
    """The shared state of one run: totals, the failure streak, the progress bar, and
    whether Ctrl-C asked it to stop."""

    def __init__(self, options: RegenerateOptions, journal: Journal, bar: tqdm) -> None:
        self.options = options
        self.journal = journal
        self.bar = bar
        self.totals = RegenerateTotals()
        self.streak = 0
        self.started = self.last_postfix = time.monotonic()
        self.generating_since = self.started
        self.live_tokens = 0  # generated so far, as the local model reports them
        # The latest stop asked for ("Ctrl-C" or "SIGTERM"; "" none): the first stops
        # taking conversations, a second aborts.
        self.stopped_by = ""
        self.client: ChatClient | LocalChat | None = None

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

    def tokens_generated(self, count: int) -> None:
        """The local model generated `count` more tokens: the bar's token count and rate
        move with them (redrawn at most every half second)."""
        self.live_tokens += count
        self._postfix(redraw=True)

    def interrupt(self, task: asyncio.Task, name: str) -> None:
        """Ctrl-C or SIGTERM (``name``): the first stops taking conversations, the second
        aborts."""
        first = not self.stopped_by
        self.stopped_by = name
        if first:
            getattr(self.client, "stop", lambda: None)()
            self.note(
                f"stopping ({name}): the answers in flight finish and their records are "
                "written; press Ctrl-C again to abort"
            )
            return
        self.note("aborting")
        getattr(self.client, "abort", lambda: None)()
        task.cancel()

    def _postfix(self, redraw: bool) -> None:
        """The rates beside the bar, at most every half second."""
        now = time.monotonic()
        if now - self.last_postfix < POSTFIX_INTERVAL_S:
            return
        elapsed = now - self.started
        tokens = self.live_tokens or self.totals.generated_tokens
        rate = tokens / max(now - self.generating_since, 1e-9)
        self.bar.set_postfix_str(
            f"{self.totals.requests / elapsed:.1f} req/s, {tokens} tok at {rate:.0f} tok/s, "
            f"{self.totals.failed} errors",
            refresh=redraw,
        )
        self.last_postfix = now

    def _advance(self) -> None:
        """One more record on the bar, the rates beside it."""
        self._postfix(redraw=False)
        self.bar.update(1)


def count_records(path: Path) -> int:
    """Non-blank lines of the input file."""
    with path.open("rb") as lines:
        return sum(1 for line in lines if line.strip())


async def _feed(queue: asyncio.Queue, run: _Run, workers: int) -> None:
    """Queue the input's conversations not done yet; bad lines go to the errors file."""
    with run.options.input.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if run.stopped_by:
                break
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
    """Regenerate queued conversations until the end-of-input marker (once stopping,
    the queued ones are left for the next run)."""
    while (record := await queue.get()) is not None:
        assert isinstance(record, InputRecord)
        if run.stopped_by:
            continue
        raise_taken_stop()
        try:
            output, tokens = await regenerate_record(client, record)
        except Stopped:
            continue
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


def _client(run: _Run) -> ChatClient | LocalChat:
    """The servers' client, or the local model's."""
    options = run.options
    if options.local is not None:
        from ringtrain.data.regen_local import LocalChat  # torch: only when asked for

        return LocalChat(options.local, options.sampling, run.tokens_generated)
    return ChatClient(
        options.servers,
        options.sampling,
        concurrency=options.concurrency,
        timeout_s=options.timeout_s,
        api_key=options.api_key,
        retry=options.retry,
    )


async def _main(run: _Run) -> None:
    client = run.client = _client(run)
    loop = asyncio.get_running_loop()
    main_thread = threading.current_thread() is threading.main_thread()
    hears_signals = run.options.local is not None and main_thread
    stops = ((signal.SIGINT, CTRL_C), (signal.SIGTERM, SIGTERM))
    previous = {signum: signal.getsignal(signum) for signum, _ in stops}
    if hears_signals:
        for signum, name in stops:
            loop.add_signal_handler(signum, run.interrupt, asyncio.current_task(), name)
    try:
        await client.open()
        if run.options.local is not None:
            run.note(f"generating with {client.description}")
        run.generating_since = time.monotonic()
        try:
            await client.check_model()
        except RequestFailed as error:
            raise ServerGone(str(error)) from None
        await _regenerate_all(run, client)
    finally:
        if hears_signals:
            for signum, _ in stops:  # asyncio leaves them to the default action
                loop.remove_signal_handler(signum)
                signal.signal(signum, previous[signum])
        run.totals.requests = client.requests
        run.totals.stopped_by = run.stopped_by
        await client.aclose()


def regenerate(options: RegenerateOptions, progress: TextIO | None = None) -> RegenerateTotals:
    """Regenerate `options.input` into `options.output` (resuming it); returns the totals,
    with a progress bar on `progress` (None: none).

    Raises DatasetError for unusable settings or files or an output another client is
    writing, ServerGone when the server stops answering, KeyboardInterrupt when aborted
    (a second Ctrl-C); bad records and failed requests are listed in the errors file
    instead. With `local`, the device's defaults fill in `sampling.max_tokens` (None)
    and the batch size, and twice the batch size of conversations are in flight."""
    if not options.input.is_file():
        raise DatasetError(f"{options.input}: no such input file")
    if options.concurrency < 1:
        raise DatasetError(f"concurrency must be at least 1, not {options.concurrency}")
    if options.local is not None:
        from ringtrain.data.regen_local import prepare_local  # torch: only when asked for

        local, sampling = prepare_local(options.local, options.sampling)
        options = replace(options, local=local, sampling=sampling, concurrency=2 * local.batch_size)
    with OutputLock(options.output) as lock:
        try:
            check_settings(options.output, options.settings(), options.resume)
            return _regenerate_locked(options, progress, lock)
        finally:
            if remove_if_empty(options.output):
                lock.release(remove=True)


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
    except asyncio.CancelledError:  # the second Ctrl-C or SIGTERM
        raise (Terminated if run.stopped_by == SIGTERM else KeyboardInterrupt)() from None
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
