"""A trained DFlash drafter loaded as the block drafter of speculative decoding: from a
checkpoint, a checkpoints root or a run directory, checked against the target it drafts
for, with the target's own embedding and LM head."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import load_file

from ringtrain.checkpoint import save_checkpoint
from ringtrain.checkpoint.resume_record import ResumeRecord
from ringtrain.drafter import DFlashDrafter, build_optimizer
from ringtrain.eval.dflash import (
    check_compatible,
    load_dflash_drafter,
    read_drafter_spec,
    resolve_drafter_dir,
)
from ringtrain.eval.target import VerifyingTarget
from ringtrain.generate.model import load_causal_lm
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.eval_drafters import TAPS, write_drafter
from tests.helpers.tiny_drafter import paper_optim

pytestmark = pytest.mark.usefixtures("one_thread")

NEWEST = "step_00000010"


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_target(
        tmp_path_factory.mktemp("target"), seed=1, hybrid=False, num_layers=6, hidden_size=32
    )


@pytest.fixture(scope="module")
def verifier(target_dir: Path) -> VerifyingTarget:
    return VerifyingTarget(load_causal_lm(target_dir, dtype="float32"), TAPS)


@pytest.fixture(scope="module")
def exported(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A drafter as exported: config.json and model.safetensors only."""
    return write_drafter(tmp_path_factory.mktemp("exported") / "drafter", target_dir)


@pytest.fixture(scope="module")
def run_dir(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training run's directory with checkpoints of steps 5 and 10 (different weights)."""
    run = tmp_path_factory.mktemp("run")
    spec = read_drafter_spec(exported)
    for step in (5, 10):
        torch.manual_seed(step)
        model = DFlashDrafter(spec)
        optimizer, scheduler = build_optimizer(model, paper_optim(), total_steps=10)
        record = ResumeRecord(step=step)
        save_checkpoint(run / "checkpoints", step, model, spec, optimizer, scheduler, record)
    return run


# ---- which directory ----------------------------------------------------------------------


def test_an_exported_drafter_is_its_own_checkpoint(exported: Path) -> None:
    assert resolve_drafter_dir(exported) == exported


def test_a_run_directory_or_its_checkpoints_give_the_newest_checkpoint(run_dir: Path) -> None:
    assert resolve_drafter_dir(run_dir) == run_dir / "checkpoints" / NEWEST
    assert resolve_drafter_dir(run_dir / "checkpoints") == run_dir / "checkpoints" / NEWEST


def test_a_home_relative_path_is_expanded(exported: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(exported.parent))
    assert resolve_drafter_dir("~/drafter") == exported


def test_a_config_without_weights_is_no_checkpoint(exported: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes((exported / "config.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="not a drafter checkpoint"):
        resolve_drafter_dir(tmp_path)


# ---- the drafter loaded -----------------------------------------------------------------


def test_the_newest_checkpoints_weights_are_loaded_frozen(
    run_dir: Path, verifier: VerifyingTarget
) -> None:
    drafter = load_dflash_drafter(run_dir, verifier)
    model = drafter.proposals.model
    saved = load_file(str(run_dir / "checkpoints" / NEWEST / "model.safetensors"))
    loaded = model.state_dict()
    assert loaded.keys() == saved.keys()
    for name, tensor in saved.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0, msg=name)
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


def test_the_drafter_shares_the_targets_embedding_and_head(
    exported: Path, verifier: VerifyingTarget
) -> None:
    drafter = load_dflash_drafter(exported, verifier)
    spec = read_drafter_spec(exported)
    assert (drafter.block_size, drafter.mask_token_id) == (spec.block_size, spec.mask_token_id)
    assert drafter.tap_layers == TAPS
    lm = verifier.model
    head = drafter.proposals.head
    assert head.embed.data_ptr() == lm.get_input_embeddings().weight.data_ptr()
    assert head.lm_head.data_ptr() == lm.get_output_embeddings().weight.data_ptr()
    assert not drafter.proposals.graphed  # CUDA graphs on CUDA only
    block = torch.full((spec.block_size,), spec.mask_token_id)
    block[0] = 7
    context = torch.randn(5, verifier.tap_width)
    assert drafter.propose(context, block, 5).shape == (spec.block_size - 1,)


def test_the_drafter_runs_in_the_targets_dtype(exported: Path, target_dir: Path) -> None:
    target = VerifyingTarget(load_causal_lm(target_dir, dtype="bfloat16"), TAPS)
    drafter = load_dflash_drafter(exported, target)
    assert {p.dtype for p in drafter.proposals.model.parameters()} == {torch.bfloat16}


# ---- the target it drafts for -----------------------------------------------------------


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "num_target_layers"])
def test_a_drafter_of_another_target_shape_is_refused(
    exported: Path, verifier: VerifyingTarget, field: str
) -> None:
    spec = read_drafter_spec(exported)
    check_compatible(spec, verifier, "d")
    other = msgspec.structs.replace(spec, **{field: getattr(spec, field) + 1})
    with pytest.raises(ValueError, match=f"d: the drafter has {field} = "):
        check_compatible(other, verifier, "d")


def test_a_target_tapping_other_layers_is_refused(
    exported: Path, verifier: VerifyingTarget
) -> None:
    other = VerifyingTarget(verifier.model, [0, 2, 4])
    with pytest.raises(ValueError, match=r"the drafter taps layers \[1, 3, 5\] but the target"):
        load_dflash_drafter(exported, other)
