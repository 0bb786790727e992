"""Model shapes shared by the benchmark scripts in tools/ (imported as a sibling module).

``QWEN3_8B`` holds the sizes of Qwen3-8B's architecture as its config.json spells them;
each benchmark adds the config values its consumer needs (model type, norm epsilon,
RoPE base, context length). ``QWEN3_MASK_TOKEN_ID`` is the DFlash mask token of Qwen3.
"""

from __future__ import annotations

QWEN3_8B: dict[str, int] = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
QWEN3_MASK_TOKEN_ID = 151669
