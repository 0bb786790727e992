"""ringtrain-stat against a live ring (CLI run as a subprocess; ring names already unlinked)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import uuid

import numpy as np
import torch

from ringtrain.monitor.stat_view import format_snapshot
from ringtrain.monitor.verdict import ring_judgement
from ringtrain.ring import CONSUMER, Ring, with_interval
from ringtrain.ring.control import HEADER, MAGIC, VERSION
from ringtrain.ring.names import ring_id
from tests.helpers import ring_workers as rw

CTX = mp.get_context("spawn")
JOIN_S = 60


def stat(*args: str) -> object:
    out = subprocess.run(
        [sys.executable, "-m", "ringtrain.cli.stat", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=JOIN_S,
    )
    return json.loads(out.stdout)


def test_stat_reports_live_ring_and_dead_rank() -> None:
    run = f"t{uuid.uuid4().hex[:10]}"
    spec = rw.make_spec(run, producers=1, consumers=1, slots=4)
    barrier, results, attached = CTX.Barrier(2), CTX.Queue(), CTX.Event()
    drafter = CTX.Process(
        target=rw.rank_main, args=(spec, 1, barrier, results, "wait_for_kill", attached)
    )
    drafter.start()
    ring = rw.join_ring(spec, 0, barrier)
    try:
        assert attached.wait(JOIN_S)
        assert not [e for e in os.listdir("/dev/shm") if run in e]  # found through /proc only
        producer = ring.producer()
        for seq in range(3):
            slot = producer.acquire()
            rw.write_item(slot, 0, seq, 5, torch.device("cpu"))
            producer.publish(slot, 5, 1, {"producer": 0, "seq": seq})
        ring.own_row.record_progress(42)

        listed = stat("--json")
        assert run in [entry["run"] for entry in listed]

        report = stat("--json", run)
        assert report["run"] == run and report["generation"] == 3
        assert report["slot_counts"] == {"free": 1, "writing": 0, "ready": 3, "reading": 0}
        assert report["occupancy"] == 0.75
        assert report["slot_states"] == ["ready", "ready", "ready", "free"]
        ranks = {r["rank"]: r for r in report["ranks"]}
        assert ranks[10]["label"] == "target" and ranks[10]["pid"] == os.getpid()
        assert ranks[10]["items"] == int(ring.control.rank["items"][0]) == 3
        assert ranks[10]["step"] == 42
        assert ranks[11]["label"] == "drafter" and ranks[11]["pid"] == drafter.pid
        assert ranks[10]["alive"] and ranks[11]["alive"]
        assert ranks[11]["status"] == "attached"

        os.kill(drafter.pid, signal.SIGKILL)
        drafter.join(JOIN_S)
        report = stat("--json", run)
        ranks = {r["rank"]: r for r in report["ranks"]}
        assert ranks[11]["status"] == "dead" and not ranks[11]["alive"]
        assert "is gone" in ranks[11]["dead_reason"]
        assert report["verdict"].startswith("rank 11 (drafter) is dead")
        # Reading changed nothing: the ring's own view is the same.
        assert ring.snapshot().slot_counts["ready"] == 3
    finally:
        ring.close(clean=False)


def test_interval_and_verdict_over_a_window() -> None:
    spec = rw.make_spec(f"t{uuid.uuid4().hex[:10]}", producers=1, consumers=1, slots=1)
    target = Ring.create(spec, 0, "cpu")
    drafter = Ring.attach(spec.run_id, 1, "cpu")
    try:
        before = target.snapshot()
        producer, consumer = target.producer(), drafter.consumer()
        for seq in range(4):
            slot = producer.acquire()
            producer.publish(slot, 0, 0, {"seq": seq})
            assert consumer.take() is not None
        # Pretend the producer spent the whole window blocked on a full ring.
        after = target.snapshot()
        after.ranks[0].blocked_ns = before.ranks[0].blocked_ns + (after.taken_ns - before.taken_ns)
        windowed = with_interval(before, after)
        assert windowed.ranks[1].interval_items_per_s > 0
        assert windowed.interval_producers_blocked_pct == 100.0
        assert windowed.bottleneck == CONSUMER
        assert ring_judgement(windowed, before).line.startswith(
            "drafters are the bottleneck: ring full 100%"
        )
        text = format_snapshot(windowed, before)
        assert spec.run_id in text and "drafters are the bottleneck" in text
    finally:
        drafter.close()
        target.close()


def _open_pair(run_id: str) -> tuple[Ring, Ring]:
    spec = rw.make_spec(run_id, producers=1, consumers=1, slots=1)
    return Ring.create(spec, 0, "cpu"), Ring.attach(spec.run_id, 1, "cpu")


def test_a_ring_is_found_by_id_run_name_or_run_directory(tmp_path) -> None:
    name = f"stat{uuid.uuid4().hex[:8]}"
    run_id = ring_id(name, str(tmp_path.resolve()), 0)
    (tmp_path / "config.json").write_text(json.dumps({"run": {"name": name}}))
    target, drafter = _open_pair(run_id)
    try:
        for handle in (run_id, name, str(tmp_path)):
            assert stat("--json", handle)["run"] == run_id
        missing = subprocess.run(
            [sys.executable, "-m", "ringtrain.cli.stat", f"{name}x"], capture_output=True, text=True
        )
        assert missing.returncode == 2 and "no live ring of" in missing.stderr
    finally:
        drafter.close()
        target.close()


def test_watch_reports_an_ended_run_and_exits(tmp_path) -> None:
    target, drafter = _open_pair(f"t{uuid.uuid4().hex[:10]}")
    command = [sys.executable, "-m", "ringtrain.cli.stat", "--json", "--watch"]
    watcher = subprocess.Popen(
        [*command, "--interval", "0.05", target.spec.run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(watcher.stdout.readline())  # attached and reading
        assert first["ended"] is False
        drafter.close()
        target.close()
        out, err = watcher.communicate(timeout=JOIN_S)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["ended"] is True


def test_output_to_a_closed_pipe_ends_quietly() -> None:
    target, drafter = _open_pair(f"t{uuid.uuid4().hex[:10]}")
    command = [sys.executable, "-m", "ringtrain.cli.stat", "--watch", "--interval", "0.01"]
    watcher = subprocess.Popen(
        [*command, target.spec.run_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert watcher.stdout.readline().startswith(b"ring ")
        watcher.stdout.close()  # like `| head -1`
        _, err = watcher.communicate(timeout=JOIN_S)
    finally:
        watcher.kill()
        drafter.close()
        target.close()
    assert watcher.returncode == 0 and b"Traceback" not in err, err


def test_junk_control_segments_are_named_not_listed_and_removed_at_a_start() -> None:
    tag = uuid.uuid4().hex[:8]
    junk = {
        f"/dev/shm/ringtrain.junk{tag}-big.ctl": os.urandom(64 << 10),
        f"/dev/shm/ringtrain.junk{tag}-small.ctl": os.urandom(10),
    }
    for path, data in junk.items():
        with open(path, "wb") as segment:
            segment.write(data)
    try:
        listing = subprocess.run(
            [sys.executable, "-m", "ringtrain.cli.stat", "--json"],
            check=True,
            capture_output=True,
            text=True,
            timeout=JOIN_S,
        )
        assert not [r for r in json.loads(listing.stdout) if tag in r["run"]]
        # A ring started meanwhile by another process on this host removes junk too.
        named = [path for path in junk if f"skipped {path}: " in listing.stderr]
        assert named == [path for path in junk if os.path.exists(path)] or named == list(junk)
        assert named, "a ring start elsewhere removed the junk first: run again"
        problems = ("not a ringtrain control block", "10 bytes is too small for a ring control")
        for path, problem in zip(junk, problems, strict=True):
            assert path not in named or f"{path}: {problem}" in listing.stderr
        target, drafter = _open_pair(f"t{uuid.uuid4().hex[:10]}")
        drafter.close()
        target.close()
        assert [path for path in junk if os.path.exists(path)] == []
    finally:
        for path in junk:
            if os.path.exists(path):
                os.unlink(path)


def test_a_mapped_control_segment_of_another_layout_is_left_alone() -> None:
    """A ring of another installed version's layout is not this version's junk while a
    live process maps it; once none does, a ring's start removes it."""
    path = f"/dev/shm/ringtrain.other{uuid.uuid4().hex[:8]}.ctl"
    header = np.zeros((), dtype=HEADER)
    header["magic"], header["version"] = MAGIC, VERSION + 1
    with open(path, "wb") as segment:
        segment.write(header.tobytes() + bytes(4096))
    mapped, release = CTX.Event(), CTX.Event()
    holder = CTX.Process(target=rw.hold_mapped, args=(path, mapped, release))
    holder.start()
    try:
        assert mapped.wait(JOIN_S)
        listing = subprocess.run(
            [sys.executable, "-m", "ringtrain.cli.stat", "--json"],
            capture_output=True,
            text=True,
            timeout=JOIN_S,
        )
        assert f"mapped by live pid {holder.pid}: left alone" in listing.stderr
        target, drafter = _open_pair(f"t{uuid.uuid4().hex[:10]}")
        drafter.close()
        target.close()
        assert os.path.exists(path)
        release.set()
        holder.join(JOIN_S)
        target, drafter = _open_pair(f"t{uuid.uuid4().hex[:10]}")
        drafter.close()
        target.close()
        assert not os.path.exists(path)
    finally:
        release.set()
        holder.join(JOIN_S)
        if os.path.exists(path):
            os.unlink(path)
