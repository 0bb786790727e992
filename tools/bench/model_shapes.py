"""Model shapes shared by the benchmark scripts in tools/bench/.

``QWEN3_8B`` holds the sizes of Qwen3-8B's architecture as its config.json spells them
(``QWEN3_32B`` those of Qwen3-32B),
``QWEN3_30B_A3B`` those of Qwen3-30B-A3B (model type ``qwen3_moe``: 128 routed experts,
8 per token, no shared expert, every layer sparse); each benchmark adds the config values
its consumer needs (model type, norm epsilon, RoPE base, context length).
``QWEN3_MASK_TOKEN_ID`` is the DFlash mask token of Qwen3 (both share the vocabulary).
``SMOLLM2_135M`` holds those of SmolLM2-135M-Instruct, the real-model recipe's target
(``SMOLLM2_MASK_TOKEN_ID``: the recipe's mask token, configs/smollm2-135m.toml).
``QWEN3_5_27B`` holds those of Qwen3.5-27B's text decoder (model type ``qwen3_5_text``),
the hybrid target class ringtrain was made for, as the "Model Overview" of the
Qwen/Qwen3.5-27B and Qwen/Qwen3.6-27B model cards gives them (the two share the layout):
64 layers as 16 x (3 x (Gated DeltaNet -> FFN) -> 1 x (gated attention -> FFN)); Gated
DeltaNet with 16 query/key and 48 value heads of 128; gated attention with 24 query / 4
key-value heads of 256, rotary on 64 of the 256 dimensions (transformers' default
partial_rotary_factor 0.25); FFN 17,408; padded vocabulary 248,320; about 54 GB of bf16
weights. ``QWEN3_5_MASK_TOKEN_ID`` is a reserved token of that vocabulary, used as the
DFlash mask token of the Qwen3.5 shapes.
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
QWEN3_30B_A3B: dict[str, int | bool] = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
}
QWEN3_MASK_TOKEN_ID = 151669
QWEN3_32B: dict[str, int] = {
    "vocab_size": 151936,
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
SMOLLM2_135M: dict[str, int] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
}
SMOLLM2_MASK_TOKEN_ID = 16
QWEN3_5_27B: dict[str, int] = {
    "vocab_size": 248320,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 64,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}
QWEN3_5_MASK_TOKEN_ID = 248070
