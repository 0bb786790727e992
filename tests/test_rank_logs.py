"""What a rank writes for its users to read (ringtrain/trainer/logs.py): its log file in
<run_dir>/logs, what reaches the terminal (warnings from every rank, progress from the
lead drafter only, each line naming its rank), transformers' kernel fallback notice kept
off the console, and metrics.jsonl as a resumed session opens it. Each rank is a real
process of its own, as under ringtrain-launch, its log file read from disk."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from ringtrain.trainer.logs import MetricsWriter

TIMEOUT_S = 60

# A rank's start as ringtrain.main's: its logging set up, then `body` run; the run
# directory is argv[1].
PRELUDE = """
import sys
from pathlib import Path
from ringtrain.trainer.logs import FILE_ONLY, get_logger, setup_logging
run_dir = Path(sys.argv[1])
log = get_logger()
"""
# A line of a rank log: local time with milliseconds, rank, role, level, message.
LOG_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} rank(\d+) (\w+) (INFO|WARNING|ERROR) (.*)"
)


def _rank(run_dir: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run `body` in a process of its own after PRELUDE; it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + body, str(run_dir)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    return done


def _log_lines(path: Path) -> list[tuple[str, str, str, str]]:
    """(rank, role, level, message) of each line of a rank log; every line must parse."""
    lines = path.read_text(encoding="utf-8").splitlines()
    parsed = [LOG_LINE.fullmatch(line) for line in lines]
    assert all(parsed), lines
    return [m.groups() for m in parsed]


def test_a_rank_writes_every_line_to_its_own_log_file_and_only_warnings_to_the_terminal(
    tmp_path: Path,
) -> None:
    """A target rank (no terminal progress): its info, warnings and file-only lines in
    logs/rank3-target.log (the logs folder made on the way), each naming time, rank, role
    and level; the terminal gets its warning alone, prefixed by its rank."""
    done = _rank(
        tmp_path,
        'path = setup_logging(run_dir, 3, "target", terminal_progress=False)\n'
        "print(path, file=sys.stderr)\n"
        'log.info("target loaded")\n'
        'log.warning("the ring is slow")\n'
        'log.warning("the same on every rank", extra=FILE_ONLY)\n',
    )
    path = tmp_path / "logs" / "rank3-target.log"
    assert done.stderr == f"{path}\n"
    assert [p.name for p in (tmp_path / "logs").iterdir()] == ["rank3-target.log"]
    assert _log_lines(path) == [
        ("3", "target", "INFO", "target loaded"),
        ("3", "target", "WARNING", "the ring is slow"),
        ("3", "target", "WARNING", "the same on every rank"),
    ]
    assert done.stdout == "[rank3 target] the ring is slow\n"


def test_the_lead_drafter_shows_its_progress_on_the_terminal_but_not_file_only_lines(
    tmp_path: Path,
) -> None:
    done = _rank(
        tmp_path,
        'setup_logging(run_dir, 1, "drafter", terminal_progress=True)\n'
        'log.info("step 1 loss 2.5")\n'
        'log.info("checkpoint settings", extra=FILE_ONLY)\n'
        'log.warning("the ring is slow")\n',
    )
    assert done.stdout == "[rank1 drafter] step 1 loss 2.5\n[rank1 drafter] the ring is slow\n"
    assert [line[3] for line in _log_lines(tmp_path / "logs" / "rank1-drafter.log")] == [
        "step 1 loss 2.5",
        "checkpoint settings",
        "the ring is slow",
    ]


def test_a_rank_killed_outright_leaves_every_line_it_logged(tmp_path: Path) -> None:
    """A rank killed without a chance to flush (the OOM killer's SIGKILL) has each line it
    logged on disk, the last one included."""
    rank = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PRELUDE + 'setup_logging(run_dir, 0, "target", terminal_progress=False)\n'
            'log.info("loading the target")\n'
            'log.info("the last line before the kill")\n'
            'print("logged", flush=True)\n'
            "sys.stdin.readline()\n",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout.readline() == "logged\n"
        rank.send_signal(signal.SIGKILL)
        rank.wait(timeout=TIMEOUT_S)
    finally:
        rank.kill()
        rank.stdout.close()
        rank.stdin.close()
    assert rank.returncode == -signal.SIGKILL
    assert [line[3] for line in _log_lines(tmp_path / "logs" / "rank0-target.log")] == [
        "loading the target",
        "the last line before the kill",
    ]


def test_a_resumed_session_appends_to_the_rank_log(tmp_path: Path) -> None:
    for session in ("first", "resumed"):
        _rank(
            tmp_path,
            'setup_logging(run_dir, 2, "drafter", terminal_progress=False)\n'
            f'log.info("{session} session")\n',
        )
    lines = _log_lines(tmp_path / "logs" / "rank2-drafter.log")
    assert [line[3] for line in lines] == ["first session", "resumed session"]


def test_a_second_setup_in_one_process_writes_to_its_own_file_alone(tmp_path: Path) -> None:
    """Setting up another rank's logging in the same process (as tools/bench_pipeline
    does) leaves the first rank's file and terminal stream: each line once, in its
    rank's file."""
    done = _rank(
        tmp_path,
        'setup_logging(run_dir, 0, "target", terminal_progress=False)\n'
        'log.warning("from the target")\n'
        'setup_logging(run_dir, 1, "drafter", terminal_progress=False)\n'
        'log.warning("from the drafter")\n',
    )
    logs = tmp_path / "logs"
    assert [line[3] for line in _log_lines(logs / "rank0-target.log")] == ["from the target"]
    assert [line[3] for line in _log_lines(logs / "rank1-drafter.log")] == ["from the drafter"]
    assert done.stdout == "[rank0 target] from the target\n[rank1 drafter] from the drafter\n"


def test_transformers_kernel_fallback_notice_is_kept_off_the_console(tmp_path: Path) -> None:
    """On a rank that silences them, transformers' notice that a kernel falls back to
    torch is not printed; its other warnings are."""
    done = _rank(
        tmp_path,
        "from transformers.utils import logging as hf_logging\n"
        "from ringtrain.trainer.logs import KERNEL_FALLBACK_LOGGER, silence_kernel_fallbacks\n"
        'setup_logging(run_dir, 0, "target", terminal_progress=False)\n'
        "silence_kernel_fallbacks()\n"
        "kernels = hf_logging.get_logger(KERNEL_FALLBACK_LOGGER)\n"
        'kernels.warning("causal_conv1d is falling back to its reference PyTorch '
        'implementation")\n'
        'kernels.warning("a kernel failed to load")\n',
    )
    assert "falling back" not in done.stderr + done.stdout
    assert "a kernel failed to load" in done.stderr


EARLIER_STEPS = "".join(
    json.dumps({"event": "step", "step": step, "loss": 1.0 / step}) + "\n" for step in (1, 2)
)


def _records(path: Path) -> list[dict]:
    """Every line of metrics.jsonl decoded (a torn line fails here)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_resume_after_a_torn_last_line_cuts_it_and_writes_whole_lines(tmp_path: Path) -> None:
    """A crash mid-write leaves a torn last line: the resumed session's metrics.jsonl is
    whole lines only, its records after the earlier ones, and the log says what was cut."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(EARLIER_STEPS + '{"event": "step", "step": 3, "lo')
    metrics = MetricsWriter(path, resumed_step=2, evaluated_step=2)
    metrics.write({"event": "step", "step": 3, "loss": 0.25})
    metrics.close()
    assert metrics.notes == ["metrics.jsonl: cut a torn last line"]
    records = _records(path)
    assert [(r["event"], r.get("step")) for r in records] == [
        ("step", 1), ("step", 2), ("start", None), ("step", 3)
    ]  # fmt: skip


def test_a_resume_supersedes_later_steps_and_rounds_and_keeps_the_file_before_aside(
    tmp_path: Path,
) -> None:
    """Resumed from a checkpoint at step 3 whose last held-out round was step 2's: the
    records of step 4 and of its round go (the session trains and evaluates them again,
    so each appears once), the file as it was kept as metrics.jsonl.pre-resume."""
    path = tmp_path / "metrics.jsonl"
    later = [
        {"event": "eval", "step": 2, "tau_sim": 3.0}, {"event": "step", "step": 3},
        {"event": "step", "step": 4}, {"event": "eval", "step": 4, "tau_sim": 3.5},
    ]  # fmt: skip
    before = EARLIER_STEPS + "".join(json.dumps(record) + "\n" for record in later)
    path.write_text(before)
    metrics = MetricsWriter(path, resumed_step=3, evaluated_step=2)
    metrics.close()
    assert [(r["event"], r.get("step")) for r in _records(path)] == [
        ("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("start", None)
    ]  # fmt: skip
    assert (tmp_path / "metrics.jsonl.pre-resume").read_text() == before
    assert metrics.notes == [
        "metrics.jsonl: 2 records of steps after step 3 or rounds after step 2 (or torn) "
        "superseded; the file before is kept as metrics.jsonl.pre-resume"
    ]
