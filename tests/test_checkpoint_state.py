"""training_state.pt (ringtrain/checkpoint/state.py): what a checkpoint's training state holds
and how it is read back.

Every RNG a step draws from (Python's, NumPy's, torch's) comes back exactly from a state
written with torch.save and read with weights only; a file that cannot be read, or is no
training state, is refused naming it and why (torch's long errors cut to the line that
says it); nothing in it runs code; and a read with mmap maps the file instead of copying
a large optimizer state into memory.
"""

from __future__ import annotations

import pathlib
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ringtrain.checkpoint.layout import STATE_FILE, CheckpointError
from ringtrain.checkpoint.state import load_state, restore_rng_states, rng_states


def draws() -> tuple[float, float, torch.Tensor]:
    """One draw of each generator a training step uses."""
    return random.random(), float(np.random.rand()), torch.rand(3)


def write_state(path: Path, **extra: object) -> Path:
    """A training state as a save writes one: step, optimizer state, RNG states."""
    state = {"step": 7, "optimizer": {"state": {0: {"exp_avg": torch.ones(4)}}}}
    torch.save({**state, "rng": rng_states(), **extra}, path)
    return path


def test_every_generator_resumes_where_it_was(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    file = write_state(tmp_path / STATE_FILE)
    expected = draws()
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    state = load_state(file)
    assert state["step"] == 7
    restore_rng_states(state["rng"])
    python, numpy, torch_draw = draws()
    assert (python, numpy) == expected[:2]
    assert torch.equal(torch_draw, expected[2])


class Planted:
    """A pickled object that would create `marker` when loaded by a full unpickler."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (pathlib.Path.touch, (self.marker,))


def test_a_state_that_would_run_code_is_refused_saying_why(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    file = write_state(tmp_path / STATE_FILE, planted=Planted(marker))
    with pytest.raises(CheckpointError) as refused:
        load_state(file)
    assert not marker.exists()
    message = str(refused.value)
    assert message.startswith(f"{file} cannot be read (WeightsUnpickler error: Unsupported")
    assert "\n" not in message


def corrupt(kind: str, file: Path) -> None:
    """Make `file` a training state spoiled in the way `kind` names."""
    if kind == "missing":
        return
    if kind == "empty":
        file.write_bytes(b"")
    elif kind == "truncated":
        data = write_state(file).read_bytes()
        file.write_bytes(data[:100])
    elif kind == "text":
        file.write_bytes(b"hello world, not a checkpoint")


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("missing", "No such file or directory"),
        ("empty", "EOFError"),  # torch's error says nothing: its type is the reason
        ("truncated", "PytorchStreamReader failed reading zip archive"),
        ("text", "(101)"),  # torch's KeyError, whose message is a bare byte value
    ],
)
def test_a_file_that_cannot_be_read_is_named_with_the_reason(
    tmp_path: Path, kind: str, reason: str
) -> None:
    file = tmp_path / STATE_FILE
    corrupt(kind, file)
    with pytest.raises(CheckpointError) as refused:
        load_state(file)
    assert str(refused.value).startswith(f"{file} cannot be read (")
    assert reason in str(refused.value)


@pytest.mark.parametrize("content", [{"optimizer": {}}, torch.zeros(3), [1, 2]])
def test_a_file_without_a_step_is_no_training_state(tmp_path: Path, content: object) -> None:
    file = tmp_path / STATE_FILE
    torch.save(content, file)
    with pytest.raises(CheckpointError, match=r"is not a training state \(no step\)"):
        load_state(file)


def mapped(file: Path) -> bool:
    """Whether this process maps `file` into its memory."""
    return str(file) in Path("/proc/self/maps").read_text()


def test_a_read_with_mmap_maps_the_file_instead_of_copying_it(tmp_path: Path) -> None:
    copied, shared = write_state(tmp_path / "copied.pt"), write_state(tmp_path / "mapped.pt")
    kept = [load_state(copied), load_state(shared, mmap=True)]
    assert mapped(shared) and not mapped(copied)
    assert torch.equal(kept[1]["optimizer"]["state"][0]["exp_avg"], torch.ones(4))
