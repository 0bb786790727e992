"""What one run of the real-model recipes is: its settings, its paths, its timed steps.

Shared by tools/recipes/real_recipe.py (the recipe), real_eval.py (its evaluation) and
real_variants.py (the training variants side by side).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import msgspec

from ringtrain.config import Config

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "configs" / "recipes" / "smollm2.toml"
SECONDS_FILE = "real_recipe_seconds.json"


class RealRecipeSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One device's section of configs/recipes/smollm2.toml."""

    config: str
    train_prompts: list[int]
    max_new_tokens: int
    eval_limit: int = 0
    eval_max_new_tokens: int = 256
    # ringtrain-eval --workers: processes sharing the device, each decoding a share.
    eval_workers: int = 1
    # Run them under the CUDA MPS daemon (kernels side by side instead of time-sliced).
    eval_mps: bool = False
    # Train under the CUDA MPS daemon too: the target and drafter ranks share the one GPU.
    train_mps: bool = False
    # Make the prompts and the data under it too: the synthesis processes (at once on a
    # GPU) and the two splits' regenerations run side by side.
    data_mps: bool = False
    # Share of the training prompts written by the target itself (ringtrain-data
    # synthesize); the rest are code prompts (tools/recipes/real_prompts.py).
    synth_fraction: float = 0.0
    # Topics that steer the synthesized requests (a file of one topic per line, relative
    # to the project root; cycled; empty: the model's own unsteered distribution).
    synth_topics: str = ""
    # Share of the synthesized conversations written with two user turns (the second
    # after the target's own greedy answer of max_new_tokens), as MT-Bench asks.
    synth_two_turn: float = 0.0
    # ringtrain-eval --benchmark of every evaluation (built-in names or prompt files).
    benchmarks: list[str] = msgspec.field(default_factory=lambda: ["humaneval"])
    # Temperatures evaluated: 0 greedy (in every dtype), others with the sampling rule.
    temperatures: list[float] = msgspec.field(default_factory=lambda: [0.0])
    regen_dtype: str = "auto"
    # Share of the training conversations whose answers are drawn at sampled_temperature
    # instead of greedy (spread evenly; 0: all greedy): for a target served sampling.
    sampled_fraction: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    sampled_temperature: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # The training split's regeneration: prompts per batch and padded tokens per batch
    # (rows x (longest prompt + new tokens)) at most; 0: regenerate.py's defaults.
    regen_batch_size: int = 0
    regen_batch_tokens: int = 0
    eval_dtypes: list[str] = msgspec.field(default_factory=lambda: ["auto"])
    # Training-config overrides of this device (section.key=value), before --set's.
    sets: list[str] = msgspec.field(default_factory=list)


@dataclass
class RealRecipe:
    """What one recipe run does and where its files go."""

    device: str
    settings: RealRecipeSettings
    config: Config
    overrides: list[str]
    fresh: bool
    gguf: str
    timings: dict[str, float] = field(default_factory=dict)
    # Seconds of the steps this run reused, as the run that made their outputs measured
    # them (a recipe run as several calls reports its whole time).
    earlier: dict[str, float] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return ROOT

    @property
    def seconds_file(self) -> Path:
        """Each step's seconds when it last ran, beside the datasets (run directories are
        remade, the data stays)."""
        return self.dataset("train").parent / SECONDS_FILE

    def step_seconds(self) -> dict[str, float]:
        """What ``seconds_file`` holds (nothing before the first step ran)."""
        if not self.seconds_file.is_file():
            return {}
        return json.loads(self.seconds_file.read_text())

    def reused(self, step: str) -> None:
        """Note that ``step``'s outputs are reused: its seconds are the earlier run's."""
        seconds = self.step_seconds().get(step)
        if seconds is not None:
            self.earlier[step] = seconds

    @property
    def target(self) -> Path:
        return ROOT / self.config.target.path

    @property
    def largest(self) -> int:
        return max(self.settings.train_prompts)

    def dataset(self, split: str) -> Path:
        return ROOT / (self.config.data.path if split == "train" else self.config.data.eval_path)

    def prompts(self, split: str) -> Path:
        return self.dataset(split).with_name(self.dataset(split).name + "-prompts.jsonl")

    def train_set(self, size: int) -> Path:
        full = self.dataset("train")
        return full if size == self.largest else full.with_name(f"{full.name}-{size}")

    def run_dir(self, size: int) -> Path:
        base = ROOT / self.config.run.run_dir
        return base if size == self.largest else base.with_name(f"{base.name}-{size}")


def log(message: str) -> None:
    """Recipe progress on stderr."""
    print(f"[real_recipe] {message}", file=sys.stderr, flush=True)


class Timed:
    """A context that adds its wall time to ``recipe.timings[name]`` and records it in
    ``recipe.seconds_file``: when its block finished, as the step's seconds for the runs
    that reuse it; when it was stopped (a device call's end), as the step's stopped
    seconds, which the run that ``continues`` the step adds to its own (and reports as an
    earlier call's), so a training run as two calls counts both. ``recorded`` False: the
    time goes to ``recipe.timings`` only (steps that are not the recipe's own, such as
    the variants' trainings, which keep their seconds with their outputs)."""

    def __init__(
        self, recipe: RealRecipe, name: str, continues: bool = False, recorded: bool = True
    ) -> None:
        self.recipe, self.name, self.continues = recipe, name, continues
        self.recorded = recorded

    @property
    def stopped_key(self) -> str:
        return f"{self.name} (stopped)"

    def __enter__(self) -> None:
        log(f"{self.name} ...")
        self.started = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        seconds = time.perf_counter() - self.started
        recipe = self.recipe
        recipe.timings[self.name] = recipe.timings.get(self.name, 0.0) + seconds
        if not self.recorded:
            return
        ledger = recipe.step_seconds()
        stopped = ledger.pop(self.stopped_key, 0.0)
        if not self.continues:  # a fresh start does not build on the stopped attempt
            stopped = 0.0
        elif stopped:
            recipe.earlier[self.stopped_key] = stopped
        if kind is None:  # a step that finished: later runs that reuse it report its time
            ledger[self.name] = round(stopped + seconds, 1)
        elif issubclass(kind, (KeyboardInterrupt, SystemExit)):  # stopped, not failed
            ledger[self.stopped_key] = round(stopped + seconds, 1)
        recipe.seconds_file.parent.mkdir(parents=True, exist_ok=True)
        recipe.seconds_file.write_text(json.dumps(ledger) + "\n")


def reusable(stamp_file: Path, stamp: dict, fresh: bool) -> bool:
    """Whether ``stamp_file`` records exactly ``stamp`` (the step's settings)."""
    return not fresh and stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp
