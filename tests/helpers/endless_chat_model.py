"""A tiny chat model that never says its end-of-turn token, so every answer runs to its
token limit: that token's logit is 0, and two other tokens' logits are opposite, so one of
them is always above it."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from ringtrain.target.tiny import EOS_TOKEN_ID, build_tiny_target


def write_endless_chat_model(directory: Path, hybrid: bool = False) -> Path:
    """The endless model in `directory` (dense of 2 layers, or hybrid of 4); returns it."""
    build_tiny_target(directory, hybrid=hybrid, num_layers=4 if hybrid else 2, seed=3)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        head[EOS_TOKEN_ID] = 0.0
        head[-2] = -head[-3]
    model.save_pretrained(directory)
    return directory
