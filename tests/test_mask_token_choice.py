"""Which token drafter.mask_token_id = -1 (auto) picks from a real tokenizer saved as the hub
lays it out: only tokens inside the model's vocabulary, only special tokens, names matched
whole and in any case, the first reserved token, a mask-named token before a spare id, and
a warning when the target has no tokenizer at all."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config

from ringtrain.drafter.config import DrafterConfig
from ringtrain.trainer.logs import LOGGER_NAME
from ringtrain.trainer.plan import resolve_mask_token

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]  # ids 0..7


def write_target(
    directory: Path, vocab_size: int, specials: list[str], plain: tuple[str, ...] = (), **roles: str
) -> Path:
    """A target directory (config.json, tokenizer files) whose word-level tokenizer has
    WORDS, then the added tokens `plain` (not special), then `specials`; `roles` names
    special tokens (mask_token=...)."""
    Qwen3Config(vocab_size=vocab_size, hidden_size=16, num_attention_heads=2).save_pretrained(
        directory
    )
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="the"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_tokens([AddedToken(text, special=False) for text in plain])
    backend.add_special_tokens(specials)
    PreTrainedTokenizerFast(tokenizer_object=backend, **roles).save_pretrained(directory)
    return directory


def resolved(directory: Path, vocab_size: int) -> int:
    return resolve_mask_token(DrafterConfig(), directory, vocab_size, False).mask_token_id


def test_the_tokenizers_mask_token_past_the_vocabulary_is_not_taken(tmp_path: Path) -> None:
    """Tokenizer ids 0..10, model vocabulary 0..9: the mask token (10) has no embedding
    row, so the reserved token (9) is taken."""
    target = write_target(
        tmp_path, 10, ["<|eos|>", "<|reserved_0|>", "<|mask|>"], mask_token="<|mask|>"
    )
    assert resolved(target, 10) == 9


def test_a_special_token_past_the_vocabulary_is_not_taken(tmp_path: Path) -> None:
    """A `<|mask|>` (10) or a reserved token (10) past a vocabulary of 10 ids is no choice."""
    named = write_target(tmp_path / "named", 10, ["<|eos|>", "<|reserved_0|>", "<|mask|>"])
    assert resolved(named, 10) == 9
    reserved = write_target(tmp_path / "reserved", 10, ["<|eos|>", "<|end|>", "<|reserved_0|>"])
    assert resolved(reserved, 10) == 9  # no choice left: the last id


def test_an_added_token_that_is_not_special_is_not_taken(tmp_path: Path) -> None:
    """`<mask>` (8) and `<|reserved_1|>` (9) added as ordinary tokens are text the data may
    hold: the special `<|reserved_0|>` (10) is taken."""
    target = write_target(tmp_path, 11, ["<|reserved_0|>"], plain=("<mask>", "<|reserved_1|>"))
    assert resolved(target, 11) == 10


def test_a_name_that_only_begins_as_a_mask_is_not_a_mask(tmp_path: Path) -> None:
    target = write_target(tmp_path, 11, ["<|mask_start|>", "<mask_1>", "<|reserved_0|>"])
    assert resolved(target, 11) == 10


def test_a_mask_named_in_capitals_is_taken(tmp_path: Path) -> None:
    """BERT's `[MASK]` (9), not registered as the tokenizer's mask token."""
    target = write_target(tmp_path, 11, ["[CLS]", "[MASK]", "[SEP]"])
    assert resolved(target, 11) == 9


def test_the_first_reserved_token_is_taken(tmp_path: Path) -> None:
    specials = ["<|reserved_special_token_0|>", "<|reserved_special_token_1|>", "<unused0>"]
    assert resolved(write_target(tmp_path, 11, specials), 11) == 8


def test_a_special_token_named_as_a_mask_comes_before_an_id_past_the_tokenizer(
    tmp_path: Path,
) -> None:
    """Tokenizer ids 0..9, model vocabulary 0..15: `<mask>` (9), not the spare id 10."""
    target = write_target(tmp_path, 16, ["<|eos|>", "<mask>"])
    assert resolved(target, 16) == 9


def test_a_target_without_a_tokenizer_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A model directory with no tokenizer files: the last id, as a warning saying so."""
    Qwen3Config(vocab_size=12, hidden_size=16, num_attention_heads=2).save_pretrained(tmp_path)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        cfg = resolve_mask_token(DrafterConfig(), tmp_path, 12, announce=True)
    assert cfg.mask_token_id == 11
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    message = caplog.records[0].getMessage()
    assert "using id 11 ''" in message and "the target has no tokenizer" in message
    assert "set drafter.mask_token_id = N" in message
