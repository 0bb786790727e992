"""A text corpus present on every machine: the Python standard library's own files.

The toy recipe (tools/make_toy_target.py, tools/regenerate.py) trains its target and
carves its prompts from this text, so it needs no download: the standard library's
sources (found through ``sysconfig``), its documentation topics (``pydoc_data``) and its
licence. Files are read in sorted order and capped by size, so the corpus is the same
on every run of one Python installation.
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Callable
from pathlib import Path

# Directories of the standard library that hold tests, vendored data or generated tables.
SKIPPED_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "encodings"}


def stdlib_root() -> Path:
    """The standard library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path | None = None) -> list[Path]:
    """The corpus files in a fixed order: the licence, the docs topics, then sources."""
    root = root or stdlib_root()
    first = [root / "LICENSE.txt", root / "pydoc_data" / "topics.py"]
    sources = sorted(
        path
        for path in root.rglob("*.py")
        if not SKIPPED_PARTS.intersection(path.relative_to(root).parts) and path not in first
    )
    files = [path for path in first if path.is_file()] + sources
    if not files:
        raise FileNotFoundError(
            f"no Python sources under {root}: this interpreter ships without its standard "
            f"library sources; install the full Python distribution"
        )
    return files


def read_corpus(max_bytes: int, root: Path | None = None) -> list[str]:
    """Documents (one per file) of the corpus, in order, until ``max_bytes`` of text."""
    documents: list[str] = []
    total = 0
    for path in corpus_files(root):
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            continue
        documents.append(text[: max_bytes - total])
        total += len(documents[-1])
        if total >= max_bytes:
            break
    return documents


SPLITS = {"train": (0.0, 0.9), "eval": (0.9, 1.0)}


def carve_prompts(
    documents: list[str],
    encode: Callable[[str], list[int]],
    count: int,
    length: int,
    split: str,
    seed: int,
) -> list[dict]:
    """``count`` prompts of ``length`` tokens, each starting at a line start of the corpus.

    The text is cut into a train part (first 90%) and an eval part (last 10%), so prompt
    sets of the two splits never share text. Deterministic for a seed. Each prompt is
    ``{"input_ids": [...]}``.
    """
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    text = "\n".join(documents)
    low, high = (int(fraction * len(text)) for fraction in SPLITS[split])
    span = length * 16  # characters that hold `length` tokens with room to spare
    if high - low < 2 * span:
        raise ValueError(
            f"the corpus {split} part ({high - low} characters) is too short for "
            f"{length}-token prompts; lower the prompt length"
        )
    rng = random.Random(seed)
    prompts = []
    attempts = 0
    while len(prompts) < count:
        attempts += 1
        if attempts > 20 * count:
            raise ValueError(
                f"could not carve {count} prompts of {length} tokens from the corpus "
                f"{split} part; lower the count or the prompt length"
            )
        start = text.find("\n", rng.randrange(low, high - span), high - span) + 1
        if start <= 0:
            continue
        ids = encode(text[start : start + span])[:length]
        if len(ids) < length or not text[start : start + span].strip():
            continue
        prompts.append({"input_ids": ids})
    return prompts
