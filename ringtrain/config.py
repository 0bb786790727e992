"""Typed run configuration, loaded from TOML.

Every section is a msgspec Struct that forbids unknown fields, so a misspelt key or a
value of the wrong type fails at load time with an error naming the key and the file.
Every number declares its bounds beside it (`Annotated[int, msgspec.Meta(ge=1)]`), checked
at the same time, no float may be infinite or NaN (TOML allows both), and the schedule's
warm-up and decay fractions must leave room for the decay (drafter/schedules.py). Values
whose bounds follow from the target and the device are checked once both are known
(trainer/plan.py, drafter/limits.py).
Sections live beside the code they configure; this module assembles them.
"""

from __future__ import annotations

import math
import re
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from ringtrain.data.config import DataConfig
from ringtrain.drafter.config import DrafterConfig, OptimConfig
from ringtrain.drafter.schedules import schedule_problem
from ringtrain.ring.config import RingConfig
from ringtrain.target.config import TargetConfig


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file and key."""


class LayoutConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which local ranks are targets and which are drafters, and which GPU each uses."""

    # Target ranks on every node: local ranks 0..targets_per_node-1.
    targets_per_node: Annotated[int, msgspec.Meta(ge=1)] = 2
    # Drafter ranks on every node: the local ranks after the targets.
    drafters_per_node: Annotated[int, msgspec.Meta(ge=1)] = 1
    # Target ranks per tensor-parallel target group: consecutive target ranks of a node
    # run one target together and feed the ring as one producer. Must divide
    # targets_per_node (a group never spans nodes). 1: every target rank is its own.
    target_tp: Annotated[int, msgspec.Meta(ge=1)] = 1
    # Local rank -> CUDA device index. Empty: local rank r uses GPU r % device_count.
    gpu_map: list[Annotated[int, msgspec.Meta(ge=0)]] = msgspec.field(default_factory=list)


class RunConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Where the run writes, how long it trains, and how often it reports."""

    # The run's name: names its ring (ringtrain-stat RUN) and its W&B run.
    name: str = "run"
    # Directory of the run's checkpoints, logs and metrics.jsonl.
    run_dir: str = "runs/run"
    # Seeds a fresh drafter's initialisation (every drafter rank builds the same initial
    # weights from it, and a run with the same seed on the same kind of device starts
    # from the same weights) and the anchors of each training batch (drawn from this
    # seed and the batch's place in its target's stream, whichever drafter takes it).
    # The batch order has its own seed, data.seed.
    seed: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Optimiser steps to train; the learning-rate schedule spans them.
    max_steps: Annotated[int, msgspec.Meta(ge=1)] = 100
    # Steps between two progress lines of the lead drafter (the last step always prints).
    log_every: Annotated[int, msgspec.Meta(ge=1)] = 10
    eval_every: Annotated[int, msgspec.Meta(ge=0)] = 0  # 0: no evaluation
    checkpoint_every: Annotated[int, msgspec.Meta(ge=0)] = 0  # 0: only at the end
    # After each checkpoint write, delete all but the newest N complete checkpoints (the
    # one just written always kept). 0: keep every checkpoint.
    keep_checkpoints: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Persistent Triton / Inductor caches (compiled kernels, graphs, autotune results:
    # a warm start skips FLA's Gated DeltaNet autotune) live below this directory
    # (triton/, inductor/), one set shared by every rank and run of the user: each entry
    # is written to a temporary file and renamed into place, so concurrent ranks can
    # share it, and what one rank or run compiled the others reuse. TRITON_CACHE_DIR,
    # TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_AUTOTUNING set in the environment win.
    cache_dir: str = "~/.cache/ringtrain"
    # "auto": CUDA when present, else CPU.
    device: Literal["auto", "cuda", "cpu"] = "auto"
    # Also log every step and evaluation as scalars to these (each an optional extra).
    report_to: list[Literal["tensorboard", "wandb"]] = msgspec.field(default_factory=list)


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The whole configuration of one training run."""

    run: RunConfig = msgspec.field(default_factory=RunConfig)
    layout: LayoutConfig = msgspec.field(default_factory=LayoutConfig)
    ring: RingConfig = msgspec.field(default_factory=RingConfig)
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    target: TargetConfig = msgspec.field(default_factory=TargetConfig)
    drafter: DrafterConfig = msgspec.field(default_factory=DrafterConfig)
    optim: OptimConfig = msgspec.field(default_factory=OptimConfig)


def _toml_loads(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None


def apply_override(tree: dict[str, Any], assignment: str) -> None:
    """Apply one `section.key=value` override (value in TOML syntax; bare words are strings)."""
    key, sep, raw = assignment.partition("=")
    if not sep or "." not in key:
        raise ConfigError(f"override {assignment!r}: write it as section.key=value")
    section, name = key.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    tree.setdefault(section, {})[name] = value


def parse_config(text: str, source: str = "<string>", overrides: Sequence[str] = ()) -> Config:
    """Decode TOML text (plus `section.key=value` overrides) into a validated Config.

    Errors name `source` and the offending key."""
    tree = _toml_loads(text, source)
    for assignment in overrides:
        apply_override(tree, assignment)
    try:
        config = msgspec.convert(tree, type=Config)
    except msgspec.ValidationError as exc:
        where = re.search(r"at `(\$[^`]*)`", str(exc))
        allowed = _choices(where.group(1)) if where else ()
        fix = f"use one of {', '.join(map(repr, allowed))}" if allowed else "fix or remove that key"
        if not allowed and re.search(r"Expected `\w+` [<>]", str(exc)):
            fix = "fix that value, or remove the key for the default"
        raise ConfigError(f"{source}: {exc} ({fix})") from None
    _check_finite(config, source)
    if problem := schedule_problem(config.optim):
        raise ConfigError(f"{source}: {problem}")
    return config


def _check_finite(section: msgspec.Struct, source: str, path: str = "") -> None:
    """Every float setting must be finite (bounds let +-inf through, and TOML allows it)."""
    for name in section.__struct_fields__:
        value, key = getattr(section, name), f"{path}{name}"
        if isinstance(value, msgspec.Struct):
            _check_finite(value, source, f"{key}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{source}: {key} = {value} must be a finite number")


def _choices(path: str) -> tuple[Any, ...]:
    """The values a choice (Literal) field at a validation error's `$.section.key` path
    allows; empty when the field is no choice."""
    kind: Any = Config
    for name in re.sub(r"\[\d+\]", "", path).split(".")[1:]:
        kind = typing.get_type_hints(kind).get(name) if isinstance(kind, type) else None
        while typing.get_origin(kind) is list:
            kind = typing.get_args(kind)[0]
    return typing.get_args(kind) if typing.get_origin(kind) is Literal else ()


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Read and validate a TOML config file, then apply overrides."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    return parse_config(text, str(path), overrides)


def dump_config(config: Config) -> bytes:
    """Serialise a Config as JSON (saved in the run directory and beside checkpoints)."""
    return msgspec.json.format(msgspec.json.encode(config))
