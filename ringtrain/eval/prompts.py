"""Prompt sets: JSONL files with one prompt per line, as text or as token ids.

Each line is an object with either ``prompt`` (text, encoded with the target's
tokenizer without special tokens) or ``input_ids`` (a list of ints).
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedTokenizerBase


class PromptFileError(ValueError):
    """A prompts file that cannot be used; the message names the file, the line and the fix."""


def read_prompt_records(path: str | Path) -> list[dict]:
    """The JSON objects of a prompts file, checked to carry ``prompt`` or ``input_ids``."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptFileError(f"{path}: cannot read prompts file: {exc.strerror}") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(record, dict) or not ("prompt" in record or "input_ids" in record):
            raise PromptFileError(
                f'{path}:{number}: each line must be an object with "prompt" (text) or '
                f'"input_ids" (list of ints)'
            )
        records.append(record)
    if not records:
        raise PromptFileError(f"{path}: no prompts; write one JSON object per line")
    return records


def load_prompts(
    path: str | Path, tokenizer: PreTrainedTokenizerBase | None, vocab_size: int
) -> list[list[int]]:
    """Token ids of every prompt in ``path`` (text prompts need ``tokenizer``)."""
    prompts = []
    for number, record in enumerate(read_prompt_records(path), start=1):
        if "input_ids" in record:
            ids = record["input_ids"]
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                raise PromptFileError(f"{path}: prompt {number}: input_ids must be a list of ints")
        else:
            if tokenizer is None:
                raise PromptFileError(
                    f"{path}: prompt {number} is text but the target directory has no "
                    f"tokenizer; give input_ids instead"
                )
            ids = tokenizer.encode(record["prompt"], add_special_tokens=False)
        if not ids:
            raise PromptFileError(f"{path}: prompt {number} is empty")
        if not all(0 <= t < vocab_size for t in ids):
            raise PromptFileError(
                f"{path}: prompt {number} has token ids outside the target's vocabulary "
                f"(0..{vocab_size - 1}); were they made with another tokenizer?"
            )
        prompts.append(ids)
    return prompts
