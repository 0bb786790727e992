"""The recipe every published figure was measured with, pinned: the package's defaults, the
paper's recipe, its loss decay per block size and the shipped configs' table, each as the
code has it and as the documentation states it. A change to either side alone fails here.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from ringtrain.config import load_config
from ringtrain.drafter.config import PAPER_DRAFTER, PAPER_OPTIM, DrafterConfig, OptimConfig
from ringtrain.drafter.objectives import loss_gamma, slot_weights

ROOT = Path(__file__).resolve().parents[1]


def prose(name: str) -> str:
    """A documentation file with its line breaks and runs of spaces made single spaces."""
    return " ".join((ROOT / name).read_text().split())


def test_the_package_defaults_are_dflash2_dpace_muon_wsd() -> None:
    drafter, optim = DrafterConfig(), OptimConfig()
    assert (drafter.architecture, drafter.objective) == ("dflash2", "dpace")
    assert (optim.name, optim.schedule) == ("muon", "wsd")
    assert (optim.muon_momentum, optim.decay_fraction, optim.warmup_fraction) == (0.95, 0.2, 0.04)
    assert drafter.gamma == 0.0, "gamma 0 means the paper's value for the block size"


def test_the_documents_state_the_defaults_the_code_has() -> None:
    assert "The package's defaults (DFlash2, D-PACE, Muon, WSD)" in prose("README.md")
    training = prose("docs/training.md")
    for statement in (
        '`[drafter] architecture = "dflash2"`',
        '`objective = "dpace"`',
        '`"muon"` (default',
        "`muon_momentum`, default 0.95",
        '`"wsd"` (default',
        "`decay_fraction` of the steps, default 0.2",
        'The paper\'s recipe is the four set to `"dflash"`, `"decayed_ce"`, `"adamw"`, `"cosine"`',
    ):
        assert statement in training, statement


def test_the_papers_recipe_is_dflash_decayed_ce_adamw_cosine() -> None:
    assert PAPER_DRAFTER == {"architecture": "dflash", "objective": "decayed_ce"}
    assert PAPER_OPTIM == {"name": "adamw", "schedule": "cosine"}


PAPER_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


@pytest.mark.parametrize(("block_size", "gamma"), PAPER_GAMMA.items())
def test_the_papers_loss_decay_per_block_size(block_size: int, gamma: float) -> None:
    cfg = DrafterConfig(block_size=block_size)
    assert loss_gamma(cfg) == gamma
    weights = slot_weights(cfg, torch.device("cpu"), torch.float64)
    expected = [math.exp(-(k - 1) / gamma) for k in range(block_size)]
    assert weights.tolist() == pytest.approx(expected, rel=1e-12)
    assert loss_gamma(DrafterConfig(block_size=block_size, gamma=2.5)) == 2.5


def test_the_documented_loss_decay_is_the_codes() -> None:
    documented = re.search(
        r"block size \(16: (\d+), 10: (\d+), 8: (\d+)\)", prose("docs/configuration.md")
    )
    assert documented, "docs/configuration.md no longer states the paper's gamma per block size"
    assert dict(zip((16, 10, 8), map(float, documented.groups()), strict=True)) == PAPER_GAMMA


def shipped_table() -> list[tuple[str, float, int, int]]:
    """(config file, optim.lr, drafter.num_layers, block_size) of each row of the shipped
    configs' table in docs/training.md (a row may name several configs)."""
    rows = []
    for line in (ROOT / "docs/training.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[1].startswith("`configs/"):
            continue
        for name in re.findall(r"`configs/([^`]+)`", cells[1]):
            rows.append((name, float(cells[2]), int(cells[3]), int(cells[4])))
    return rows


def test_the_shipped_configs_table_has_its_rows() -> None:
    assert {row[0] for row in shipped_table()} == {
        "smollm2-135m.toml", "qwen3-8b.toml", "qwen3-30b-a3b.toml", "qwen3.6-27b.toml",
    }  # fmt: skip


@pytest.mark.parametrize("row", shipped_table(), ids=lambda row: row[0])
def test_each_shipped_config_has_the_tables_values(row: tuple[str, float, int, int]) -> None:
    name, lr, num_layers, block_size = row
    config = load_config(ROOT / "configs" / name)
    assert (config.optim.lr, config.drafter.num_layers, config.drafter.block_size) == (
        lr, num_layers, block_size,
    )  # fmt: skip
    assert config.drafter.architecture == DrafterConfig().architecture
    assert config.drafter.objective == DrafterConfig().objective
    assert (config.optim.name, config.optim.schedule) == (OptimConfig().name, "wsd")
