"""Every example config in configs/ parses: no unknown key, no wrong type."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtrain.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.toml"))


def test_there_are_example_configs() -> None:
    assert len(CONFIGS) >= 5


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_parses(path: Path) -> None:
    config = load_config(path)
    assert config.run.name
