"""Typed run configuration, loaded from TOML.

Every section is a msgspec Struct that forbids unknown fields, so a misspelt key or a
value of the wrong type fails at load time with an error naming the key and the file.
Sections live beside the code they configure; this module assembles them.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from ringtrain.data.config import DataConfig
from ringtrain.drafter.config import DrafterConfig, OptimConfig
from ringtrain.ring.config import RingConfig
from ringtrain.target.config import TargetConfig


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file and key."""


class LayoutConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which local ranks are targets and which are drafters, and which GPU each uses."""

    targets_per_node: int = 2
    drafters_per_node: int = 1
    # Local rank -> CUDA device index. Empty: local rank r uses GPU r % device_count.
    gpu_map: list[int] = msgspec.field(default_factory=list)


class RunConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Where the run writes, how long it trains, and how often it reports."""

    name: str = "run"
    run_dir: str = "runs/run"
    seed: int = 0
    max_steps: int = 100
    log_every: int = 10
    eval_every: int = 0
    checkpoint_every: int = 0
    # Persistent per-process Triton / Inductor caches live below this directory.
    cache_dir: str = "~/.cache/ringtrain"
    device: str = "auto"  # "auto" | "cuda" | "cpu"


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The whole configuration of one training run."""

    run: RunConfig = msgspec.field(default_factory=RunConfig)
    layout: LayoutConfig = msgspec.field(default_factory=LayoutConfig)
    ring: RingConfig = msgspec.field(default_factory=RingConfig)
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    target: TargetConfig = msgspec.field(default_factory=TargetConfig)
    drafter: DrafterConfig = msgspec.field(default_factory=DrafterConfig)
    optim: OptimConfig = msgspec.field(default_factory=OptimConfig)


def parse_config(text: str | bytes, source: str = "<string>") -> Config:
    """Decode TOML text into a Config; errors name `source` and the offending key."""
    try:
        return msgspec.toml.decode(text, type=Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {exc} (fix or remove that key)") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML config file."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    return parse_config(text, str(path))


def dump_config(config: Config) -> bytes:
    """Serialise a Config as JSON (saved in the run directory and beside checkpoints)."""
    return msgspec.json.format(msgspec.json.encode(config))
