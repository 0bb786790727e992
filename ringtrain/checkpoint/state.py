"""training_state.pt: the optimiser's and scheduler's state, the step and every RNG state.

It is read with `weights_only=True`, allowing exactly the NumPy types of the RNG state it
holds, so a run directory from elsewhere cannot run code on resume.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy._core.multiarray import _reconstruct

from ringtrain.checkpoint.layout import CheckpointError

# What training_state.pt holds besides tensors and builtins: NumPy's RNG state array.
STATE_GLOBALS = [np.ndarray, np.dtype, _reconstruct, type(np.dtype(np.uint32))]


def rng_states() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU and CUDA generator states."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    """Undo rng_states(): put every global generator back where it was."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _reason(exc: Exception) -> str:
    """The line of a loading error that says what is wrong (torch's are long)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    unpickler = [line for line in lines if line.startswith("WeightsUnpickler error")]
    return (unpickler or lines or [type(exc).__name__])[0]


def load_state(file: Path, mmap: bool = False) -> dict[str, Any]:
    """training_state.pt, loaded without running code; raises CheckpointError naming it."""
    try:
        with torch.serialization.safe_globals(STATE_GLOBALS):
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except (RuntimeError, OSError, EOFError, ValueError, KeyError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{file} cannot be read ({_reason(exc)})") from None
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{file} is not a training state (no step)")
    return state
