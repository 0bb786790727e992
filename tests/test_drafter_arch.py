"""Drafter architectures as bundles: each one's sums follow from its own folder, and a new
one is one folder plus its name in the table and among the config's choices."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import ringtrain
from ringtrain.drafter import build_drafter, drafter_spec_from_target
from ringtrain.drafter.arch import ARCHITECTURES
from tests.helpers.launcher import RUN_TIMEOUT_S, run_env, step_records, torchrun_command
from tests.helpers.tiny_drafter import TAPS, TARGET, make_setup, objective

DUMMY = Path(__file__).parent / "helpers" / "dummy_arch"
SMALL = {"selector_rank": 8, "selector_top_k": 4}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_each_architecture_yields_its_own_sums_and_reports_its_loss_parts(name: str) -> None:
    cfg, _, head, batch = make_setup(0, architecture=name, **SMALL)
    torch.manual_seed(0)
    model = build_drafter(drafter_spec_from_target(TARGET, cfg, TAPS)).double()
    sums = objective(model, head, batch, cfg, seed=1)
    architecture = ARCHITECTURES[name]
    assert type(sums) is architecture.sums_type
    assert isinstance(model, architecture.model)
    summary = type(sums).summarise(sums.as_vector(), cfg.block_size)
    parts = type(sums).step_metrics(summary)["loss_parts"]
    assert set(parts) == set(architecture.sums_type.loss_parts().values())
    assert sum(parts.values()) < summary["loss"]


def _add_to_table(package: Path) -> list[Path]:
    """Register the dummy architecture in a copy of the package the way the recipe says
    (docs/architectures.md): its table line, its name among the config's choices. Returns
    the files edited."""
    table = package / "drafter" / "arch" / "__init__.py"
    text = table.read_text()
    anchor = "from ringtrain.drafter.arch.dflash2 import ARCHITECTURE as DFLASH2\n"
    text = text.replace(
        anchor, anchor + "from ringtrain.drafter.arch.dummy import ARCHITECTURE as DUMMY\n"
    )
    table.write_text(text.replace('"dflash2": DFLASH2}', '"dflash2": DFLASH2, "dummy": DUMMY}'))
    config = package / "drafter" / "config.py"
    choices = 'architecture: Literal["dflash", "dflash2"]'
    config.write_text(config.read_text().replace(choices, choices[:-1] + ', "dummy"]'))
    return [table, config]


def _changed_files(original: Path, copy: Path) -> list[str]:
    """Paths (relative to the package) that differ between two package trees, or exist in
    one only."""
    compare = filecmp.dircmp(original, copy, ignore=["__pycache__"])
    changed: list[str] = []

    def walk(node: filecmp.dircmp, prefix: str) -> None:
        changed.extend(prefix + name for name in node.left_only + node.right_only)
        changed.extend(prefix + name for name in node.diff_files)
        for name, sub in node.subdirs.items():
            walk(sub, f"{prefix}{name}/")

    walk(compare, "")
    return sorted(changed)


@pytest.mark.slow
def test_a_new_architecture_is_one_folder_and_trains_on_the_embedded_default(
    tmp_path: Path,
) -> None:
    original = Path(ringtrain.__file__).parent
    package = tmp_path / "source" / "ringtrain"
    shutil.copytree(original, package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(DUMMY, package / "drafter" / "arch" / "dummy")
    edited = _add_to_table(package)
    assert all(
        path.read_text() != (original / path.relative_to(package)).read_text() for path in edited
    )
    assert _changed_files(original, package) == [
        "drafter/arch/__init__.py",
        "drafter/arch/dummy",
        "drafter/config.py",
    ]

    run_dir = tmp_path / "run"
    overrides = ['drafter.architecture="dummy"', "run.max_steps=6", "run.eval_every=3",
                 "run.checkpoint_every=6", "run.name=dummy"]  # fmt: skip
    env = {
        **run_env(),
        "PYTHONPATH": os.pathsep.join([str(package.parent), os.environ.get("PYTHONPATH", "")]),
    }
    # Run from elsewhere: python -m puts the working directory (this checkout) first.
    proc = subprocess.run(
        torchrun_command(run_dir, 1, 1, overrides),
        cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    records = step_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, 7))
    assert all(0.0 < r["spread_loss"] < r["loss"] for r in records)
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [e["spread_loss"] > 0.0 for e in evals if e.get("event") == "eval"] == [True, True]
    checkpoint = run_dir / "checkpoints" / "step_00000006"
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["DummyDraftModel"]
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as weights:
        gate = weights.get_tensor("output_gate")
    assert not torch.equal(gate, torch.ones_like(gate)), "the dummy's own parameter trained"
