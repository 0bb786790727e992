"""ringtrain-stat's command line, in-process against a real ring of this process: which of
listing, one look and watching each set of arguments gives, the refusal of a bad interval
and of a ring that is not there, --clean's report, and a quiet end on Ctrl-C or when the
reader of the output goes away."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringtrain.cli.stat import main
from ringtrain.monitor import stat_view
from ringtrain.ring import Ring, RingLocation
from ringtrain.ring import names as ring_names
from tests.helpers import ring_workers as rw

NOBODY = 65534


@pytest.fixture
def ranks() -> Iterator[list[Ring]]:
    """A live ring of this process: its target (creator) and drafter rank."""
    rings = rw.in_process_ranks(1, 1)
    yield rings
    rw.close_ranks(rings)


@pytest.fixture
def sleeps(ranks: list[Ring], monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits between refreshes; the first one ends the run (both ranks close)."""
    waited: list[float] = []

    def wait(seconds: float) -> None:
        waited.append(seconds)
        rw.close_ranks(ranks)

    monkeypatch.setattr(stat_view.time, "sleep", wait)
    return waited


def _only(ranks: list[Ring], monkeypatch: pytest.MonkeyPatch) -> str:
    """The ring's id, with discovery seeing no other ring of this host."""
    run = ranks[0].spec.run_id
    found = [r for r in stat_view.discover() if r.run == run]
    assert len(found) == 1
    monkeypatch.setattr(stat_view, "discover", lambda: found)
    return run


def _documents(out: str) -> list[object]:
    return [json.loads(line) for line in out.splitlines() if line]


def test_a_named_ring_is_shown_once(
    ranks: list[Ring], sleeps: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    run = ranks[0].spec.run_id
    assert main([run, "--json"]) == 0
    (report,) = _documents(capsys.readouterr().out)
    assert report["run"] == run and report["ended"] is False
    assert [r["label"] for r in report["ranks"]] == ["target", "drafter"]
    assert sleeps == []
    assert main([run]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ring {run}") and "has ended" not in out
    assert sleeps == []


def test_watch_refreshes_every_interval_until_the_run_ends(
    ranks: list[Ring], sleeps: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    run = ranks[0].spec.run_id
    assert main([run, "--watch", "--json", "--interval", "0.25"]) == 0
    reports = _documents(capsys.readouterr().out)
    assert [r["ended"] for r in reports] == [False, True]
    assert sleeps == [0.25]


def test_watch_without_a_run_watches_the_only_ring(
    ranks: list[Ring],
    sleeps: list[float],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = _only(ranks, monkeypatch)
    assert main(["--watch", "--json"]) == 0
    reports = _documents(capsys.readouterr().out)
    assert [(r["run"], r["ended"]) for r in reports] == [(run, False), (run, True)]
    assert sleeps == [2.0]


def test_without_a_run_the_rings_are_listed(
    ranks: list[Ring], capsys: pytest.CaptureFixture[str]
) -> None:
    run = ranks[0].spec.run_id
    assert main(["--json"]) == 0
    (listed,) = _documents(capsys.readouterr().out)
    assert [entry["pids"] for entry in listed if entry["run"] == run] == [[os.getpid()]]
    assert main([]) == 0
    assert f"{run}  (mapped by pids {os.getpid()})" in capsys.readouterr().out


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_all_lists_other_users_rings(
    ranks: list[Ring],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = _only(ranks, monkeypatch)
    theirs = tmp_path / "theirs.ctl"
    theirs.write_bytes(b"")
    os.chown(theirs, NOBODY, NOBODY)
    rings = [*stat_view.discover(), RingLocation("theirs-n0", str(theirs), (1,))]
    monkeypatch.setattr(stat_view, "discover", lambda: rings)
    assert main(["--json"]) == 0
    assert [entry["run"] for entry in _documents(capsys.readouterr().out)[0]] == [run]
    assert main(["--json", "--all"]) == 0
    listed = _documents(capsys.readouterr().out)[0]
    assert [entry["run"] for entry in listed] == [run, "theirs-n0"]


@pytest.mark.parametrize("interval", ["0", "-1"])
def test_an_interval_of_zero_or_less_is_refused(
    interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--watch", "--interval", interval]) == 2
    captured = capsys.readouterr()
    assert captured.err == "ringtrain-stat: --interval must be above 0 seconds\n"
    assert captured.out == ""


def test_a_ring_that_is_not_there_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    missing = f"absent{uuid.uuid4().hex[:8]}"
    assert main([missing]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ringtrain-stat: no live ring of {missing!r}") and err.count("\n") == 1


def test_clean_removes_a_dead_rings_objects_and_says_how_many(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = f"junk{uuid.uuid4().hex[:8]}"
    objects = [Path(f"/dev/shm/ringtrain.{run}.{part}") for part in ("ctl", "data")]
    for path in objects:
        path.write_bytes(os.urandom(4096))  # no ring's header: nobody's ring
    try:
        assert main(["--clean"]) == 0
        out = capsys.readouterr().out
        assert f"removed 2 shared-memory objects of dead ring {run}\n" in out
        assert [path for path in objects if path.exists()] == []
    finally:
        for path in objects:
            path.unlink(missing_ok=True)


def test_clean_with_nothing_dead_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(ring_names, "remove_dead_runs", lambda: {})
    assert main(["--clean"]) == 0
    assert capsys.readouterr().out == "no shared-memory objects of dead rings\n"


def test_ctrl_c_while_watching_ends_quietly(
    ranks: list[Ring], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(stat_view.time, "sleep", interrupted)
    assert main([ranks[0].spec.run_id, "--watch", "--json"]) == 0
    assert [r["ended"] for r in _documents(capsys.readouterr().out)] == [False]


def test_output_to_a_closed_pipe_ends_quietly(
    ranks: list[Ring], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader of the output went away (`| head`): exit 0, and what is still to be
    written later goes nowhere instead of failing again."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w") as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        assert main([ranks[0].spec.run_id, "--json"]) == 0
        print("more", file=pipe)
        pipe.flush()
