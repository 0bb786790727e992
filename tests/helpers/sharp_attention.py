"""Sharper attention for the tiny random targets, so greedy answers depend on the whole prompt.

A random tiny model's next token depends mostly on the last token: its attention is
nearly uniform (Qwen3 normalises each query and key head to unit scale) and what the
attention adds to the residual stream is small beside the token's own embedding. Tests
that compare decoding paths (a key/value cache, left padding, a slot taken over from
another answer) then pass even when a path attends to the wrong positions. Scaling the
query and key norms' weights makes the attention peaked, and scaling the value and output
projections makes what it reads count: answers to prompts that differ in their first
character then differ.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def sharpen_attention(
    model: torch.nn.Module, query_key_scale: float = 4.0, value_output_scale: float = 2.0
) -> None:
    """Scale, in place, every full-attention layer's query/key norm weights by
    `query_key_scale` and its value and output projections by `value_output_scale`."""
    with torch.no_grad():
        for layer in model.model.layers:
            attention = getattr(layer, "self_attn", None)
            if attention is None:
                continue
            attention.q_norm.weight.mul_(query_key_scale)
            attention.k_norm.weight.mul_(query_key_scale)
            attention.v_proj.weight.mul_(value_output_scale)
            attention.o_proj.weight.mul_(value_output_scale)


def sharpen_saved_model(directory: Path) -> Path:
    """Sharpen the attention of the model saved in `directory` and save it back."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    sharpen_attention(model)
    model.save_pretrained(directory)
    return directory
