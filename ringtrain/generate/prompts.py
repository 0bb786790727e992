"""Prompt files: JSONL with one prompt per line, and the checks every prompt passes.

Each line is an object with one of ``input_ids`` (a list of ints), ``messages`` (an
OpenAI-style chat), ``turns`` (a list of user turns, MT-Bench style), ``question``
(GSM8K style) or ``prompt`` (text); ringtrain.generate.prompt_sets reads them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported for type hints only: prompt handling loads without it
    from transformers import PreTrainedTokenizerBase

# The fields a prompt line may carry, in the order they are looked for.
RECORD_FIELDS = ("input_ids", "messages", "turns", "question", "prompt")


class PromptFileError(ValueError):
    """A prompts file that cannot be used; the message names the file, the line and the fix."""


def _field_list(fields: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in fields)


def read_prompt_records(
    path: str | Path, fields: Sequence[str] = RECORD_FIELDS
) -> list[tuple[int, dict]]:
    """(line number, JSON object) of each prompt in ``path``, checked to carry one of ``fields``."""
    path = Path(path)
    try:
        # JSONL lines end at "\n" only: str.splitlines() would also cut at characters JSON
        # leaves unescaped inside strings (U+2028, U+2029, U+0085).
        lines = path.read_text(encoding="utf-8").split("\n")
    except OSError as exc:
        raise PromptFileError(f"{path}: cannot read prompts file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise PromptFileError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save the file as UTF-8"
        ) from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(record, dict) or not any(name in record for name in fields):
            raise PromptFileError(
                f"{path}:{number}: each line must be an object with one of {_field_list(fields)}"
            )
        records.append((number, record))
    if not records:
        raise PromptFileError(f"{path}: no prompts; write one JSON object per line")
    return records


def check_prompt_ids(ids: object, vocab_size: int, where: str) -> list[int]:
    """``ids`` when it is a non-empty list of token ids of the target's vocabulary."""
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise PromptFileError(f"{where}: input_ids must be a list of ints")
    if not ids:
        raise PromptFileError(f"{where}: the prompt is empty")
    if not all(0 <= t < vocab_size for t in ids):
        raise PromptFileError(
            f"{where}: token ids outside the target's vocabulary (0..{vocab_size - 1}); "
            f"were they made with another tokenizer?"
        )
    return ids


def prompt_text(value: object, where: str) -> str:
    """The text of a ``prompt`` field, checked."""
    if not isinstance(value, str):
        raise PromptFileError(
            f'{where}: "prompt" must be text; a list of user turns goes in "turns"'
        )
    return value


def encode_raw(tokenizer: PreTrainedTokenizerBase | None, text: str, where: str) -> list[int]:
    """``text`` encoded without the chat template and without special tokens."""
    if tokenizer is None:
        raise PromptFileError(
            f"{where}: the prompt is text but the target directory has no tokenizer; "
            f"give input_ids instead"
        )
    return tokenizer.encode(text, add_special_tokens=False)
