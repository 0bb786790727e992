"""Quantized target checkpoints: which schemes load, and how.

Block-wise FP8 (``quant_method = "fp8"``, the official "-FP8" releases: float8 weights
with a ``weight_scale_inv`` per block) and MXFP4 (``"mxfp4"``, gpt-oss: packed 4-bit
expert weights with shared exponents) are dequantized at load by transformers' own
dequantization, into the target's compute dtype: every weight becomes its stored value
times its scale, exactly what the quantized model means, on CPU and GPU alike. The
target then runs the same bf16 kernels as an unquantized one (at twice the weight
memory of FP8; large FP8 targets use more GPUs per target). Any other scheme is refused
before any weight is read, never loaded approximately.
"""

from __future__ import annotations

from ringtrain.target.model_dir import TargetLoadError

DEQUANTIZED_SCHEMES = {
    "fp8": "block-wise FP8 (float8 weights with per-block scales)",
    "mxfp4": "MXFP4 (4-bit experts with shared exponents, as in gpt-oss)",
}


def dequantizing_config(quantization: dict | None, source: str) -> dict | None:
    """The ``quantization_config`` to load a checkpoint with: its own settings with
    dequantization switched on; None for an unquantized checkpoint.

    Raises TargetLoadError naming the scheme when ringtrain cannot load it exactly.
    """
    if quantization is None:
        return None
    method = quantization.get("quant_method")
    if method not in DEQUANTIZED_SCHEMES:
        handled = "; ".join(f"{name!r}: {what}" for name, what in DEQUANTIZED_SCHEMES.items())
        raise TargetLoadError(
            f"{source}: quantization scheme {method!r} is not supported (loaded schemes: "
            f"{handled}); use the model's unquantized (bf16) release or one of those schemes"
        )
    return {**quantization, "dequantize": True}
