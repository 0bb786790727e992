"""Read a local Hugging Face target directory: its text config and selected weights.

Only local files are read (never the hub). Multimodal checkpoints (e.g. Qwen3.5, whose
config nests the language model under ``text_config`` and whose weights live under
``model.language_model.``) are handled by using the text config and detecting the key
prefix of the language model's weights. Weights are read tensor by tensor from the
safetensors files (through the index when there is one), straight onto the requested
device, so a large target is never copied whole into host memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import CONFIG_MAPPING, PretrainedConfig

# Text model types the target side knows how to run (dense, MoE and hybrid Gated DeltaNet).
SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
# Key prefixes of the language model's weights, most specific first.
TEXT_KEY_PREFIXES = (
    "model.language_model.",
    "language_model.model.",
    "language_model.",
    "model.",
    "",
)
# Config entries holding one value per layer; truncated together with num_hidden_layers.
PER_LAYER_CONFIG_KEYS = ("layer_types",)


class TargetLoadError(ValueError):
    """A target directory that cannot be used; the message names the problem and the fix."""


def truncated_config_values(values: dict, num_layers: int) -> dict:
    """Config values cut to the first ``num_layers`` layers (per-layer lists included)."""
    cut = {**values, "num_hidden_layers": num_layers}
    for key in PER_LAYER_CONFIG_KEYS:
        if isinstance(cut.get(key), list):
            cut[key] = cut[key][:num_layers]
    return cut


class TargetCheckpoint:
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
        self.model_type = self._text_model_type(full)
        self._key_to_file = self._index_weights() if weights else {}
        self.key_prefix = self._detect_key_prefix() if weights else "model."

    @property
    def num_layers(self) -> int:
        """The target's full decoder layer count."""
        return int(self.text_config_dict["num_hidden_layers"])

    def text_config(self, num_layers: int | None = None) -> PretrainedConfig:
        """The HF text config; with ``num_layers``, truncated to the first layers.

        Per-layer entries (``layer_types``) are cut together with ``num_hidden_layers``,
        so a model built from the result never allocates the dropped layers.
        """
        values = {**self.text_config_dict, "model_type": self.model_type}
        if num_layers is not None:
            values = truncated_config_values(values, num_layers)
        return CONFIG_MAPPING[self.model_type].from_dict(values)

    def text_key(self, name: str) -> str:
        """Checkpoint key of a text-model parameter name such as ``embed_tokens.weight``."""
        return self.key_prefix + name

    def has_key(self, key: str) -> bool:
        """Whether the checkpoint stores ``key`` (a full checkpoint key)."""
        return key in self._key_to_file

    def read(
        self, keys: Iterable[str], device: torch.device | str, dtype: torch.dtype | None = None
    ) -> dict[str, torch.Tensor]:
        """Read full checkpoint keys onto ``device`` (cast to ``dtype`` if given)."""
        return {
            key: tensor if dtype is None else tensor.to(dtype)
            for key, tensor in self.iter_tensors(keys, device)
        }

    def iter_tensors(
        self, keys: Iterable[str], device: torch.device | str
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(key, tensor)`` one at a time, each read from its file onto ``device``.

        Yielding one tensor at a time lets a caller copy it into place and drop it, so
        loading never holds a second copy of the weights.
        """
        by_file: dict[Path, list[str]] = {}
        for key in keys:
            if key not in self._key_to_file:
                raise TargetLoadError(
                    f"{self.path}: weight {key!r} is not in the checkpoint; the weight files "
                    f"are incomplete or belong to another model (re-download the model)"
                )
            by_file.setdefault(self._key_to_file[key], []).append(key)
        for file, file_keys in by_file.items():
            with safe_open(str(file), framework="pt", device=str(device)) as handle:
                for key in file_keys:
                    yield key, handle.get_tensor(key)

    def _text_model_type(self, full: dict) -> str:
        model_type = self.text_config_dict.get("model_type")
        if model_type is None and "text_config" in full:
            model_type = f"{full.get('model_type')}_text"
        if model_type not in SUPPORTED_MODEL_TYPES or model_type not in CONFIG_MAPPING:
            raise TargetLoadError(
                f"{self.path}/config.json: unsupported target model type {model_type!r}; "
                f"supported text model types: {', '.join(SUPPORTED_MODEL_TYPES)} (those "
                f"this transformers version knows); use a Qwen3 or Qwen3.5/Qwen3-Next model"
            )
        return model_type

    def _index_weights(self) -> dict[str, Path]:
        index_files = sorted(self.path.glob("*.safetensors.index.json"))
        if index_files:
            weight_map = json.loads(index_files[0].read_text())["weight_map"]
            key_to_file = {key: self.path / file for key, file in weight_map.items()}
            missing = sorted({str(f) for f in key_to_file.values() if not f.is_file()})
            if missing:
                raise TargetLoadError(
                    f"{index_files[0]}: lists weight files that are missing: {missing[:3]}; "
                    f"the download is incomplete (fetch the missing shards)"
                )
            return key_to_file
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise TargetLoadError(
                f"{self.path}: no weights (*.safetensors) found; download the model's "
                f"safetensors files into this directory (other weight formats are not read)"
            )
        key_to_file = {}
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                key_to_file.update(dict.fromkeys(handle.keys(), file))
        return key_to_file

    def _detect_key_prefix(self) -> str:
        for prefix in TEXT_KEY_PREFIXES:
            if prefix + "embed_tokens.weight" in self._key_to_file:
                return prefix
        raise TargetLoadError(
            f"{self.path}: no token embedding (*embed_tokens.weight) among the checkpoint's "
            f"weights; this is not a supported decoder checkpoint"
        )


def read_target_config(path: str | Path, weights: bool = True) -> PretrainedConfig:
    """The FULL HF text config of a target directory, after checking config and weights
    (``weights=False``: config only).

    Cheap (reads config.json and the weight index or safetensors headers only), so
    every rank can validate its inputs with it before any GPU work.
    """
    return TargetCheckpoint(path, weights).text_config()
