"""drafter.mask_token_id = -1 (auto) is never silently an ordinary token: it takes the
target tokenizer's mask token, else a token no text maps to, else warns once naming the
id it falls back to. Targets are tiny real models and tokenizers written to disk."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config

from ringtrain.drafter.config import DrafterConfig
from ringtrain.trainer.logs import LOGGER_NAME
from ringtrain.trainer.plan import resolve_mask_token

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]


def write_target(directory: Path, vocab_size: int, specials: list[str], **roles: str) -> Path:
    """A tiny Qwen3 (save_pretrained) with a word-level tokenizer: WORDS, then `specials`;
    `roles` names special tokens (mask_token=..., eos_token=...)."""
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="the"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(specials)
    PreTrainedTokenizerFast(tokenizer_object=backend, **roles).save_pretrained(directory)
    return directory


def resolved(directory: Path, vocab_size: int, announce: bool = True) -> int:
    return resolve_mask_token(DrafterConfig(), directory, vocab_size, announce).mask_token_id


def test_the_tokenizers_mask_token_is_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The mask token is id 9, not the last id (10); choosing it is logged, not warned."""
    target = write_target(tmp_path, 11, ["<|eos|>", "<|mask|>", "<|end|>"], mask_token="<|mask|>")
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        assert resolved(target, 11) == 9
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "using id 9 '<|mask|>', the tokenizer's mask token" in caplog.text


def test_a_special_token_named_as_a_mask_is_used(tmp_path: Path) -> None:
    target = write_target(tmp_path, 11, ["<|eos|>", "<mask>", "<|end|>"])
    assert resolved(target, 11) == 9


def test_an_id_past_the_tokenizer_is_used_before_a_reserved_token(tmp_path: Path) -> None:
    """Tokenizer ids 0..9, model vocabulary 0..15: id 10 is an embedding row no text maps to."""
    target = write_target(tmp_path, 16, ["<|reserved_0|>", "<|end|>"])
    assert resolved(target, 16) == 10


def test_a_reserved_special_token_is_used(tmp_path: Path) -> None:
    target = write_target(tmp_path, 11, ["<|eos|>", "<|reserved_special_token_0|>", "<|end|>"])
    assert resolved(target, 11) == 9


def test_the_last_id_of_an_ordinary_vocabulary_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SmolLM2's case: no mask token, no spare ids, no reserved token; the last id is a word."""
    target = write_target(tmp_path, 8, [])
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        assert resolved(target, 8) == 7
        assert resolved(target, 8, announce=False) == 7  # another rank: silent
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    message = caplog.records[0].getMessage()
    assert "using id 7 'ran'" in message
    assert "set drafter.mask_token_id = N" in message and "unused special token" in message


def test_an_explicit_id_is_kept_without_reading_the_tokenizer(tmp_path: Path) -> None:
    cfg = DrafterConfig(mask_token_id=3)
    assert resolve_mask_token(cfg, tmp_path / "no-target", 8, announce=True) is cfg


def test_a_resume_keeps_the_id_its_checkpoint_was_trained_with(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A drafter trained with id 10 (an older auto choice) keeps it, whatever auto picks now."""
    target = write_target(tmp_path, 11, ["<|eos|>", "<|mask|>", "<|end|>"], mask_token="<|mask|>")
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        cfg = resolve_mask_token(DrafterConfig(), target, 11, announce=True, resumed_mask=10)
    assert cfg.mask_token_id == 10
    assert "resuming with the checkpoint's id 10" in caplog.text


def test_a_resumed_id_outside_the_vocabulary_is_not_taken(tmp_path: Path) -> None:
    """A checkpoint's id past this target's vocabulary belongs to another target: auto
    chooses from this target's tokenizer (the resume check then refuses the checkpoint)."""
    target = write_target(tmp_path, 11, ["<|eos|>", "<|mask|>", "<|end|>"], mask_token="<|mask|>")
    cfg = resolve_mask_token(DrafterConfig(), target, 11, announce=False, resumed_mask=11)
    assert cfg.mask_token_id == resolve_mask_token(DrafterConfig(), target, 11, False).mask_token_id
    assert cfg.mask_token_id < 11
