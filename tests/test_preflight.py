"""Start-up refusals through real torchrun: nonsensical values and an unwritable run
directory fail in pre-flight, once, naming the key, exit 2; the embedded default runs
with any process count from 2 and derives its role split. Pre-flight's own checks
(trainer/plan.py), called in this process: a missing lock directory, a row over the token
budget, a learning rate whose step overflows, a checkpoint of another drafter, evaluation
without a held-out split, a held-out row no batch holds; and what every rank derives from
the plan: the ring's ranks and session, a round's held-out batches, the slots' documents."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest
import torch

from ringtrain.checkpoint.resume_record import ResumeRecord
from ringtrain.checkpoint.save import save_checkpoint
from ringtrain.config import Config, ConfigError, parse_config
from ringtrain.data.synthetic import write_synthetic_dataset
from ringtrain.drafter import DFlashDrafter, build_optimizer, drafter_spec_from_target
from ringtrain.drafter.config import DrafterConfig, OptimConfig
from ringtrain.main import embedded_split, main
from ringtrain.trainer.builtin import prepare_builtin_inputs
from ringtrain.trainer.plan import (
    INPUT_ERRORS,
    batch_stream,
    eval_batches_per_round,
    ring_spec,
    validate_inputs,
)
from ringtrain.trainer.roles import rank_info_from_env
from tests.helpers.launcher import (
    RUN_TIMEOUT_S,
    as_torchrun_rank,
    run_env,
    step_records,
    trained_batches,
)
from tests.helpers.tiny_drafter import PAPER_DRAFTER, PAPER_SETS, TARGET


def embedded_run(processes: int, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The README's headline command on the embedded default, with overrides."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={processes}", "-m", "ringtrain.main"]
    command += ["--set", f"run.run_dir={json.dumps(str(run_dir))}", "--set", 'run.device="cpu"']
    for item in overrides:
        command += ["--set", item]
    return subprocess.run(
        command, env=run_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


@pytest.mark.parametrize(
    ("processes", "targets", "drafters"), [(2, 1, 1), (3, 1, 2), (4, 1, 3), (8, 3, 5)]
)
def test_embedded_split_follows_the_process_count(
    processes: int, targets: int, drafters: int
) -> None:
    assert embedded_split(processes) == [
        f"layout.targets_per_node={targets}",
        f"layout.drafters_per_node={drafters}",
    ]


def test_embedded_default_refuses_one_process() -> None:
    with pytest.raises(ConfigError, match="at least 2 processes per node"):
        embedded_split(1)


def test_nonsensical_value_fails_once_before_anything_starts(tmp_path: Path) -> None:
    """Through torchrun with 4 processes: the refusal is printed once, not 4 times."""
    finished = embedded_run(4, tmp_path / "run", "run.max_steps=0")
    assert finished.returncode != 0
    assert finished.stderr.count("Expected `int` >= 1 - at `$.run.max_steps`") == 1
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr=nan", r"Expected `float` > 0.0 - at `\$\.optim\.lr`"),
        ("optim.lr=inf", r"optim\.lr = inf must be a finite number"),
        ("ring.wait_timeout_s=inf", r"ring\.wait_timeout_s = inf must be a finite number"),
        ("data.bucket=0", r"Expected `int` >= 1 - at `\$\.data\.bucket`"),
        ("run.log_every=0", r"Expected `int` >= 1 - at `\$\.run\.log_every`"),
        ("drafter.num_layers=0", r"Expected `int` >= 1 - at `\$\.drafter\.num_layers`"),
        ("drafter.num_anchors=0", r"Expected `int` >= 1 - at `\$\.drafter\.num_anchors`"),
        ("drafter.loss_chunk=0", r"Expected `int` >= 1 - at `\$\.drafter\.loss_chunk`"),
        ("drafter.mask_token_id=-7", r"Expected `int` >= -1 - at `\$\.drafter\.mask_token_id`"),
        ("optim.beta1=1.5", r"Expected `float` < 1.0 - at `\$\.optim\.beta1`"),
        ("optim.eps=-1", r"Expected `float` > 0.0 - at `\$\.optim\.eps`.*fix that value"),
        ("layout.gpu_map=[0, -1]", r"Expected `int` >= 0 - at `\$\.layout\.gpu_map\[1\]`"),
    ],
)
def test_nonsensical_values_are_named(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config("", "run.toml", [override])


def _numeric_fields(kind: type, path: str = "") -> list[tuple[str, Any]]:
    """(key, annotation) of every int and float setting below `kind`, lists included."""
    found = []
    for name, hint in typing.get_type_hints(kind, include_extras=True).items():
        inner = hint
        while typing.get_origin(inner) is list:
            inner = typing.get_args(inner)[0]
        base = typing.get_args(inner)[0] if typing.get_origin(inner) is Annotated else inner
        if isinstance(base, type) and issubclass(base, msgspec.Struct):
            found += _numeric_fields(base, f"{path}{name}.")
        elif base in (int, float):
            found.append((f"{path}{name}", inner))
    return found


def test_every_numeric_setting_declares_its_bounds() -> None:
    fields = _numeric_fields(Config)
    assert len(fields) > 40
    unbounded = [
        key
        for key, hint in fields
        if typing.get_origin(hint) is not Annotated
        or not any(
            isinstance(meta, msgspec.Meta) and {meta.ge, meta.gt, meta.le, meta.lt} != {None}
            for meta in typing.get_args(hint)[1:]
        )
    ]
    assert unbounded == []


def test_a_token_budget_over_shared_memory_is_refused_by_the_space_check(tmp_path: Path) -> None:
    finished = embedded_run(2, tmp_path / "run", "data.token_budget=4000000000")
    assert finished.returncode != 0
    assert finished.stderr.count("MiB in /dev/shm but only") == 1, finished.stderr[-3000:]
    assert "Unable to allocate" not in finished.stderr and "MemoryError" not in finished.stderr


def test_unwritable_run_dir_is_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    as_torchrun_rank(monkeypatch)
    code = main(["--set", f"run.run_dir={json.dumps(str(blocker / 'run'))}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "run.run_dir = " in err and "cannot be written (Not a directory)" in err


def test_embedded_default_of_three_processes_trains_one_target_stream_quietly(
    tmp_path: Path,
) -> None:
    """The quickstart's command: 1 target + 2 drafters train the target's stream in full,
    each batch once, two a step, the loss falls (the paper's recipe, whose loss is the
    cross-entropy alone: the defaults' learning is checked in test_drafter_dflash2 and
    test_optim_choices), and the console is free of transformers' notices that the Gated
    DeltaNet and conv1d kernels fall back to torch (on CPU there is no other kernel)."""
    run_dir = tmp_path / "run"
    finished = embedded_run(3, run_dir, "run.max_steps=16", "run.eval_every=0", *PAPER_SETS)
    assert finished.returncode == 0, finished.stderr[-3000:]
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert logs == ["rank0-target.log", "rank1-drafter.log", "rank2-drafter.log"]
    assert "done: 16 steps" in finished.stdout
    console = finished.stdout + finished.stderr
    assert "falling back to its reference PyTorch implementation" not in console
    records = step_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, 17))
    assert all(len(r["batches"]) == 2 for r in records)
    seqs = sorted(seq for _, seq, _ in trained_batches(records))
    assert seqs == list(range(32)), "one target's stream is trained in full, once"
    losses = [r["loss"] for r in records]
    assert sum(losses[-4:]) < sum(losses[:4])


def test_embedded_default_trains_with_two_processes(tmp_path: Path) -> None:
    finished = embedded_run(2, tmp_path / "run", "run.max_steps=4", "run.eval_every=0")
    assert finished.returncode == 0, finished.stderr[-3000:]
    steps = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if '"event": "step"' in line or '"event":"step"' in line
    ]
    assert [record["step"] for record in steps][-1] == 4
    logs = sorted(p.name for p in (tmp_path / "run" / "logs").iterdir())
    assert logs == ["rank0-target.log", "rank1-drafter.log"]


def _settings(run_dir: Path, overrides: dict[str, object] | None = None) -> list[str]:
    """The embedded default's overrides for a run in `run_dir`, with `overrides`."""
    settings = {"run.run_dir": str(run_dir), **(overrides or {})}
    return [f"{key}={json.dumps(value)}" for key, value in settings.items()]


def _preflight_refusal(tmp_path: Path, overrides: dict[str, object]) -> str:
    """The message of pre-flight's own refusal (validate_inputs, called directly: main()
    would install its stop-signal handlers in the test process) of the embedded default
    with `overrides`."""
    config = parse_config("", overrides=_settings(tmp_path / "run", overrides))
    with pytest.raises(INPUT_ERRORS) as refused:
        validate_inputs(config, rank_info_from_env(config.layout, "cpu"), tmp_path / "run")
    return str(refused.value)


def test_a_missing_lock_directory_is_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_torchrun_rank(monkeypatch)
    missing = tmp_path / "locks"
    message = _preflight_refusal(tmp_path, {"ring.lock_dir": str(missing)})
    assert message.startswith(f"ring.lock_dir = '{missing}' is not a directory: create"), message


def test_a_row_longer_than_the_token_budget_is_refused_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_torchrun_rank(monkeypatch)
    budget = parse_config("").data.token_budget
    message = _preflight_refusal(tmp_path, {"data.max_len": budget + 1})
    assert message.startswith(
        f"data.max_len = {budget + 1} exceeds data.token_budget = {budget}: a batch must hold"
    ), message


def test_a_learning_rate_whose_step_overflows_is_refused_in_pre_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drafter's limits (drafter/limits.py) are checked before the ring is up."""
    as_torchrun_rank(monkeypatch)
    message = _preflight_refusal(tmp_path, {"optim.lr": 1e38})
    assert message.startswith("optim.lr = 1e+38: a step of lr x"), message
    assert "must stay below float32's largest value" in message


def test_a_resume_from_a_checkpoint_of_another_drafter_is_refused_in_pre_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--resume checks the newest checkpoint against this run's drafter before the ring is
    up: one of a drafter of another shape is refused by name."""
    as_torchrun_rank(monkeypatch)
    torch.manual_seed(0)
    spec = drafter_spec_from_target(
        TARGET, DrafterConfig(**PAPER_DRAFTER, num_layers=1, block_size=4), [1, 2]
    )
    model = DFlashDrafter(spec)
    optimizer, scheduler = build_optimizer(model, OptimConfig(name="adamw"), total_steps=10)
    checkpoints = tmp_path / "run" / "checkpoints"
    saved = save_checkpoint(checkpoints, 1, model, spec, optimizer, scheduler, ResumeRecord(step=1))
    config = parse_config("", overrides=_settings(tmp_path / "run"))
    info = rank_info_from_env(config.layout, "cpu")
    with pytest.raises(ConfigError, match=f"checkpoint {saved}"):
        validate_inputs(config, info, tmp_path / "run", resume=True)


def test_evaluation_without_a_held_out_split_is_refused_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset of one's own (data.path) has no held-out split unless data.eval_path
    names one."""
    as_torchrun_rank(monkeypatch)
    config = parse_config("", overrides=_settings(tmp_path / "run"))
    _, data_path, _ = prepare_builtin_inputs(config, tmp_path / "run")
    message = _preflight_refusal(tmp_path, {"data.path": str(data_path), "run.eval_every": 10})
    assert message.startswith(
        "run.eval_every = 10 but no held-out split is given: set data.eval_path"
    ), message


def _held_out_split(tmp_path: Path, settings: list[str], **rows: float) -> Path:
    """A held-out split of synthetic rows shaped by `rows` (write_synthetic_dataset's
    arguments) in the vocabulary of the embedded default's target, built for `settings`."""
    config = parse_config("", overrides=settings)
    target_path, _, _ = prepare_builtin_inputs(config, Path(config.run.run_dir))
    vocab_size = json.loads((target_path / "config.json").read_text())["vocab_size"]
    return write_synthetic_dataset(tmp_path / "eval", vocab_size=vocab_size, seed=5, **rows).parent


def test_the_ring_spec_numbers_a_second_nodes_ranks_and_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 1 of two, third session (torchrun's restart count 2): the ring's ranks are the
    node's global ranks and its generation the session's."""
    as_torchrun_rank(monkeypatch, rank=3, world_size=6)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    run_dir = tmp_path / "run"
    config = parse_config("", overrides=_settings(run_dir))
    info = rank_info_from_env(config.layout, "cpu")
    spec = ring_spec(config, info, run_dir, validate_inputs(config, info, run_dir))
    assert spec.global_ranks == [3, 4, 5] and spec.generation == 2


def test_an_evaluation_round_is_every_producers_held_out_batches_and_slots_hold_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two targets: a round counts the held-out batches of both. The held-out split's rows
    are shorter than the training split's, so its batches hold more documents: the ring's
    slots are sized for them."""
    as_torchrun_rank(monkeypatch)
    run_dir = tmp_path / "run"
    two_targets = {"layout.targets_per_node": 2, "layout.drafters_per_node": 1}
    # data.bucket 8: the training split's shortest row, 64 tokens, unpadded
    overrides = {**two_targets, "run.eval_every": 10, "data.bucket": 8}
    eval_path = _held_out_split(
        tmp_path, _settings(run_dir, overrides), rows=200, mean_len=48, min_len=40
    )
    config = parse_config(
        "", overrides=_settings(run_dir, {**overrides, "data.eval_path": str(eval_path)})
    )
    info = rank_info_from_env(config.layout, "cpu")
    plan = validate_inputs(config, info, run_dir)
    assert plan.eval_dataset is not None
    streams = [batch_stream(config, plan.eval_dataset, rank, 2) for rank in range(2)]
    assert eval_batches_per_round(config, plan, info) == sum(s.batches_per_rank for s in streams)
    assert plan.max_docs == streams[0].max_docs > batch_stream(config, plan.dataset, 0, 2).max_docs


def test_a_held_out_row_that_no_batch_holds_is_refused_in_pre_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held-out split's batches are checked like the training split's: a row of 4,097
    tokens fits data.max_len but, padded to the bucket of 8, not a token budget of 4,100."""
    as_torchrun_rank(monkeypatch)
    eval_path = _held_out_split(
        tmp_path,
        _settings(tmp_path / "run"),
        rows=4,
        mean_len=4097,
        sigma=0.0,
        min_len=4097,
        max_len=4097,
    )
    overrides = {"data.eval_path": str(eval_path), "data.bucket": 8}
    overrides |= {"data.token_budget": 4100, "data.max_len": 4100}
    message = _preflight_refusal(tmp_path, overrides)
    assert message.startswith(f"{eval_path}: the longest row (4097 tokens, 4104 padded"), message
