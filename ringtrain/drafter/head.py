"""The frozen token embedding and LM head the drafter shares with its target.

Only those two tensors are read, by key, straight from the target's safetensors (the
index file says which shard holds each key); the rest of the target is never loaded.
They are not trained and not saved in drafter checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ringtrain.drafter.spec import text_config_dict
from ringtrain.target.model_dir import index_weights

EMBED_KEYS = (
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
    "embed_tokens.weight",
)
LM_HEAD_KEYS = (
    "lm_head.weight",
    "model.lm_head.weight",
    "language_model.lm_head.weight",
)


@dataclass(frozen=True)
class FrozenHead:
    """Token embedding [V, H] and LM head [V, H] (the same tensor when tied)."""

    embed: torch.Tensor
    lm_head: torch.Tensor

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head."""
        return self.lm_head.shape[0]

    @property
    def hidden_size(self) -> int:
        """Width of the embedding."""
        return self.embed.shape[1]

    @classmethod
    def random(
        cls,
        vocab_size: int,
        hidden_size: int,
        device: torch.device | str,
        dtype: torch.dtype,
        seed: int = 0,
    ) -> FrozenHead:
        """A random, untied head (benchmarks and tests without target files), drawn on
        `device` itself: a Qwen3-sized head is over a billion values, slow on a CPU."""
        gen = torch.Generator(device=device).manual_seed(seed)
        shape = (vocab_size, hidden_size)
        embed = torch.randn(shape, generator=gen, device=device).mul_(0.02)
        lm_head = torch.randn(shape, generator=gen, device=device).mul_(0.02)
        return cls(embed.to(dtype), lm_head.to(dtype))


def _read_tensor(path: Path, key: str) -> torch.Tensor:
    with safe_open(str(path), framework="pt") as handle:
        return handle.get_tensor(key)


def _tied(target_dir: Path) -> bool:
    config_path = target_dir / "config.json"
    if not config_path.exists():
        return False
    raw = json.loads(config_path.read_text())
    return bool(raw.get("tie_word_embeddings") or text_config_dict(raw).get("tie_word_embeddings"))


def load_frozen_head(
    target_dir: str | Path, device: torch.device | str, dtype: torch.dtype
) -> FrozenHead:
    """Read the target's embedding and LM head (tied when the LM head is absent or tied)."""
    target_dir = Path(target_dir)
    key_to_file = index_weights(target_dir)
    embed_key = next((k for k in EMBED_KEYS if k in key_to_file), None)
    if embed_key is None:
        raise KeyError(
            f"{target_dir}: no token embedding among the safetensors keys (looked for "
            f"{', '.join(EMBED_KEYS)}); is this a supported decoder-only model?"
        )
    embed = _read_tensor(key_to_file[embed_key], embed_key).to(device, dtype)
    head_key = next((k for k in LM_HEAD_KEYS if k in key_to_file), None)
    if head_key is None or _tied(target_dir):
        return FrozenHead(embed, embed)
    lm_head = _read_tensor(key_to_file[head_key], head_key).to(device, dtype)
    if lm_head.shape != embed.shape:
        raise ValueError(
            f"{target_dir}: {head_key} has shape {tuple(lm_head.shape)} but {embed_key} has "
            f"{tuple(embed.shape)}; the drafter needs both [vocab, hidden]"
        )
    return FrozenHead(embed, lm_head)
