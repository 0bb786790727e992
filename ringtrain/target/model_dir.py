"""Read a local Hugging Face target directory: its text config and an index of its weights.

Only local files are read (never the hub). Multimodal checkpoints (e.g. Qwen3.5, whose
config nests the language model under ``text_config`` and whose weights live under
``model.language_model.``) are handled by using the text config and detecting the key
prefix of the language model's weights. ``text_weights`` hands out lazy views of a
chosen subset of the language model's tensors (nothing is read until a tensor is
materialised), so a loader reads only what it keeps and never copies the whole target
into host memory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from safetensors import safe_open
from transformers import CONFIG_MAPPING, PretrainedConfig

# Key prefixes of the language model's weights, most specific first.
TEXT_KEY_PREFIXES = (
    "model.language_model.",
    "language_model.model.",
    "language_model.",
    "model.",
    "",
)
LAYER_KEY = re.compile(r"^layers\.(\d+)\.")
# from_pretrained's options for every model ringtrain loads: transformers (5.23 and newer,
# with its `kernels` dependency) otherwise swaps layers' code for kernels fetched from the
# model hub as the model loads. ringtrain loads offline and runs its own kernels (compiled
# layers, FLA's), whose numerics its tests check.
WITHOUT_HUB_KERNELS = {"use_kernels": False}


class TargetLoadError(ValueError):
    """A target directory that cannot be used; the message names the problem and the fix."""


def truncated_config_values(values: dict, num_layers: int) -> dict:
    """Config values cut to the first ``num_layers`` layers.

    Per-layer lists (``layer_types`` and any other list with one entry per layer whose
    name speaks of layers) are cut together with ``num_hidden_layers``, so a model built
    from the result never allocates the dropped layers.
    """
    full = int(values["num_hidden_layers"])
    cut = {**values, "num_hidden_layers": num_layers}
    for key, value in values.items():
        if isinstance(value, list) and len(value) == full and "layer" in key:
            cut[key] = value[:num_layers]
    return cut


def layer_index(relative_key: str) -> int | None:
    """The decoder layer a language-model key belongs to (``layers.7.mlp...`` -> 7)."""
    match = LAYER_KEY.match(relative_key)
    return int(match.group(1)) if match else None


def index_weights(path: Path) -> dict[str, Path]:
    """Map every tensor key of a Hugging Face model directory to the safetensors file
    holding it (from the index file when there is one, else from the files' headers)."""
    index_files = sorted(path.glob("*.safetensors.index.json"))
    if index_files:
        weight_map = json.loads(index_files[0].read_text())["weight_map"]
        key_to_file = {key: path / file for key, file in weight_map.items()}
        missing = sorted({str(f) for f in key_to_file.values() if not f.is_file()})
        if missing:
            raise TargetLoadError(
                f"{index_files[0]}: lists weight files that are missing: {missing[:3]}; "
                f"the download is incomplete (fetch the missing shards)"
            )
        return key_to_file
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise TargetLoadError(
            f"{path}: no weights (*.safetensors) found; download the model's "
            f"safetensors files into this directory (other weight formats are not read)"
        )
    key_to_file = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            key_to_file.update(dict.fromkeys(handle.keys(), file))
    return key_to_file


class TargetModelDir:
    """One local target directory: parsed text config and an index of its weight files."""

    def __init__(self, path: str | Path, weights: bool = True) -> None:
        """Parse config.json and index the weights (``weights=False``: config only, for
        targets whose weights are drawn at random)."""
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise TargetLoadError(
                f"target directory {self.path} does not exist; set target.path to a local "
                f"Hugging Face model directory (config.json + *.safetensors), or leave it "
                f"empty for the built-in tiny target"
            )
        config_file = self.path / "config.json"
        if not config_file.is_file():
            raise TargetLoadError(
                f"{self.path}: no config.json; target.path must be a Hugging Face model "
                f"directory (download the full model, not only its weights)"
            )
        try:
            full = json.loads(config_file.read_text())
        except json.JSONDecodeError as exc:
            raise TargetLoadError(
                f"{config_file}: not valid JSON ({exc}); re-download it"
            ) from None
        self.text_config_dict: dict = full.get("text_config") or full
        # A wrapper's quantization settings apply to its language model too.
        self.quantization: dict | None = self.text_config_dict.get(
            "quantization_config"
        ) or full.get("quantization_config")
        self.model_type = self._text_model_type(full)
        self._key_to_file = index_weights(self.path) if weights else {}
        self.key_prefix = self._detect_key_prefix() if weights else "model."

    @property
    def num_layers(self) -> int:
        """The target's full decoder layer count."""
        return int(self.text_config_dict["num_hidden_layers"])

    @property
    def keys(self) -> list[str]:
        """Every tensor key the checkpoint stores."""
        return list(self._key_to_file)

    def text_config(self, num_layers: int | None = None) -> PretrainedConfig:
        """The HF text config; with ``num_layers``, truncated to the first layers.

        Per-layer entries (``layer_types``) are cut together with ``num_hidden_layers``,
        so a model built from the result never allocates the dropped layers. A cut config
        transformers refuses (a hybrid whose attention layers all lie past the cut) is a
        TargetLoadError naming the fix.
        """
        values: dict[str, Any] = {**self.text_config_dict, "model_type": self.model_type}
        if self.quantization is not None:
            values["quantization_config"] = self.quantization
        if num_layers is None:
            return CONFIG_MAPPING[self.model_type].from_dict(values)
        try:
            return CONFIG_MAPPING[self.model_type].from_dict(
                truncated_config_values(values, num_layers)
            )
        except Exception as exc:  # transformers' config validators raise kinds of their own
            reason = " ".join(str(exc).split()).rstrip(".")
            raise TargetLoadError(
                f"{self.path}: the {self.model_type} config cut to its first {num_layers} "
                f"layers (through the deepest tapped layer, {num_layers - 1}) is refused by "
                f"transformers ({reason}); tap a deeper layer ([target] tap_layers) so the layers "
                f"kept make a model transformers builds"
            ) from None

    @contextmanager
    def text_weights(self, keep: Callable[[str], bool]) -> Iterator[dict[str, Any]]:
        """Lazy views of the language model's tensors whose key (relative to the language
        model, e.g. ``layers.3.mlp.gate.weight``) passes ``keep``.

        Yields ``{relative key: safetensors slice}``; a tensor is read only when its slice
        is materialised, and the files stay open until the context ends. Keys outside the
        language model (vision tower, LM head, multi-token-prediction heads) never pass.
        """
        chosen: dict[Path, list[tuple[str, str]]] = {}
        prefix = self.key_prefix
        for key, file in self._key_to_file.items():
            if not key.startswith(prefix):
                continue
            relative = key[len(prefix) :]
            if keep(relative):
                chosen.setdefault(file, []).append((key, relative))
        with ExitStack() as files:
            views = {}
            for file, pairs in chosen.items():
                handle = files.enter_context(safe_open(str(file), framework="pt"))
                views.update({relative: handle.get_slice(key) for key, relative in pairs})
            yield views

    def _text_model_type(self, full: dict) -> str:
        model_type = self.text_config_dict.get("model_type")
        if model_type is None and "text_config" in full:
            model_type = f"{full.get('model_type')}_text"
        if model_type not in CONFIG_MAPPING:
            raise TargetLoadError(
                f"{self.path}/config.json: model type {model_type!r} is unknown to the "
                f"installed transformers; upgrade transformers to a version that knows it "
                f"(ringtrain runs any decoder model transformers can build)"
            )
        return model_type

    def _detect_key_prefix(self) -> str:
        for prefix in TEXT_KEY_PREFIXES:
            if prefix + "embed_tokens.weight" in self._key_to_file:
                return prefix
        raise TargetLoadError(
            f"{self.path}: no token embedding (*embed_tokens.weight) among the checkpoint's "
            f"weights; the drafter needs the target's embedding, and ringtrain runs decoder "
            f"models whose language model has one"
        )
