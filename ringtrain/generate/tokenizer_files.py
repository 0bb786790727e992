"""Whether a model directory holds a tokenizer: a check that imports nothing heavy, for
the drafter ranks and the data commands, which need a tokenizer but never the model code
(transformers' modeling imports take seconds)."""

from __future__ import annotations

from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def has_tokenizer_files(model_dir: str | Path) -> bool:
    """Whether a model directory holds a tokenizer (any of TOKENIZER_FILES): without one,
    transformers builds an empty tokenizer of the model's class from config.json alone."""
    return any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES)
