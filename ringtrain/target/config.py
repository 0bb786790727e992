"""Configuration of the target model ([target] in the TOML config)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec


class TargetConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which target to load and which of its layers to tap."""

    # Local Hugging Face model directory. Empty: the built-in tiny hybrid target,
    # random-initialised and written to the run directory.
    path: str = ""
    # "auto" (bf16 on GPU, float32 on CPU) | "bfloat16" | "float32"
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    # Layer indices whose outputs feed the drafter. Empty: DFlash default spread.
    tap_layers: list[Annotated[int, msgspec.Meta(ge=0)]] = msgspec.field(default_factory=list)
    # Layers tapped when tap_layers is empty, spread evenly from layer 1 to L-3.
    num_taps: Annotated[int, msgspec.Meta(ge=1)] = 5
    # Draw the weights at random instead of reading them: for benchmarks of large shapes
    # from a directory holding only config.json. Never for real training.
    random_weights: bool = False
    # torch.compile the decoder layers (fused norms, rotary, SiLU*mul, residual adds):
    # "auto" (on when the target runs on CUDA, off on CPU) | "on" | "off".
    compile: Literal["auto", "on", "off"] = "auto"
    # With compile: compile mixture-of-experts blocks too (routing, grouped expert GEMMs
    # and the weighted sum over the top-k experts in one graph per layer), where the
    # experts run by transformers' "grouped_mm" or "batched_mm" implementation; plain
    # grouped_mm experts then run by ringtrain's, whose top-k sum is one kernel
    # (Qwen3-30B-A3B shape on an H200: MFU 0.26 -> 0.43). false keeps them eager.
    compile_moe: bool = True
    # A hybrid target's Gated DeltaNet kernels: "auto" (flash-linear-attention's Triton
    # kernels where installed, else transformers' torch implementation) | "fla" | "torch"
    # (no Triton autotuning at the first forward: for tiny targets, whose forward is cheap).
    linear_attention: Literal["auto", "fla", "torch"] = "auto"
    # Attention kernels: "auto" (SDPA where the model allows it, else flex_attention on
    # CUDA and eager on CPU, e.g. gpt-oss's attention sinks) | "sdpa" | "eager" |
    # "flex_attention".
    attn_implementation: Literal["auto", "sdpa", "eager", "flex_attention"] = "auto"
