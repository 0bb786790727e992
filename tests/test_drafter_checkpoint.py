"""Checkpoints (exact round trip, HF-readable config, atomicity), spec and frozen-head loading."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3Config

from ringtrain.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ringtrain.checkpoint.resume import ResumePoint, resume_training, save_training
from ringtrain.checkpoint.resume_checks import check_resume_spec
from ringtrain.checkpoint.resume_record import ResumeRecord, StreamCursor
from ringtrain.config import ConfigError
from ringtrain.drafter import (
    build_optimizer,
    drafter_spec_from_target,
    load_frozen_head,
    optimizer_step,
)
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.hf_config import hf_config_dict, spec_from_hf_config
from ringtrain.drafter.optim import resume_settings, schedule_at
from tests.helpers.checkpoints import TARGET, trained_state
from tests.helpers.tiny_drafter import all_visible, paper_optim

LAYER_WEIGHTS = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    "input_layernorm", "post_attention_layernorm",
)  # fmt: skip
EXPECTED_WEIGHTS = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
    f"layers.{n}.{name}.weight" for n in range(2) for name in LAYER_WEIGHTS
}


def test_round_trip_is_exact_and_config_is_a_dflash_qwen3_config(tmp_path: Path) -> None:
    spec, model, optimizer, scheduler = trained_state(steps=2)
    record = ResumeRecord(step=2, run_id="r", cursors={0: StreamCursor(3, (4,))})
    path = save_checkpoint(tmp_path, 2, model, spec, optimizer, scheduler, record)
    assert path == tmp_path / "step_00000002"
    loaded = load_checkpoint(tmp_path, "cpu")
    assert loaded.path == path and loaded.step == 2 and loaded.record == record
    assert loaded.spec == spec
    assert set(loaded.model.state_dict()) == EXPECTED_WEIGHTS
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name

    raw = json.loads((path / "config.json").read_text())
    hf = Qwen3Config(**raw)
    assert hf.architectures == ["DFlashDraftModel"] and hf.model_type == "qwen3"
    assert (hf.hidden_size, hf.num_hidden_layers, hf.head_dim) == (16, 2, 4)
    assert hf.layer_types == ["full_attention", "sliding_attention"] and hf.sliding_window == 8
    assert raw["block_size"] == 4 and raw["num_target_layers"] == 6
    assert raw["dflash_config"] == {
        "block_size": 4,
        "mask_token_id": 39,
        "target_layer_ids": [1, 2, 4],
        "causal": False,
    }
    assert raw["is_causal"] is False
    assert spec_from_hf_config(raw) == spec
    state_only = load_checkpoint(path, "cpu", weights=False)
    assert state_only.model is None and state_only.record == record


def test_a_resume_refuses_a_checkpoint_of_another_drafter_shape_naming_it(
    tmp_path: Path,
) -> None:
    spec, model, optimizer, scheduler = trained_state(steps=1)
    record = ResumeRecord(step=1, run_id="r", cursors={0: StreamCursor(3, (4,))})
    path = save_checkpoint(tmp_path, 1, model, spec, optimizer, scheduler, record)
    check_resume_spec(path, spec)  # the same shape resumes
    wider = msgspec.structs.replace(spec, num_layers=3, block_size=8)
    with pytest.raises(ConfigError) as refused:
        check_resume_spec(path, wider)
    message = str(refused.value)
    assert "was trained for another drafter shape" in message
    assert "num_layers 2 in the checkpoint vs 3 now" in message
    assert "block_size 4 in the checkpoint vs 8 now" in message and "hidden_size" not in message


def test_resume_continues_exactly(tmp_path: Path) -> None:
    spec, model, optimizer, scheduler_after_2 = trained_state(steps=2)
    save_checkpoint(tmp_path, 2, model, spec, optimizer, scheduler_after_2, ResumeRecord(step=2))
    _, uninterrupted, _, _ = trained_state(steps=4)

    loaded = load_checkpoint(tmp_path, "cpu")
    opt_b, _ = build_optimizer(loaded.model, paper_optim(), total_steps=10)
    loaded.restore(opt_b)
    assert resume_settings(opt_b, paper_optim(), loaded.saved_schedule) == []
    sched_b = schedule_at(opt_b, paper_optim(), 10, loaded.step)
    assert sched_b.last_epoch == 2 and sched_b.get_last_lr() == scheduler_after_2.get_last_lr()
    for _ in range(2):
        loaded.model(
            torch.randn(5, 48), torch.arange(5), torch.randn(8, 16), torch.arange(5, 13),
            all_visible(8, 13, 2),
        ).square().mean().backward()  # fmt: skip
        optimizer_step(loaded.model, opt_b, sched_b, paper_optim())
    # restore() put the torch RNG back where it was after step 2, so steps 3-4 drew the
    # same random inputs as the uninterrupted run.
    for name, tensor in uninterrupted.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name


def test_a_saved_training_resumes_at_its_step_cursors_and_last_round(tmp_path: Path) -> None:
    spec, model, optimizer, scheduler = trained_state(steps=2)
    cursors = {0: StreamCursor(3, (5,)), 1: StreamCursor(2, ())}
    for step in (1, 2):
        record = ResumeRecord(step=step, run_id="r", cursors=cursors, eval_step=step - 1)
        path = save_training(tmp_path, record, model, spec, optimizer, scheduler, keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000002"]

    _, fresh, fresh_optimizer, _ = trained_state(steps=0)
    point, resumed = resume_training(
        path, fresh, fresh_optimizer, paper_optim(), 10, torch.device("cpu")
    )
    assert point == ResumePoint(step=2, cursors=cursors, evaluated_step=1)
    assert resumed.last_epoch == 2 and resumed.get_last_lr() == scheduler.get_last_lr()
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name


def test_latest_ignores_partial_and_temporary_checkpoints(tmp_path: Path) -> None:
    spec, model, optimizer, scheduler = trained_state(steps=0)
    save_checkpoint(tmp_path, 100, model, spec, optimizer, scheduler, ResumeRecord(step=100))
    save_checkpoint(tmp_path, 50, model, spec, optimizer, scheduler, ResumeRecord(step=50))
    partial = tmp_path / "step_00000300"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    temp = tmp_path / ".tmp-step_00000400-1"
    temp.mkdir()
    for name in ("config.json", "model.safetensors", "training_state.pt"):
        (temp / name).write_text("")
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000100"
    again = ResumeRecord(step=100, run_id="again")
    save_checkpoint(tmp_path, 100, model, spec, optimizer, scheduler, again)
    assert load_checkpoint(tmp_path, "cpu").record == again
    assert latest_checkpoint(tmp_path / "missing") is None
    with pytest.raises(FileNotFoundError, match="step_N"):
        load_checkpoint(tmp_path / "empty", "cpu")


def test_spec_follows_the_target_and_config_overrides() -> None:
    nested = {"model_type": "qwen3_5", "text_config": {**TARGET, "head_dim": 8}}
    spec = drafter_spec_from_target(nested, DrafterConfig(num_layers=3), [0, 5])
    assert (spec.hidden_size, spec.vocab_size, spec.head_dim) == (16, 40, 8)
    assert spec.mask_token_id == 39 and spec.rope_theta == 5e5 and spec.rms_norm_eps == 1e-5
    assert spec.sliding_windows == (0, 0, 0)
    wide = drafter_spec_from_target(TARGET, DrafterConfig(intermediate_size=64, head_dim=2), [1])
    assert (wide.intermediate_size, wide.head_dim) == (64, 2)
    with pytest.raises(ValueError, match="tapped layer 6 is out of range"):
        drafter_spec_from_target(TARGET, DrafterConfig(), [1, 6])
    with pytest.raises(ValueError, match="mask_token_id=40"):
        drafter_spec_from_target(TARGET, DrafterConfig(mask_token_id=40), [1])
    with pytest.raises(ValueError, match="one per layer"):
        drafter_spec_from_target(TARGET, DrafterConfig(sliding_windows=[0]), [1])
    assert json.loads(json.dumps(hf_config_dict(spec)))["dflash_config"]["target_layer_ids"] == [
        0,
        5,
    ]


def write_target(path: Path, tensors_per_file: list[dict[str, torch.Tensor]], config: dict) -> None:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if len(tensors_per_file) == 1:
        save_file(tensors_per_file[0], str(path / "model.safetensors"))
        return
    weight_map = {}
    for i, tensors in enumerate(tensors_per_file):
        name = f"model-{i + 1:05d}-of-{len(tensors_per_file):05d}.safetensors"
        save_file(tensors, str(path / name))
        weight_map.update(dict.fromkeys(tensors, name))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_frozen_head_is_read_by_key_from_sharded_and_tied_targets(tmp_path: Path) -> None:
    embed, lm_head, other = torch.randn(3, 40, 16)
    write_target(
        tmp_path / "sharded",
        [
            {"model.language_model.embed_tokens.weight": embed, "model.layers.0.x.weight": other},
            {"lm_head.weight": lm_head},
        ],
        {"text_config": TARGET},
    )
    head = load_frozen_head(tmp_path / "sharded", "cpu", torch.float64)
    assert head.embed.dtype == torch.float64 and torch.equal(head.embed, embed.double())
    assert torch.equal(head.lm_head, lm_head.double()) and head.vocab_size == 40

    write_target(
        tmp_path / "tied",
        [{"model.embed_tokens.weight": embed, "lm_head.weight": lm_head}],
        {**TARGET, "tie_word_embeddings": True},
    )
    tied = load_frozen_head(tmp_path / "tied", "cpu", torch.float32)
    assert tied.lm_head is tied.embed and torch.equal(tied.embed, embed)

    write_target(tmp_path / "headless", [{"model.embed_tokens.weight": embed}], TARGET)
    assert torch.equal(load_frozen_head(tmp_path / "headless", "cpu", torch.float32).lm_head, embed)

    write_target(tmp_path / "bad", [{"transformer.wte.weight": embed}], TARGET)
    with pytest.raises(KeyError, match="no token embedding"):
        load_frozen_head(tmp_path / "bad", "cpu", torch.float32)
