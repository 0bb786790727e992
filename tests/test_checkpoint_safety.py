"""What a checkpoint refuses to be: non-finite weights, a write the disk cannot hold (the
temporary removed, the message naming the path, the free space and the need), another
run's checkpoint picked on resume; and a resumed schedule that follows the config."""

from __future__ import annotations

import math
import shutil
import stat
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from ringtrain.checkpoint.layout import CONFIG_FILE, REQUIRED_FILES, WEIGHTS_FILE, CheckpointError
from ringtrain.checkpoint.load import load_checkpoint
from ringtrain.checkpoint.resume_record import ResumeRecord
from ringtrain.checkpoint.save import SIZE_MARGIN_BYTES, save_checkpoint
from ringtrain.checkpoint.verify import latest_checkpoint
from ringtrain.drafter import DFlashDrafter, build_optimizer, drafter_spec_from_target
from ringtrain.drafter.config import DrafterConfig, OptimConfig
from ringtrain.drafter.optim import resume_settings, schedule_at
from ringtrain.drafter.schedules import WarmupCosine
from tests.helpers.tiny_drafter import PAPER_DRAFTER, paper_optim

TARGET = {
    "hidden_size": 16, "vocab_size": 40, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 24, "rms_norm_eps": 1e-5, "rope_theta": 5e5,
}  # fmt: skip


class Parts(NamedTuple):
    model: DFlashDrafter
    spec: object
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler


def parts(cfg: OptimConfig | None = None, total_steps: int = 10) -> Parts:
    torch.manual_seed(0)
    spec = drafter_spec_from_target(
        TARGET, DrafterConfig(**PAPER_DRAFTER, num_layers=1, block_size=4), [1, 2]
    )
    model = DFlashDrafter(spec)
    optimizer, scheduler = build_optimizer(model, cfg or paper_optim(), total_steps)
    return Parts(model, spec, optimizer, scheduler)


def save(root: Path, step: int, p: Parts, run_id: str | None = None) -> Path:
    record = ResumeRecord(step=step, run_id=run_id)
    return save_checkpoint(root, step, p.model, p.spec, p.optimizer, p.scheduler, record)


def test_non_finite_weights_are_never_written(tmp_path: Path) -> None:
    p = parts()
    good = save(tmp_path, 1, p)
    with torch.no_grad():
        p.model.fc.weight[0, :3] = math.nan
    with pytest.raises(CheckpointError, match=r"3 of \d+ weight values are not finite.*fc"):
        save(tmp_path, 2, p)
    assert sorted(x.name for x in tmp_path.iterdir()) == [good.name]


def test_a_failed_write_is_removed_and_names_path_free_space_and_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = parts()

    def disk_full(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError) as failed:
        save(tmp_path, 3, p)
    message = str(failed.value)
    assert str(tmp_path / "step_00000003") in message and "unexpected pos" in message
    assert "MiB free" in message and "needs about" in message
    assert list(tmp_path.iterdir()) == []


def test_free_space_is_checked_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = parts()
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage._replace(free=4096))
    with pytest.raises(CheckpointError, match=r"0\.0 MiB free .* needs about 1\.\d MiB .*"
                       r"not enough space"):  # fmt: skip
        save(tmp_path, 1, p)
    assert list(tmp_path.iterdir()) == []


def _trained_one_step(p: Parts) -> Parts:
    """`p` after one optimizer step on a made-up loss, so the optimizer holds state."""
    loss = sum(param.float().square().sum() for param in p.model.parameters())
    loss.backward()
    p.optimizer.step()
    p.optimizer.zero_grad()
    return p


def test_the_space_needed_counts_weights_and_optimizer_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _trained_one_step(parts())
    tensors = [*p.model.state_dict().values()] + [
        value
        for per_param in p.optimizer.state_dict()["state"].values()
        for value in per_param.values()
        if isinstance(value, torch.Tensor)
    ]
    need = sum(t.numel() * t.element_size() for t in tensors) + SIZE_MARGIN_BYTES
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage._replace(free=need - 1))
    with pytest.raises(CheckpointError, match="not enough space"):
        save(tmp_path, 1, p)
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage._replace(free=need))
    assert save(tmp_path, 1, p).is_dir()


def test_a_checkpoint_of_the_same_step_is_replaced_whole(tmp_path: Path) -> None:
    p = parts()
    save(tmp_path, 5, p)
    with torch.no_grad():
        p.model.fc.weight.add_(1.0)
    written = save(tmp_path, 5, p)
    assert [x.name for x in tmp_path.iterdir()] == [written.name]
    loaded = load_checkpoint(written, "cpu").model
    assert torch.equal(loaded.fc.weight, p.model.fc.weight)


def test_a_crashed_saves_leftovers_are_removed(tmp_path: Path) -> None:
    for leftover in (".tmp-step_00000003-999", ".old-step_00000002-999"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / WEIGHTS_FILE).write_bytes(b"half")
    written = save(tmp_path, 4, parts())
    assert [x.name for x in tmp_path.iterdir()] == [written.name]


def test_every_file_of_a_checkpoint_has_the_same_permissions(tmp_path: Path) -> None:
    """safetensors creates its file 0600; a checkpoint's files all get the mode Python's
    files get under the umask, so whoever may read the config may load the weights."""
    written = save(tmp_path, 1, parts())
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in written.iterdir()}
    assert set(modes) >= set(REQUIRED_FILES)
    assert len(set(modes.values())) == 1, modes
    assert modes[WEIGHTS_FILE] == stat.S_IMODE((written / CONFIG_FILE).stat().st_mode)


def test_latest_checkpoint_of_this_run_only(tmp_path: Path) -> None:
    p = parts()
    ours = save(tmp_path, 4, p, run_id="ours")
    save(tmp_path, 100, p, run_id="theirs")
    legacy = save(tmp_path, 2, p)  # written before checkpoints named their run
    assert latest_checkpoint(tmp_path, "ours") == ours
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000100"
    shutil.rmtree(ours)
    assert latest_checkpoint(tmp_path, "ours") == legacy


def test_resumed_schedule_and_settings_follow_the_config(tmp_path: Path) -> None:
    p = parts(paper_optim(lr=1e-2, min_lr_ratio=0.0, warmup_fraction=0.1), total_steps=4)
    for _ in range(4):
        p.optimizer.step()
        p.scheduler.step()
    assert p.scheduler.get_last_lr() == [0.0, 0.0]  # the old schedule ended
    loaded = load_checkpoint(save(tmp_path, 4, p), "cpu")
    changed = paper_optim(lr=2e-2, beta2=0.99, weight_decay=0.1, warmup_fraction=0.1)
    fresh = parts(changed, total_steps=8)
    loaded.restore(fresh.optimizer)
    assert resume_settings(fresh.optimizer, changed, loaded.saved_schedule) == [
        "optim.lr 0.01 -> 0.02",
        "optim.beta2 0.95 -> 0.99",
        "optim.weight_decay 0.0 -> 0.1",
    ]
    scheduler = schedule_at(fresh.optimizer, changed, 8, loaded.step)
    expected = 2e-2 * WarmupCosine(8, 0.1, 0.0)(4)
    assert scheduler.last_epoch == 4 and scheduler.get_last_lr() == [expected, expected]
    decay, no_decay = fresh.optimizer.param_groups
    assert decay["betas"] == (0.9, 0.99) and decay["weight_decay"] == 0.1
    assert no_decay["weight_decay"] == 0.0 and expected > 0
