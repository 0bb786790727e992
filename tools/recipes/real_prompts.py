"""The real-model recipe's training prompts: code requests and the target's own user turns.

A drafter accepts well on the traffic it was trained on. Code prompts alone (built from
the installed Python sources, ringtrain.data.code_prompts) make a code specialist; the
general recipe adds user requests that the target writes itself from its chat template
(``ringtrain-data synthesize``, the Magpie method) so the drafter also follows the target
on chat, writing and math. ``synth_fraction`` of the training prompts are synthesized,
steered by ``synth_topics`` where given, ``synth_two_turn`` of those with a follow-up user
turn written after the target's own answer; the rest are code prompts. All are mixed by
ringtrain.data.mixture (exact counts per source, a seeded shuffle, so the first N rows of
the mixture keep the proportion), and the counts per source are written beside the
prompts file (``<prompts>.sources.json``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ringtrain.data.code_prompts import build_prompts, write_jsonl
from ringtrain.data.mixture import Mixture, Source, write_mixture
from tools.recipes.children import run_all, start_all, stop, wait_all
from tools.recipes.real_base import ROOT, RealRecipeSettings, log

# Synthesized user turns: sampled at the temperature the method uses; short requests.
SYNTH_TEMPERATURE = 1.0
SYNTH_MAX_TOKENS = 128


@dataclass(frozen=True)
class Synthesis:
    """What share of the prompts the target writes, and how."""

    fraction: float
    topics: Path | None = None
    two_turn: float = 0.0
    answer_tokens: int = 256

    @classmethod
    def of(cls, settings: RealRecipeSettings, root: Path) -> Synthesis:
        """The synthesis a recipe section asks for (topic file relative to ``root``)."""
        topics = root / settings.synth_topics if settings.synth_topics else None
        return cls(
            settings.synth_fraction, topics, settings.synth_two_turn, settings.max_new_tokens
        )


def synthesize_command(
    target: Path, output: Path, count: int, seed: int, device: str, synthesis: Synthesis, turns: int
) -> list[str]:
    """``ringtrain-data synthesize`` for ``count`` conversations of ``turns`` user turns."""
    steering = ["--topics", str(synthesis.topics)] if synthesis.topics else []
    follow_up = ["--answer-tokens", str(synthesis.answer_tokens)] if turns > 1 else []
    return [
        sys.executable, "-m", "ringtrain.cli.data", "synthesize",
        "--target", str(target), "--output", str(output), "--num", str(count),
        "--seed", str(seed), "--temperature", str(SYNTH_TEMPERATURE),
        "--max-tokens", str(SYNTH_MAX_TOKENS), "--device", device,
        "--turns", str(turns), *follow_up, *steering,
    ]  # fmt: skip


def code_prompts(count: int, seed: int, output: Path) -> int:
    """Write ``count`` code prompts (all there are, if fewer) to ``output``; returns how many."""
    return write_jsonl(build_prompts(count, seed=seed), output)


def synthesis_commands(
    target: Path,
    parts: dict[str, tuple[int, int]],
    synthesis: Synthesis,
    seed: int,
    device: str,
    output: Path,
) -> dict[str, list[str]]:
    """``ringtrain-data synthesize`` for every part (name -> (conversations, user turns)),
    each into ``<output stem>.<name>.jsonl``."""
    return {
        # Each part its own seed: the two files' first samples differ.
        name: synthesize_command(
            target, part_file(output, name), count, seed + turns - 1, device, synthesis, turns
        )
        for name, (count, turns) in parts.items()
    }


def part_file(output: Path, name: str) -> Path:
    """Where one source of the mixture goes, beside the mixture's file."""
    return output.with_name(f"{output.stem}.{name}.jsonl")


def general_prompts(
    target: Path, total: int, synthesis: Synthesis, seed: int, device: str, output: Path
) -> dict[str, int]:
    """Write ``total`` training prompts to ``output``: ``synthesis.fraction`` of them written
    by the target, the rest code prompts, mixed; returns the count per source.

    On a GPU the synthesis parts run at once (each process leaves the device idle while it
    samples, filters and removes near-duplicates on the CPU; on CUDA the recipe runs its
    data steps under the MPS daemon) and the code prompts are built meanwhile. On a CPU
    they would only take cores from each other (their threads stall where another
    process holds a core), so there everything runs one after another."""
    synthesized = round(total * synthesis.fraction)
    two_turn = round(synthesized * synthesis.two_turn)
    parts = {
        name: (count, turns)
        for name, count, turns in (
            ("synthesized", synthesized - two_turn, 1),
            ("synthesized_two_turn", two_turn, 2),
        )
        if count
    }
    commands = synthesis_commands(target, parts, synthesis, seed, device, output)
    at_once = device != "cpu"
    started = time.perf_counter()
    running = start_all(commands, ROOT) if at_once else {}
    sources = []
    try:
        if synthesized < total:
            code_file = part_file(output, "code")
            made = code_prompts(total - synthesized, seed, code_file)
            log(f"prompts: {made} code prompts in {time.perf_counter() - started:.1f} s")
            sources.append(Source("code", code_file, rows=made))
    except BaseException:
        stop(running.values())
        raise
    done = (
        wait_all(running)
        if at_once
        else {name: run_all({name: command}, ROOT)[name] for name, command in commands.items()}
    )
    for name, proc in done.items():
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout)
        log(f"prompts: {name}: {proc.stdout.strip()}")
        sources.append(Source(name, part_file(output, name), rows=parts[name][0]))
    if parts:
        log(f"prompts: {', '.join(parts)} in {time.perf_counter() - started:.1f} s with start-up")
    drawn = write_mixture(Mixture(sources, seed=seed), output)
    counts = {mixed.source.name: mixed.drawn for mixed in drawn}
    output.with_suffix(".sources.json").write_text(json.dumps(counts) + "\n")
    return counts
