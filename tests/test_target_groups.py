"""Tensor-parallel target groups in the trainer: one group of two target ranks feeds the
ring as one producer, a killed member stops the run naming it, resume is exact, and a
layout that would split a group is refused in pre-flight.

The runs are real torchrun processes on CPU (gloo) with the embedded tiny config and a
tiny dense Qwen3 target written with save_pretrained, split over the group: a run whose
non-lead group member is killed mid-run, then resumed from its last checkpoint; the two
together must train the group's stream exactly once, and the drafter must learn.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from transformers import CONFIG_MAPPING

from ringtrain.batch import slot_fields
from ringtrain.config import ConfigError, LayoutConfig, parse_config
from ringtrain.main import main
from ringtrain.monitor.stat_view import format_snapshot
from ringtrain.ring import RankHung, Ring, RingError, RingReader, RingSpec, discover
from ringtrain.trainer.plan import validate_inputs
from ringtrain.trainer.roles import END_OF_ROLE, rank_info_from_env
from tests.helpers import ring_workers as rw
from tests.helpers.launcher import (
    POLL_S,
    RUN_TIMEOUT_S,
    as_torchrun_rank,
    eval_records,
    expected_batch_ids,
    pid_alive,
    run_training,
    shm_entries,
    start_training,
    step_records,
    trained_batches,
    wait_for_step,
)
from tests.helpers.tiny_families import COMMON, TEXT_FAMILIES, build_model, write_model

EXIT_AFTER_KILL_S = 30.0
STEPS = 6
# Two target ranks in one group, one drafter. The target has no tokenizer, so its mask
# token is given (auto would take the vocabulary's last id, with a warning).
RUN = [
    "layout.target_tp=2", f"run.max_steps={STEPS}", "run.log_every=1", "drafter.mask_token_id=1",
]  # fmt: skip


@pytest.fixture(scope="module")
def overrides(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """RUN with a tiny dense target that a group of two can split."""
    target = write_model(tmp_path_factory.mktemp("target") / "qwen3", build_model("qwen3"))
    return [*RUN, f"target.path={json.dumps(str(target))}"]


def _logs(run_dir: Path) -> dict[str, str]:
    return {log.name: log.read_text() for log in sorted((run_dir / "logs").glob("*.log"))}


def _kill_member(name: str, run_dir: Path, proc: subprocess.Popen[str]) -> tuple[str, float]:
    """SIGKILL the group's non-lead member mid-run: (its name in messages, seconds until
    every other rank was gone); also checks what ringtrain-stat shows of the group."""
    wait_for_step(proc, run_dir, 2)
    rings = [r for r in discover() if r.run.startswith(f"{name}-") and r.pids]
    assert len(rings) == 1, rings
    reader = RingReader(rings[0])
    try:
        before = reader.snapshot()
        assert "target group 0 (ranks 0,1)" in format_snapshot(before)
        ranks = {r.rank: r for r in before.ranks}
        assert (ranks[0].group, ranks[0].member, ranks[1].member) == (0, 0, 1)
        os.kill(ranks[1].pid, signal.SIGKILL)
        start = time.monotonic()
        while pid_alive(ranks[0].pid) or pid_alive(ranks[2].pid):
            assert time.monotonic() - start < EXIT_AFTER_KILL_S, "ranks outlived the kill"
            time.sleep(POLL_S)
        took = time.monotonic() - start
        assert "DEAD (died" in format_snapshot(reader.snapshot())
    finally:
        reader.close()
    return f"rank 1 (target, group 0 member 1, pid {ranks[1].pid})", took


@dataclasses.dataclass
class Interrupted:
    """A run whose group member was killed at step 2, then resumed to the end."""

    run_dir: Path
    name: str
    named: str  # how messages name the killed member
    took: float  # seconds from the kill until every other rank was gone
    returncode: int  # the killed launch's
    output: str  # the killed launch's terminal
    logs: dict[str, str]  # rank logs after the kill, before the resume
    resumed: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory, overrides: list[str]) -> Interrupted:
    name = f"tpkill{os.getpid()}"
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    # The final evaluation round rides along in the resumed run (the lead decides when it
    # starts, the member follows).
    overrides = [
        *overrides,
        "run.checkpoint_every=1",
        f"run.eval_every={STEPS}",
        f"run.name={name}",
    ]
    proc = start_training(run_dir, 2, 1, overrides)
    try:
        named, took = _kill_member(name, run_dir, proc)
        output, _ = proc.communicate(timeout=EXIT_AFTER_KILL_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(RUN_TIMEOUT_S)
    logs = _logs(run_dir)
    resumed = run_training(run_dir, 2, 1, overrides, resume=True)
    return Interrupted(run_dir, name, named, took, proc.returncode, output, logs, resumed)


@pytest.mark.slow
def test_a_killed_member_stops_every_rank_naming_it(interrupted: Interrupted) -> None:
    output, named = interrupted.output, interrupted.named
    assert interrupted.returncode != 0
    assert named in output, f"not named after {interrupted.took:.1f} s:\n{output[-3000:]}"
    for survivor in ("rank0-target.log", "rank2-drafter.log"):
        log = interrupted.logs[survivor]
        assert named in log, log[-2000:]
        assert "exiting with code 0" not in log


@pytest.mark.slow
def test_the_resumed_group_trains_its_stream_exactly_once_and_the_drafter_learns(
    interrupted: Interrupted,
) -> None:
    run_dir, done = interrupted.run_dir, interrupted.resumed
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logs = _logs(run_dir)
    assert "resumed from" in logs["rank2-drafter.log"]
    records = step_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    losses = [r["loss"] for r in records]
    assert sum(losses[-2:]) < sum(losses[:2])
    # One producer, the group, whose cursor came back from the checkpoint: its stream's
    # first batches, each once, none skipped.
    batches = trained_batches(records)
    assert sorted((producer, seq) for producer, seq, _ in batches) == [(0, s) for s in range(STEPS)]
    assert [b for _, _, b in sorted(batches)] == expected_batch_ids(run_dir, 1, {0: STEPS})[0]
    assert [e["round"] for e in eval_records(run_dir)] == [1]
    assert "split over a tensor-parallel group of 2" in logs["rank1-target.log"]
    assert "batches published" in logs["rank0-target.log"]
    assert "batches run as a target group member" in logs["rank1-target.log"]
    for name, text in logs.items():
        assert text.rstrip().endswith("exiting with code 0"), f"{name}:\n{text[-2000:]}"
    assert shm_entries(interrupted.name) == []


def test_a_layout_that_splits_a_group_is_refused_in_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    as_torchrun_rank(monkeypatch, world_size=4, local_world_size=4)
    run_dir = json.dumps(str(tmp_path / "run"))
    layout = ["layout.targets_per_node=3", "layout.drafters_per_node=1", "layout.target_tp=2"]
    code = main([arg for item in [f"run.run_dir={run_dir}", *layout] for arg in ("--set", item)])
    assert code == 2
    err = capsys.readouterr().err
    assert "target_tp = 2 does not divide targets_per_node = 3" in err
    assert not (tmp_path / "run").exists()


def test_groups_are_consecutive_target_ranks_of_one_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes of 4 targets + 2 drafters, groups of 2: rank 7 is member 1 of group 2."""
    as_torchrun_rank(monkeypatch, rank=7, local_rank=1, world_size=12, local_world_size=6)
    layout = LayoutConfig(targets_per_node=4, drafters_per_node=2, target_tp=2)
    info = rank_info_from_env(layout, "cpu")
    assert (info.group_index, info.group_member, info.group_ranks) == (2, 1, [6, 7])
    assert info.target_groups == [[0, 1], [2, 3], [6, 7], [8, 9]]
    assert info.producer_count == 4
    roles = ["target"] * 4 + ["drafter"] * 2
    ends = [END_OF_ROLE[role] for role in roles]
    fields = slot_fields(1, 8, "float32")
    spec = RingSpec("r", 0, ends, list(range(6, 12)), 2, 64, 4, fields, group_size=2, labels=roles)
    assert spec.producers == (0, 2) and spec.num_slots == 4
    assert spec.describe(1) == "target, group 2 member 1"
    assert spec.describe(4) == "drafter"


def test_a_family_a_group_cannot_split_is_refused_in_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hybrid (Gated DeltaNet) target with target_tp = 2: refused before any rank starts
    distributed work, naming the setting and the fix."""
    as_torchrun_rank(monkeypatch)
    hybrid = write_model(tmp_path / "hybrid", build_model("qwen3_next"))
    config = parse_config(
        "",
        overrides=[
            f"run.run_dir={json.dumps(str(tmp_path / 'run'))}",
            f"target.path={json.dumps(str(hybrid))}",
            "layout.target_tp=2",
            "target.num_taps=3",
            "run.eval_every=0",
        ],
    )
    info = rank_info_from_env(config.layout, "cpu")
    with pytest.raises(ConfigError, match=r"target_tp = 2: .*hybrid Gated DeltaNet.*target_tp = 1"):
        validate_inputs(config, info, tmp_path / "run")


@pytest.mark.parametrize(("taps", "refused"), [("[0, 1]", False), ("[0, 3]", True)])
def test_preflight_checks_only_the_layers_a_group_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taps: str, refused: bool
) -> None:
    """A GLM-4.5-style target whose two dense layers split over 2 members and whose deeper
    expert layers (intermediate size 33) do not: tapping only the dense layers keeps only
    them, so the group is accepted; a tap in an expert layer is refused naming it."""
    as_torchrun_rank(monkeypatch)
    values = {**COMMON, **TEXT_FAMILIES["glm4_moe"]}
    glm = CONFIG_MAPPING["glm4_moe"](
        **values | {"first_k_dense_replace": 2, "moe_intermediate_size": 33}
    )
    glm.save_pretrained(tmp_path / "glm")
    overrides = [
        f"run.run_dir={json.dumps(str(tmp_path / 'run'))}",
        f"target.path={json.dumps(str(tmp_path / 'glm'))}",
        "target.random_weights=true",
        f"target.tap_layers={taps}",
        "layout.target_tp=2",
        "run.eval_every=0",
    ]
    config = parse_config("", overrides=overrides)
    info = rank_info_from_env(config.layout, "cpu")
    if refused:
        with pytest.raises(ConfigError, match=r"target_tp = 2: .*cannot split layer 2 .*33"):
            validate_inputs(config, info, tmp_path / "run")
    else:
        assert validate_inputs(config, info, tmp_path / "run").tap_layers == [0, 1]


def test_a_member_owns_no_slots_and_a_stuck_one_is_named() -> None:
    """An in-process ring of one group of two targets and a drafter: the member is no
    producer, its wait on its lead keeps it alive, a member without progress is hung."""
    spec = dataclasses.replace(
        rw.make_spec(f"g{uuid.uuid4().hex[:10]}", producers=2, consumers=1),
        global_ranks=[0, 1, 2],
        group_size=2,
        progress_timeout_s=2.0,
    )
    lead = Ring.create(spec, 0, "cpu")
    member, drafter = Ring.attach(spec.run_id, 1, "cpu"), Ring.attach(spec.run_id, 2, "cpu")
    try:
        assert (lead.is_producer, member.is_producer, spec.num_slots) == (True, False, 2)
        assert member.payload is None and lead.payload is not None  # no slot memory mapped
        with pytest.raises(RingError, match=r"\(target, group 0 member 1\) is not a producer"):
            member.producer()
        member.own_row.record_progress(1)
        member.control.rank["progress_ns"][1] -= int(10e9)
        member.own_row.waiting()  # waiting for its lead's decision: not hung
        drafter.check_peers()
        snapshot = drafter.snapshot()
        assert "target group 0 (ranks 0,1)" in format_snapshot(snapshot)
        assert [r.is_producer for r in snapshot.ranks] == [True, False, False]
        for field in ("progress_ns", "active_ns", "still_ns"):  # silent and idle: stuck
            member.control.rank[field][1] -= int(10e9)
        with pytest.raises(RankHung, match=r"rank 1 \(target, group 0 member 1, pid \d+\) is hung"):
            drafter.check_peers()
        member.close()
        assert not drafter.handoff.all_producers_finished()  # a member's exit is no finish
    finally:
        for ring in (drafter, member, lead):
            ring.close()
