"""The FLA kernel configurations ringtrain ships: the folders found for the GPUs they were
tuned on, GPU names spelled as folders, the installed FLA release read from its
distribution, and nothing announced where FLA is not installed."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest
import torch

from ringtrain.target import fla_configs
from ringtrain.target.fla_configs import (
    SHIPPED_FLA_CONFIGS,
    gpu_folder,
    installed_fla_version,
    shipped_fla_configs,
    use_shipped_fla_configs,
)

# The GPUs ringtrain has tuned on, as torch.cuda.get_device_name names them.
TUNED_GPUS = {"NVIDIA H200": "NVIDIA_H200", "NVIDIA H100 80GB HBM3": "NVIDIA_H100_80GB_HBM3"}


@pytest.mark.parametrize(("gpu", "folder"), sorted(TUNED_GPUS.items()))
def test_the_package_ships_kernel_configurations_for_each_tuned_gpu(gpu: str, folder: str) -> None:
    shipped = SHIPPED_FLA_CONFIGS / folder
    tuned_with = json.loads((shipped / "versions.json").read_text())["fla-core"]
    assert shipped_fla_configs(gpu, tuned_with) == shipped
    kernels = [path.name for path in shipped.glob("*.json") if path.name != "versions.json"]
    assert "chunk_fwd_kernel_o.json" in kernels


def test_a_run_of_other_characters_is_one_underscore_and_none_at_the_ends() -> None:
    assert gpu_folder("NVIDIA A100-SXM4-80GB") == "NVIDIA_A100_SXM4_80GB"
    assert gpu_folder("AMD Instinct MI300X (gfx942)") == "AMD_Instinct_MI300X_gfx942"
    assert gpu_folder("  NVIDIA H200 ") == "NVIDIA_H200"
    assert gpu_folder("") == "unknown_gpu"


def test_the_installed_release_is_read_from_the_fla_core_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed distribution as pip leaves it: a dist-info folder on the path."""
    info = tmp_path / "fla_core-0.6.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fla-core\nVersion: 0.6.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert installed_fla_version() == "0.6.1"


def test_no_release_where_the_distribution_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fla_configs, "FLA_DISTRIBUTION", "ringtrain-never-installed")
    assert installed_fla_version() is None


def test_without_fla_nothing_is_set_or_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A hybrid target without FLA runs transformers' torch path: no kernels to autotune."""
    folder = tmp_path / "NVIDIA_H200"
    folder.mkdir()
    (folder / "versions.json").write_text(json.dumps({"fla-core": "0.6.0"}))
    monkeypatch.setattr(fla_configs, "SHIPPED_FLA_CONFIGS", tmp_path)
    monkeypatch.setattr(fla_configs, "installed_fla_version", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLA_")}
    monkeypatch.setattr(os, "environ", environment)
    monkeypatch.delitem(sys.modules, "fla", raising=False)
    monkeypatch.setattr(fla_configs, "_CHOSEN", {})
    with caplog.at_level(logging.INFO, logger=fla_configs.__name__):
        assert shipped_fla_configs("NVIDIA H200", None) is None
        assert use_shipped_fla_configs(torch.device("cuda")) is None
    assert caplog.messages == []
    assert not any(name.startswith("FLA_") for name in os.environ)
