"""Fixtures shared by several test modules (each module opts in by name), a live line for
long tests: one that has run LIVE_AFTER_S gets a line naming it (again every LIVE_EVERY_S)
and its duration when it ends, so a quiet terminal (-q, CI) shows what runs; a
temporary directory of the session's own for the processes the tests start; the CPU's
vector math settled before any test computes; and a guard that fails a test which leaves
pytest's own stop signals routed elsewhere."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ringtrain.cpu_math import settle_cpu_math
from ringtrain.interrupts import STOP_SIGNALS
from tests.helpers.chat_data import write_chats, write_tokenizer


@pytest.fixture(scope="session", autouse=True)
def settled_cpu_math() -> None:
    """oneMKL's vector math with its kernels chosen before a test's first computation
    (ringtrain/cpu_math.py), as every process of a run has them at its start."""
    settle_cpu_math()


@pytest.fixture(scope="session", autouse=True)
def children_temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """TMPDIR of every process the tests start: a folder under the session's own temporary
    one, which pytest cleans up with it. torch's launcher, run plainly, leaves a directory
    of its own in the temporary directory at every launch (ringtrain-launch removes its)."""
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("children-tmp"))
    yield
    if before is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = before


@pytest.fixture(autouse=True)
def stop_signals_left_alone() -> Iterator[None]:
    """Fail a test that leaves SIGTERM or SIGINT handled otherwise than before it, e.g. by
    running ringtrain.main in-process past its stop handlers (trainer/signals.py): those
    end the whole process on a signal in start-up, so they belong in the processes the
    tests start, never in pytest's. The handlers are put back before the failure."""
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    yield
    changed = [s.name for s, handler in before.items() if signal.getsignal(s) is not handler]
    for signum, handler in before.items():
        signal.signal(signum, handler)
    if changed:
        signal.set_wakeup_fd(-1)
        pytest.fail(
            f"the test left {' and '.join(changed)} handled by its own handler: run what "
            "installs it in a process of its own, or restore the handler"
        )


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One CPU thread for a whole module (so also for its module-scoped fixtures): tiny
    models run fastest so, also when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Qwen-style chat tokenizer on disk (tests.chat_data)."""
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def chats(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests.chat_data's conversations as a chat JSONL file."""
    return write_chats(tmp_path_factory.mktemp("chats") / "chats.jsonl")


LIVE_AFTER_S = 30.0
LIVE_EVERY_S = 60.0


def _say(config: pytest.Config, line: str) -> None:
    """Print `line` on a line of its own on the terminal, past pytest's output capture."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        return
    terminal = config.get_terminal_writer()
    with capture.global_and_fixture_disabled():
        if terminal.width_of_current_line:
            terminal.line()
        terminal.line(line)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Name a test that runs long while it runs, and give its duration when it ends."""
    started, done = time.monotonic(), threading.Event()

    def watch() -> None:
        wait = LIVE_AFTER_S
        while not done.wait(wait):
            _say(item.config, f"... {item.nodeid}: running for {time.monotonic() - started:.0f} s")
            wait = LIVE_EVERY_S

    watcher = threading.Thread(target=watch, name="live-line", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        if (seconds := time.monotonic() - started) >= LIVE_AFTER_S:
            _say(item.config, f"... {item.nodeid}: {seconds:.0f} s")
