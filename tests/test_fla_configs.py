"""FLA's tuned kernel configurations: which folder a GPU gets, and when none is set."""

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
    FLA_CACHE_MODE,
    gpu_folder,
    shipped_fla_configs,
    use_shipped_fla_configs,
)

CUDA = torch.device("cuda")


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A shipped folder for an "NVIDIA H200" tuned with FLA 0.6.0, which is installed;
    an environment of this test's own without FLA's variables."""
    folder = tmp_path / "NVIDIA_H200"
    folder.mkdir()
    (folder / "versions.json").write_text(json.dumps({"fla-core": "0.6.0", "triton": "3.6.0"}))
    (folder / "chunk_fwd_kernel_o.json").write_text("{}")
    monkeypatch.setattr(fla_configs, "SHIPPED_FLA_CONFIGS", tmp_path)
    monkeypatch.setattr(fla_configs, "installed_fla_version", lambda: "0.6.0")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLA_")}
    monkeypatch.setattr(os, "environ", environment)  # what the code sets stays here
    monkeypatch.delitem(sys.modules, "fla", raising=False)
    monkeypatch.setattr(fla_configs, "_CHOSEN", {})  # no answer of an earlier test kept
    return folder


def test_gpu_folder_spells_names_as_fla_does() -> None:
    assert gpu_folder("NVIDIA H200") == "NVIDIA_H200"
    assert gpu_folder("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert gpu_folder(" (?) ") == "unknown_gpu"


def test_a_folder_applies_only_to_its_gpu_and_fla_release(shipped: Path) -> None:
    assert shipped_fla_configs("NVIDIA H200", "0.6.0") == shipped
    assert shipped_fla_configs("NVIDIA H200", "0.7.0") is None
    assert shipped_fla_configs("NVIDIA H200", None) is None
    assert shipped_fla_configs("NVIDIA H100 80GB HBM3", "0.6.0") is None
    (shipped / "versions.json").unlink()
    assert shipped_fla_configs("NVIDIA H200", "0.6.0") is None


def test_fla_is_pointed_at_the_shipped_folder_before_it_is_imported(shipped: Path) -> None:
    assert use_shipped_fla_configs(CUDA) == shipped
    assert os.environ["FLA_CONFIG_DIR"] == str(shipped)
    assert os.environ["FLA_CACHE_MODE"] == FLA_CACHE_MODE == "fuzzy"


def test_a_later_call_repeats_the_first_answer_unannounced(
    shipped: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A target rank's pre-flight chooses, then its loader asks again: the same folder
    (FLA, imported in between, keeps what it read), one log line."""
    with caplog.at_level(logging.INFO, logger=fla_configs.__name__):
        assert use_shipped_fla_configs(CUDA) == shipped
        monkeypatch.setitem(sys.modules, "fla", object())
        assert use_shipped_fla_configs(CUDA) == shipped
    (line,) = caplog.messages
    assert "take the configurations tuned for this GPU (NVIDIA_H200)" in line


@pytest.mark.parametrize("user_variable", ["FLA_CONFIG_DIR", "FLA_CACHE_MODE"])
def test_the_users_own_fla_settings_win(
    shipped: Path, monkeypatch: pytest.MonkeyPatch, user_variable: str
) -> None:
    monkeypatch.setenv(user_variable, "mine")
    assert use_shipped_fla_configs(CUDA) is None
    assert os.environ[user_variable] == "mine"
    other = {"FLA_CONFIG_DIR", "FLA_CACHE_MODE"} - {user_variable}
    assert not any(name in os.environ for name in other)


def test_nothing_is_set_on_cpu_or_once_fla_is_imported(
    shipped: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert use_shipped_fla_configs(torch.device("cpu")) is None
    monkeypatch.setitem(sys.modules, "fla", object())
    assert use_shipped_fla_configs(CUDA) is None
    assert "FLA_CONFIG_DIR" not in os.environ and "FLA_CACHE_MODE" not in os.environ


def test_a_gpu_without_shipped_configurations_is_told_the_autotune_wait(
    shipped: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA B200")
    with caplog.at_level(logging.INFO, logger=fla_configs.__name__):
        assert use_shipped_fla_configs(CUDA) is None
    assert "FLA_CONFIG_DIR" not in os.environ
    (line,) = caplog.messages
    assert "autotune at the target's first forward" in line and "about 40 s" in line
    assert "NVIDIA B200" in line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=fla_configs.__name__):
        monkeypatch.setattr(fla_configs, "installed_fla_version", lambda: "0.7.0")
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
        assert use_shipped_fla_configs(CUDA) is None
    (line,) = caplog.messages
    assert "about 40 s" in line and "0.6.0" in line and "0.7.0" in line
