"""ringtrain-stat's command line: --help before anything heavy is imported, only the
caller's rings unless --all, and every rank's step from the start of a resumed session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.monitor import stat_view
from ringtrain.ring import Ring, RingLocation
from tests.helpers import ring_workers as rw

NOBODY = 65534


def test_help_answers_without_importing_torch() -> None:
    probe = (
        "import sys\n"
        "from ringtrain.cli.stat import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert "--all" in out.stdout and out.stdout.endswith("torch not imported\n")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_only_the_callers_rings_are_listed_unless_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mine, theirs = tmp_path / "mine.ctl", tmp_path / "theirs.ctl"
    mine.write_bytes(b"")
    theirs.write_bytes(b"")
    os.chown(theirs, NOBODY, NOBODY)
    rings = [RingLocation("mine-n0", str(mine), (1,)), RingLocation("theirs-n0", str(theirs), (2,))]
    monkeypatch.setattr(stat_view, "discover", lambda: rings)

    assert stat_view.list_rings(as_json=False, everyone=False) == 0
    out = capsys.readouterr().out
    assert "mine-n0" in out and "theirs-n0" not in out
    assert "(1 ring(s) of other users not shown: --all lists them)" in out
    assert stat_view.list_rings(as_json=False, everyone=True) == 0
    out = capsys.readouterr().out
    assert "mine-n0" in out and "theirs-n0" in out


def test_a_resumed_rank_shows_its_step_before_its_first_of_this_session() -> None:
    spec = rw.make_spec(rw.run_id(), producers=1, consumers=1, slots=1)
    target = Ring.create(spec, 0, "cpu")
    drafter = Ring.attach(spec.run_id, 1, "cpu")
    try:
        before = {r.label: r for r in target.snapshot().ranks}
        drafter.own_row.start_at(4)
        target.own_row.start_at(4)
        after = {r.label: r for r in target.snapshot().ranks}
        assert after["drafter"].step == after["target"].step == 4
        for label in ("target", "drafter"):  # nothing else about the ranks changed
            assert (after[label].status, after[label].doing) == (
                before[label].status,
                before[label].doing,
            )
    finally:
        drafter.close()
        target.close()
