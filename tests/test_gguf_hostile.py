"""ringtrain-convert-gguf on damaged GGUF files: refused with exit status 2 and one line.

A file that lacks some of the model's weights, or holds one in the wrong shape, would
convert into a model with randomly initialized weights; a file whose header is cut short
or claims absurd counts cannot be read. Either way nothing is written.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ringtrain.cli.convert_gguf import main as convert_main

pytest.importorskip("gguf")
from tests.helpers.tiny_gguf import tiny_tensors, write_tiny_gguf

HUGE = 2**62
UNREADABLE = "unreadable GGUF file"


def _console_run(source: Path, output: Path) -> subprocess.CompletedProcess[str]:
    """ringtrain-convert-gguf as a real console process."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    command = [sys.executable, "-m", "ringtrain.cli.convert_gguf", str(source), str(output)]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def _message(stderr: str) -> str:
    """The refusal: the last line of stderr, the only one of the command's own lines
    (transformers' progress bars may come before it), and no traceback."""
    assert "Traceback" not in stderr and "MISSING" not in stderr
    own = [line for line in stderr.splitlines() if "ringtrain-convert-gguf:" in line]
    assert len(own) == 1 and stderr.splitlines()[-1] == own[0]
    return own[0]


def test_a_file_without_a_block_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    tensors = {name: array for name, array in tiny_tensors(tied=True).items() if ".1." not in name}
    source = write_tiny_gguf(tmp_path / "drop.gguf", tensors=tensors)
    done = _console_run(source, tmp_path / "new" / "hf")

    assert done.returncode == 2 and done.stdout == ""
    message = _message(done.stderr)
    assert str(source) in message and "lacks 9 weights" in message
    assert "model.layers.1.input_layernorm.weight" in message and "and 3 more" in message
    assert "model.layers.0." not in message
    assert sorted(path.name for path in tmp_path.iterdir()) == ["drop.gguf"]


def test_a_weight_of_the_wrong_shape_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tensors = tiny_tensors(tied=False)
    tensors["blk.0.ffn_up.weight"] = tensors["blk.0.ffn_up.weight"][:32]
    source = write_tiny_gguf(tmp_path / "shape.gguf", tied=False, tensors=tensors)

    assert convert_main([str(source), str(tmp_path / "hf")]) == 2
    message = _message(capsys.readouterr().err)
    assert "has 1 weight (model.layers.0.mlp.up_proj.weight) of the wrong shape" in message
    assert sorted(path.name for path in tmp_path.iterdir()) == ["shape.gguf"]


def _header(tensors: int, kv_pairs: int) -> bytes:
    """GGUF's magic, version 3 and the two counts, as a file's first 24 bytes."""
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, kv_pairs)


@pytest.mark.parametrize(
    "damage",
    [
        "magic only",
        "magic and version",
        "huge counts, nothing after",
        "huge tensor count",
        "huge key-value count",
        "cut inside the metadata",
    ],
)
def test_a_damaged_header_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    tensors, kv_pairs = np.frombuffer(whole[8:24], dtype="<u8")
    blob = {
        "magic only": b"GGUF",
        "magic and version": whole[:8],
        "huge counts, nothing after": _header(HUGE, HUGE),
        "huge tensor count": _header(HUGE, int(kv_pairs)) + whole[24:],
        "huge key-value count": _header(int(tensors), HUGE) + whole[24:],
        "cut inside the metadata": whole[:200],
    }[damage]
    source = tmp_path / "damaged.gguf"
    source.write_bytes(blob)

    assert convert_main([str(source), str(tmp_path / "hf")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    message = _message(captured.err)
    assert str(source) in message and UNREADABLE in message and "may be truncated" in message
    assert not (tmp_path / "hf").exists()
