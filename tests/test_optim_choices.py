"""The [optim] choices: Muon beside AdamW, the warmup-stable-decay schedule, each resuming
exactly, and a checkpoint of one optimiser refused under the other.

The in-process tests use a tiny drafter and real checkpoints; the end-to-end one trains
the embedded default through torchrun on CPU.
"""

from __future__ import annotations

import copy
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ringtrain.checkpoint.layout import WEIGHTS_FILE
from ringtrain.checkpoint.load import load_checkpoint, saved_optimizer_state
from ringtrain.checkpoint.resume_checks import check_resume_optimizer
from ringtrain.checkpoint.resume_record import ResumeRecord
from ringtrain.checkpoint.save import save_checkpoint
from ringtrain.config import ConfigError
from ringtrain.drafter import DFlashDrafter, DrafterSpec, build_optimizer, drafter_spec_from_target
from ringtrain.drafter.config import DrafterConfig, OptimConfig
from ringtrain.drafter.muon import BatchedMuon
from ringtrain.drafter.optim import (
    ALGORITHM_KEY,
    optimizer_step,
    resume_settings,
    saved_optimizer_name,
    schedule_at,
)
from ringtrain.drafter.schedules import WarmupCosine, WarmupStableDecay
from tests.helpers.launcher import run_training, step_records, trained_batches
from tests.helpers.tiny_drafter import PAPER_DRAFTER, all_visible

TARGET = {
    "hidden_size": 16, "vocab_size": 40, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 24, "rms_norm_eps": 1e-5, "rope_theta": 5e5,
}  # fmt: skip
MUON_WSD = OptimConfig(name="muon", schedule="wsd", lr=1e-2, warmup_fraction=0.1)
VARIANTS = [
    pytest.param(OptimConfig(name="adamw", schedule="cosine", lr=1e-2), id="adamw-cosine"),
    pytest.param(MUON_WSD, id="muon-wsd"),
]


def tiny_drafter() -> tuple[DFlashDrafter, DrafterSpec]:
    torch.manual_seed(0)
    spec = drafter_spec_from_target(
        TARGET, DrafterConfig(**PAPER_DRAFTER, num_layers=1, block_size=4), [1, 2]
    )
    return DFlashDrafter(spec), spec


def train_step(
    model: DFlashDrafter,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    cfg: OptimConfig,
) -> torch.Tensor:
    """One step on random inputs drawn from the global RNG (which a checkpoint restores)."""
    out = model(
        torch.randn(5, 32), torch.arange(5), torch.randn(8, 16), torch.arange(5, 13),
        all_visible(8, 13, 2),
    )  # fmt: skip
    out.square().mean().backward()
    return optimizer_step(model, optimizer, scheduler, cfg)


def test_cosine_warms_up_then_falls_along_half_a_cosine_to_its_floor() -> None:
    schedule = WarmupCosine(20, warmup_fraction=0.1, min_lr_ratio=0.1)
    assert [schedule(s) for s in range(2)] == [0.5, 1.0]
    for step in range(2, 20):
        half_cosine = 0.5 * (1 + math.cos(math.pi * (step - 2) / 18))
        assert schedule(step) == pytest.approx(0.1 + 0.9 * half_cosine)
    assert schedule(11) == pytest.approx(0.55) and schedule(20) == pytest.approx(0.1)


def test_wsd_warms_up_holds_then_decays_with_one_minus_sqrt() -> None:
    schedule = WarmupStableDecay(20, warmup_fraction=0.1, min_lr_ratio=0.1, decay_fraction=0.25)
    assert [schedule(s) for s in range(3)] == [0.5, 1.0, 1.0]
    assert all(schedule(s) == 1.0 for s in range(1, 15))
    assert schedule.decay_start == 15
    for step in range(15, 20):
        assert schedule(step) == pytest.approx(0.1 + 0.9 * (1 - math.sqrt((step - 15) / 5)))
    assert schedule(19) > 0.1 and schedule(25) == pytest.approx(0.1)
    held = WarmupStableDecay(20, warmup_fraction=0.1, min_lr_ratio=0.0, decay_fraction=0.0)
    assert all(held(s) == 1.0 for s in range(1, 20))


def test_muon_steps_the_layer_matrices_and_adamw_the_rest() -> None:
    model, _ = tiny_drafter()
    optimizer, scheduler = build_optimizer(model, MUON_WSD, total_steps=10)
    names = {id(p): name for name, p in model.named_parameters()}
    muon, matrices, vectors = optimizer.param_groups
    assert [g[ALGORITHM_KEY] for g in optimizer.param_groups] == ["muon", "adamw", "adamw"]
    assert all(names[id(p)].startswith("layers.") and p.ndim == 2 for p in muon["params"])
    assert {names[id(p)] for p in matrices["params"]} == {"fc.weight"}
    assert all(p.ndim == 1 for p in vectors["params"])
    total = len(muon["params"]) + len(matrices["params"]) + len(vectors["params"])
    assert total == len(list(model.parameters()))
    assert muon["adjust_lr_fn"] == "match_rms_adamw"
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    train_step(model, optimizer, scheduler, MUON_WSD)
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == [], "one step updates the parameters of both parts"
    assert saved_optimizer_name(optimizer.state_dict()) == "muon"


@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw", "original"])
def test_batched_muon_steps_as_torch_muon_does(adjust_lr_fn: str | None) -> None:
    """Three steps over wide, tall and square matrices (two of each shape) move the weights
    and momenta as torch.optim.Muon does, for each lr adjustment (None: torch's default),
    and either loads the other's state dict."""
    torch.manual_seed(0)
    shapes = [(8, 24), (8, 24), (24, 8), (24, 8), (16, 16), (16, 16)]
    weights = [torch.randn(shape) for shape in shapes]
    settings = {"lr": 0.05, "weight_decay": 0.1, "adjust_lr_fn": adjust_lr_fn}
    copies = {}
    for kind in (torch.optim.Muon, BatchedMuon):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        optimizer = kind(params, **settings)
        for step in range(3):
            for index, param in enumerate(params):
                param.grad = torch.sin(param.detach() * (index + 1) + step)
            optimizer.step()
        copies[kind] = (params, optimizer)
    (torch_params, torch_muon), (params, batched) = copies[torch.optim.Muon], copies[BatchedMuon]
    for ours, theirs in zip(params, torch_params, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        assert not torch.equal(ours.detach(), torch.zeros_like(ours))
    for ours, theirs in zip(params, torch_params, strict=True):
        torch.testing.assert_close(
            batched.state[ours]["momentum_buffer"], torch_muon.state[theirs]["momentum_buffer"]
        )
    batched.load_state_dict(torch_muon.state_dict())
    torch_muon.load_state_dict(batched.state_dict())


@pytest.mark.parametrize("cfg", VARIANTS)
def test_a_checkpoint_resumes_exactly(tmp_path: Path, cfg: OptimConfig) -> None:
    model, spec = tiny_drafter()
    optimizer, scheduler = build_optimizer(model, cfg, total_steps=10)
    for _ in range(3):
        train_step(model, optimizer, scheduler, cfg)
    save_checkpoint(tmp_path, 3, model, spec, optimizer, scheduler, ResumeRecord(step=3))
    for _ in range(4):
        train_step(model, optimizer, scheduler, cfg)
    unbroken = copy.deepcopy(model.state_dict())

    loaded = load_checkpoint(tmp_path, "cpu")
    resumed, _ = build_optimizer(loaded.model, cfg, total_steps=10)
    loaded.restore(resumed)
    assert resume_settings(resumed, cfg, loaded.saved_schedule) == []
    schedule = schedule_at(resumed, cfg, 10, loaded.step)
    for _ in range(4):
        train_step(loaded.model, resumed, schedule, cfg)
    assert schedule.get_last_lr() == scheduler.get_last_lr()
    for name, tensor in unbroken.items():
        torch.testing.assert_close(loaded.model.state_dict()[name], tensor, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("saved", "now"), [("adamw", "muon"), ("muon", "adamw")])
def test_a_checkpoint_of_another_optimizer_is_refused_naming_both(
    tmp_path: Path, saved: str, now: str
) -> None:
    model, spec = tiny_drafter()
    optimizer, scheduler = build_optimizer(model, OptimConfig(name=saved), total_steps=10)
    path = save_checkpoint(tmp_path, 1, model, spec, optimizer, scheduler, ResumeRecord(step=1))
    check_resume_optimizer(path, OptimConfig(name=saved))
    message = (
        f"optim.name is '{now}' but checkpoint {path} was trained with '{saved}'.*"
        f"resume with optim.name = '{saved}', or start a new run"
    )
    with pytest.raises(ConfigError, match=message):
        check_resume_optimizer(path, OptimConfig(name=now))


def test_a_checkpoint_from_before_the_choice_reads_as_adamw(tmp_path: Path) -> None:
    model, spec = tiny_drafter()
    optimizer, scheduler = build_optimizer(model, OptimConfig(name="adamw"), total_steps=10)
    for group in optimizer.param_groups:  # what AdamW's groups held before the key existed
        del group[ALGORITHM_KEY]
    path = save_checkpoint(tmp_path, 1, model, spec, optimizer, scheduler, ResumeRecord(step=1))
    assert saved_optimizer_name(saved_optimizer_state(path)) == "adamw"
    check_resume_optimizer(path, OptimConfig(name="adamw"))


def test_resume_reports_a_changed_schedule_and_muon_momentum() -> None:
    model, _ = tiny_drafter()
    optimizer, scheduler = build_optimizer(model, MUON_WSD, total_steps=10)
    saved_schedule = scheduler.state_dict()
    changed = OptimConfig(
        name="muon", schedule="cosine", lr=1e-2, muon_momentum=0.9, warmup_fraction=0.1
    )
    assert resume_settings(optimizer, changed, saved_schedule) == [
        "optim.muon_momentum 0.95 -> 0.9",
        "optim.schedule wsd -> cosine",
    ]
    assert optimizer.param_groups[0]["momentum"] == 0.9
    assert optimizer.parts[0].param_groups[0]["momentum"] == 0.9


@pytest.mark.slow
def test_muon_wsd_learns_the_embedded_default_and_resumes_exactly(tmp_path: Path) -> None:
    """An unbroken 24-step run against one stopped after step 12 (its later checkpoint
    removed: what a run killed then leaves) and resumed: the same batches, the same lr at
    every step, the same final weights."""
    overrides = [
        "run.max_steps=24", "run.checkpoint_every=12", "run.eval_every=0", "run.log_every=1",
        'optim.name="muon"', 'optim.schedule="wsd"',
    ]  # fmt: skip
    unbroken = tmp_path / "unbroken"
    done = run_training(unbroken, 1, 1, overrides)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = step_records(unbroken)
    losses = [r["loss"] for r in records]
    assert [r["step"] for r in records] == list(range(1, 25))
    assert sum(losses[-4:]) / 4 < 0.85 * sum(losses[:4]) / 4, losses

    stopped = Path(shutil.copytree(unbroken, tmp_path / "stopped"))
    shutil.rmtree(stopped / "checkpoints" / "step_00000024")
    done = run_training(stopped, 1, 1, overrides, resume=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    resumed = step_records(stopped)
    assert trained_batches(resumed) == trained_batches(records)
    assert [r["lr"] for r in resumed] == [r["lr"] for r in records]
    final = Path("checkpoints") / "step_00000024" / WEIGHTS_FILE
    want, got = load_file(str(unbroken / final)), load_file(str(stopped / final))
    assert want.keys() == got.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-6, msg=name)
