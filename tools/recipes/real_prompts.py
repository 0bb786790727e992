"""The real-model recipe's training prompts: code requests and the target's own user turns.

A drafter accepts well on the traffic it was trained on. Code prompts alone (built from
the installed Python sources, ringtrain.data.code_prompts) make a code specialist; the
general recipe adds user requests that the target writes itself from its chat template
(``ringtrain-data synthesize``, the Magpie method) so the drafter also follows the target
on chat, writing and math. ``synth_fraction`` of the training prompts are synthesized,
the rest are code prompts; both are mixed by ringtrain.data.mixture (exact counts per
source, a seeded shuffle, so the first N rows of the mixture keep the proportion), and
the counts per source are written beside the prompts file (``<prompts>.sources.json``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ringtrain.data.code_prompts import build_prompts, write_jsonl
from ringtrain.data.mixture import Mixture, Source, write_mixture

# Synthesized user turns: sampled at the temperature the method uses; short requests.
SYNTH_TEMPERATURE = 1.0
SYNTH_MAX_TOKENS = 128


def synthesize_command(target: Path, output: Path, count: int, seed: int, device: str) -> list[str]:
    """``ringtrain-data synthesize`` for ``count`` single-turn prompts."""
    return [
        sys.executable, "-m", "ringtrain.cli.data", "synthesize",
        "--target", str(target), "--output", str(output), "--num", str(count),
        "--seed", str(seed), "--temperature", str(SYNTH_TEMPERATURE),
        "--max-tokens", str(SYNTH_MAX_TOKENS), "--device", device,
    ]  # fmt: skip


def code_prompts(count: int, seed: int, output: Path) -> int:
    """Write ``count`` code prompts (all there are, if fewer) to ``output``; returns how many."""
    return write_jsonl(build_prompts(count, seed=seed), output)


def general_prompts(
    target: Path, total: int, synth_fraction: float, seed: int, device: str, output: Path
) -> dict[str, int]:
    """Write ``total`` training prompts to ``output``: ``synth_fraction`` of them written by
    the target, the rest code prompts, mixed; returns the count per source."""
    synthesized = round(total * synth_fraction)
    sources = []
    if synthesized < total:
        code_file = output.with_name(output.stem + ".code.jsonl")
        made = code_prompts(total - synthesized, seed, code_file)
        sources.append(Source("code", code_file, rows=made))
    if synthesized:
        synth_file = output.with_name(output.stem + ".synthesized.jsonl")
        command = synthesize_command(target, synth_file, synthesized, seed, device)
        subprocess.run(command, check=True)
        sources.append(Source("synthesized", synth_file, rows=synthesized))
    drawn = write_mixture(Mixture(sources, seed=seed), output)
    counts = {mixed.source.name: mixed.drawn for mixed in drawn}
    output.with_suffix(".sources.json").write_text(json.dumps(counts) + "\n")
    return counts
