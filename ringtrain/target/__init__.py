"""Target models: loading, tapped-layer forward passes, the built-in tiny target.

The public names below are imported lazily, so importing the package (as the config
module does for ``ringtrain.target.config``) does not pull in torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringtrain.target.loader import load_target
    from ringtrain.target.model_dir import TargetLoadError, TargetModelDir
    from ringtrain.target.runner import TargetRunner
    from ringtrain.target.structure import read_target_config
    from ringtrain.target.tapped import TappedTarget
    from ringtrain.target.taps import check_tap_layers, default_tap_layers
    from ringtrain.target.tiny import build_tiny_target

_EXPORTS = {
    "TappedTarget": "ringtrain.target.tapped",
    "TargetModelDir": "ringtrain.target.model_dir",
    "TargetLoadError": "ringtrain.target.model_dir",
    "TargetRunner": "ringtrain.target.runner",
    "build_tiny_target": "ringtrain.target.tiny",
    "check_tap_layers": "ringtrain.target.taps",
    "default_tap_layers": "ringtrain.target.taps",
    "load_target": "ringtrain.target.loader",
    "read_target_config": "ringtrain.target.structure",
}
__all__ = [
    "TappedTarget",
    "TargetLoadError",
    "TargetModelDir",
    "TargetRunner",
    "build_tiny_target",
    "check_tap_layers",
    "default_tap_layers",
    "load_target",
    "read_target_config",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ringtrain.target' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
