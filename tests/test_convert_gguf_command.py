"""ringtrain-convert-gguf's command line, in-process: a GGUF file or --smollm2 (exactly one),
float32 weights unless --dtype says otherwise, and the report of the directory written
(each file by name, in order, and their count); the conversion itself is tested in
test_gguf_convert."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from ringtrain.cli import convert_gguf as command

pytest.importorskip("gguf")

from tests.helpers.tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.mark.parametrize("given", ["neither", "both"])
def test_exactly_one_of_a_file_and_smollm2(
    given: str, source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(tmp_path / "hf")] if given == "neither" else [str(source), str(tmp_path / "hf")]
    with pytest.raises(SystemExit) as refusal:
        command.main(argv if given == "neither" else [*argv, "--smollm2"])
    assert refusal.value.code == 2
    assert "give either a GGUF file or --smollm2" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_float32_by_default_and_every_file_reported(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "hf"
    assert command.main([str(source), str(output)]) == 0
    assert AutoConfig.from_pretrained(output).dtype == torch.float32
    written = sorted(path for path in output.iterdir())
    first, *listed = capsys.readouterr().out.splitlines()
    assert first.startswith(f"{source} -> {output}: {len(written)} files, ")
    assert ", float32, " in first
    assert listed == [f"  {path.name}  {path.stat().st_size / 1e6:.2f} MB" for path in written]


def test_smollm2_converts_the_file_its_package_installed(
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(command, "find_smollm2_gguf", lambda: source)
    output = tmp_path / "hf"
    assert command.main(["--smollm2", str(output), "--dtype", "bfloat16"]) == 0
    assert AutoConfig.from_pretrained(output).dtype == torch.bfloat16
    assert capsys.readouterr().out.startswith(f"{source} -> {output}: ")
