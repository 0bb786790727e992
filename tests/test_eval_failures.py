"""ringtrain-eval refuses bad settings at once, and a dead worker leaves one named line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringtrain.cli.eval import main, mismatch_error, parse_args
from ringtrain.eval.metrics import EvalReport
from ringtrain.eval.settings import SamplingSettings
from ringtrain.eval.stop import EvalStopped, stopped_by_signals
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.eval_drafters import write_drafter
from tests.helpers.stops import send_stop, start_in_session

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--max-new-tokens", "-3"], "--max-new-tokens: must be 1 or more, got -3"),
        (["--max-new-tokens", "0"], "--max-new-tokens: must be 1 or more, got 0"),
        (["--max-new-tokens", "many"], "--max-new-tokens: must be a whole number"),
        (["--threads", "-1"], "--threads: must be 1 or more, got -1"),
        (["--threads", "0"], "--threads: must be 1 or more, got 0"),
        (["--workers", "0"], "--workers: must be 1 or more, got 0"),
        (["--limit", "-1"], "--limit: must be 0 or more, got -1"),
        (["--tie-ulps", "-1"], "--tie-ulps: must be a finite number of 0 or more"),
        (["--temperature", "-0.5"], "--temperature: must be a finite number of 0 or more"),
        (["--temperature", "nan"], "--temperature: must be a finite number of 0 or more"),
        (["--temperature", "1", "--top-p", "0"], "--top-p 0.0 must be above 0 and at most 1"),
        (["--temperature", "1", "--top-p", "1.5"], "--top-p 1.5 must be above 0 and at most 1"),
        (["--top-p", "0.9"], "--top-p applies when sampling"),
        (["--temperature", "1", "--temperature", "1.0"], "--temperature 1 is given more than once"),
        (["--tie-ulps", "inf"], "--tie-ulps: must be a finite number of 0 or more, got inf"),
        (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs: must be a JSON object such"),
        (["--chat-template-kwargs", "{x"], "--chat-template-kwargs: not valid JSON"),
    ],
)
def test_bad_settings_are_refused_in_one_line_before_anything_loads(
    arguments: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Neither directory exists: a check made later than the arguments would name them.
    missing = ["--target", str(tmp_path / "no-target"), "--drafter", str(tmp_path / "no-run")]
    with pytest.raises(SystemExit) as exit_info:
        main([*missing, "--benchmark", "mt-bench", *arguments])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert named in err


def test_without_prompts_or_a_benchmark_the_fix_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--target", str(tmp_path), "--drafter", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "give --prompts FILE and/or --benchmark NAME" in capsys.readouterr().err


def test_each_temperature_samples_with_the_seed_and_top_p_given() -> None:
    models = ["--target", "t", "--drafter", "d", "--benchmark", "mt-bench"]
    sampling = ["--temperature", "0", "--temperature", "0.7", "--top-p", "0.9", "--seed", "7"]
    args = parse_args([*models, *sampling])
    assert args.samplings == [None, SamplingSettings(0.7, 0.9, 7)]


def _divergence(where: str, margin: float | None) -> dict:
    return {"where": where, "position": 4, "speculative": 11, "greedy": 12, "margin": margin,
            "exact": None}  # fmt: skip


def test_the_divergence_error_counts_them_all_and_lists_five() -> None:
    mismatches = [_divergence(f"prompt {i}", 0.25) for i in range(6)]
    mismatches.append(_divergence("prompt 6", None))
    report = EvalReport(16, 9, 30, 120, 4.0, [0.5], 100.0, 50.0, 2.0, mismatches=mismatches)
    lines = mismatch_error(report).splitlines()
    assert lines[0].startswith(
        "ringtrain-eval: ERROR: speculative output differs from greedy on 7 of 9 prompts"
    )
    assert lines[1:] == [
        f"  prompt {i}, position 4: speculative 11 vs greedy 12, float32 margin 0.25"
        for i in range(5)
    ]
    report.mismatches = mismatches[6:]
    assert mismatch_error(report).splitlines()[1].endswith("float32 margin unmeasured")


def test_help_answers_without_the_model_libraries() -> None:
    probe = (
        "import sys\n"
        "from ringtrain.cli.eval import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as stop:\n"
        "    print(stop.code, sorted({'torch', 'transformers'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "0 []"
    assert "--temperature" in done.stdout and "mt-bench" in done.stdout


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    target = build_tiny_target(tmp_path_factory.mktemp("target"), seed=1, hybrid=False)
    return target, write_drafter(tmp_path_factory.mktemp("run") / "drafter", target)


def test_answers_longer_than_the_context_are_refused_before_the_models_load(
    models: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, drafter = models
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": [5, 6, 7]}) + "\n")
    args = ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts)]
    assert main([*args, "--max-new-tokens", "40000000000"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "does not fit the target's context of 32768 positions" in err


def _children(parent: int) -> dict[int, bytes]:
    """The processes whose parent is ``parent``: {pid: command line}."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            children[int(entry.name)] = command
    return children


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _two_worker_command(
    models: tuple[Path, Path], tmp_path: Path, prompts: int, max_new_tokens: int
) -> list[str]:
    """ringtrain-eval on the CPU with 2 workers over ``prompts`` short prompts written to
    ``tmp_path``."""
    target, drafter = models
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"input_ids": [5, 6, k]}) + "\n" for k in range(prompts)))
    return [
        sys.executable, "-m", "ringtrain.cli.eval", "--target", str(target),
        "--drafter", str(drafter), "--prompts", str(path), "--workers", "2",
        "--threads", "1", "--device", "cpu", "--max-new-tokens", str(max_new_tokens),
    ]  # fmt: skip


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc (Linux)")
def test_a_killed_worker_is_named_with_its_signal(
    models: tuple[Path, Path], tmp_path: Path
) -> None:
    command = _two_worker_command(models, tmp_path, prompts=8, max_new_tokens=64)
    evaluation = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        workers: dict[int, bytes] = {}
        while not workers and time.monotonic() < deadline and evaluation.poll() is None:
            children = _children(evaluation.pid)
            workers = {pid: cmd for pid, cmd in children.items() if b"spawn_main" in cmd}
        assert workers, "no worker process appeared"
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        _, err = evaluation.communicate(timeout=120)
    finally:
        if evaluation.poll() is None:
            evaluation.kill()
    assert evaluation.returncode == 128 + signal.SIGKILL
    last = err.strip().splitlines()[-1]
    assert (
        last.startswith("ringtrain-eval: worker ")
        and f"of 2 (pid {victim}) was killed by SIGKILL" in last
    )
    for unwanted in ("Traceback", "BrokenProcessPool", "leaked semaphore"):
        assert unwanted not in err
    assert not any(_alive(pid) for pid in _children(evaluation.pid) | workers)


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("stop", ["SIGTERM to the command", "SIGINT to the terminal's group"])
def test_a_stopped_evaluation_ends_its_workers_and_says_so_in_one_line(
    stop: str, models: tuple[Path, Path], tmp_path: Path
) -> None:
    command = _two_worker_command(models, tmp_path, prompts=64, max_new_tokens=256)
    evaluation = start_in_session(command, stdout=None)
    signum = signal.SIGTERM if stop.startswith("SIGTERM") else signal.SIGINT
    try:
        # Worker 0 loaded the models. Its line may follow the parent's progress bar on the
        # same line (the bar ends in a carriage return, not a newline).
        read = ""
        while "ringtrain-eval: 64 assistant turns" not in read:
            read = evaluation.stderr.readline()
            assert read, "the evaluation ended before decoding"
        children = _children(evaluation.pid)
        workers = {pid: cmd for pid, cmd in children.items() if b"spawn_main" in cmd}
        assert len(workers) == 2
        send_stop(evaluation, signum)
        _, err = evaluation.communicate(timeout=120)
    finally:
        if evaluation.poll() is None:
            os.killpg(evaluation.pid, signal.SIGKILL)
    assert evaluation.returncode == 128 + signum
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"ringtrain-eval: stopped by {signum.name} ")
    assert "of 64 turns; nothing reported" in last or "before decoding" in last
    for unwanted in ("Traceback", "KeyboardInterrupt", "BrokenPipeError", "leaked semaphore"):
        assert unwanted not in err
    assert not any(_alive(pid) for pid in workers)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_stop_is_raised_with_its_signal_exit_code_and_how_far_it_got(signum: int) -> None:
    """The signal raises EvalStopped named by it, exit code 128 + its number; the line says
    "before decoding" until the evaluation sets the turns in all, then how many were done."""
    with pytest.raises(EvalStopped) as caught, stopped_by_signals():
        signal.raise_signal(signum)
    stop = caught.value
    name = signal.Signals(signum).name
    assert (stop.signal_name, stop.code) == (name, 128 + signum)
    assert stop.describe().startswith(f"stopped by {name} before decoding; nothing reported")
    stop.total = 64
    assert stop.describe().startswith(f"stopped by {name} after 0 of 64 turns; nothing reported")
    stop.done = 5
    assert stop.describe().startswith(f"stopped by {name} after 5 of 64 turns; nothing reported")
