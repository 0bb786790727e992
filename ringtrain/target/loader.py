"""Load a target from a local Hugging Face directory, truncated after its deepest tap.

The model is built on the meta device from a config whose layer count (and per-layer
lists) is cut to ``max(tap_layers) + 1``, its final norm replaced by identity, then
given storage on the target device and filled tensor by tensor from the safetensors
files: dropped layers, the final norm and the LM head are never allocated or read, and
no host copy of the whole model is ever made.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, PretrainedConfig

from ringtrain.target.checkpoint import TargetCheckpoint, TargetLoadError
from ringtrain.target.compiled import resolve_compile
from ringtrain.target.tapped import TappedTarget
from ringtrain.target.taps import check_tap_layers, default_tap_layers

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_dtype(
    dtype: str | torch.dtype, device: torch.device, setting: str = "target.dtype"
) -> torch.dtype:
    """``"auto"``: bf16 on GPU, float32 on CPU; otherwise the named dtype.

    ``setting`` names where the value came from (a config key or a command-line option),
    for the error on an unknown name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"{setting} {dtype!r} is not one of 'auto', {', '.join(DTYPES)}")
    return DTYPES[dtype]


def is_hybrid(config: PretrainedConfig) -> bool:
    """Whether the target has linear-attention (Gated DeltaNet) layers."""
    return "linear_attention" in (getattr(config, "layer_types", None) or ())


def linear_attention_backend(config: PretrainedConfig, device: torch.device) -> str | None:
    """The Gated DeltaNet implementation transformers will use: "fla", "torch" or None.

    Raises when flash-linear-attention is importable but the target runs on CPU:
    transformers binds FLA's Triton functions at import time, and Triton has no CPU
    driver, so FLA must not be installed in CPU-only environments.
    """
    if not is_hybrid(config):
        return None
    fla_installed = importlib.util.find_spec("fla") is not None
    if fla_installed and device.type != "cuda":
        raise TargetLoadError(
            "flash-linear-attention is installed but the hybrid target runs on "
            f"{device.type}; its Triton kernels need CUDA. Uninstall flash-linear-attention "
            "in CPU-only environments (install it only where CUDA is present)"
        )
    return "fla" if fla_installed else "torch"


def load_target(
    path: str | Path,
    *,
    tap_layers: list[int] | None = None,
    num_taps: int = 5,
    device: torch.device | str = "cpu",
    dtype: str | torch.dtype = "auto",
    attn_implementation: str = "sdpa",
    random_weights: bool = False,
    compile: str = "auto",
) -> TappedTarget:
    """Load a frozen, truncated target ready to write its tapped layers.

    ``random_weights`` draws the weights at random instead of reading them (benchmarks
    of large shapes from a config-only directory). ``compile`` (``target.compile``):
    ``"auto"`` compiles the decoder layers with torch.compile on CUDA and runs them
    eagerly on CPU; ``"on"`` / ``"off"`` force it.

    ``tap_layers`` empty or None picks the DFlash spread over the FULL layer count
    (``default_tap_layers(L, num_taps)``). Every check on the directory, config, weights
    and tapped layers runs before any weight is read.
    """
    started = time.perf_counter()
    checkpoint = TargetCheckpoint(path, weights=not random_weights)
    full_layers = checkpoint.num_layers
    source = str(checkpoint.path)
    if tap_layers:
        taps = check_tap_layers(tap_layers, full_layers, source)
    else:
        taps = default_tap_layers(full_layers, num_taps)
    device = torch.device(device)
    dtype = resolve_dtype(dtype, device)
    compiled = resolve_compile(compile, device)
    full_config = checkpoint.text_config()
    backend = linear_attention_backend(full_config, device)
    kept = max(taps) + 1
    log.info(
        "loading target %s (%s): layers 0..%d of %d, taps %s, %s on %s%s%s",
        source,
        checkpoint.model_type,
        kept - 1,
        full_layers,
        taps,
        dtype,
        device,
        f", Gated DeltaNet kernels: {backend}" if backend else "",
        ", layers compiled" if compiled else "",
    )
    if backend == "torch" and device.type == "cuda":
        log.warning(
            "flash-linear-attention is not installed: the hybrid target runs the slow torch "
            "fallback on GPU (install the 'gpu' extra)"
        )
    module = build_truncated_model(
        checkpoint.text_config(num_layers=kept), device, dtype, attn_implementation
    )
    if random_weights:
        randomise_weights(module)
    else:
        _load_weights(module, checkpoint, device)
    target = TappedTarget(module, full_config, taps, device, dtype)
    if compiled:
        target.compile_layers()
        target.precompile()
    log.info("target loaded in %.1f s", time.perf_counter() - started)
    return target


def build_truncated_model(
    config: PretrainedConfig,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str = "sdpa",
) -> nn.Module:
    """The frozen HF text model of an (already truncated) config, weights NOT yet set.

    Built on the meta device, final norm replaced by identity, then given uninitialised
    storage on ``device``; computed buffers (rotary frequencies) are real. The caller
    fills every parameter (from a checkpoint, or randomly for benchmarks).
    """
    with torch.device("meta"):
        module = AutoModel.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    module.norm = nn.Identity()
    module.to_empty(device=device)
    _rebuild_computed_buffers(module, device)
    return module.eval().requires_grad_(False)


def _load_weights(module: nn.Module, checkpoint: TargetCheckpoint, device: torch.device) -> None:
    """Copy every parameter and persistent buffer of ``module`` from the checkpoint."""
    targets = module.state_dict(keep_vars=True)
    keys = {checkpoint.text_key(name): name for name in targets}
    with torch.no_grad():
        for key, tensor in checkpoint.iter_tensors(keys, device):
            target = targets[keys[key]]
            if target.shape != tensor.shape:
                raise TargetLoadError(
                    f"{checkpoint.path}: weight {key!r} has shape {tuple(tensor.shape)} but "
                    f"config.json implies {tuple(target.shape)}; config and weights disagree"
                )
            target.copy_(tensor)


def randomise_weights(module: nn.Module) -> None:
    """Benchmark weights of sane scale, drawn from torch's global generator.

    Matrices N(0, 0.02); vectors (norms, biases, Gated DeltaNet ``dt_bias``) ones, so
    norms are unit; Gated DeltaNet ``A_log`` = log U(1, 16), its decay in the usual range.
    """
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("A_log"):
                param.uniform_(1.0, 16.0).log_()
            elif param.ndim == 1:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)


def _rebuild_computed_buffers(module: nn.Module, device: torch.device) -> None:
    """Recreate modules whose non-persistent buffers (rotary frequencies) are computed.

    Such buffers are not in the checkpoint and were left uninitialised by ``to_empty``.
    """
    for name, child in list(module.named_modules()):
        if not getattr(child, "_non_persistent_buffers_set", None):
            continue
        if "RotaryEmbedding" not in type(child).__name__:
            raise TargetLoadError(
                f"unsupported target: module {name} ({type(child).__name__}) has computed "
                f"buffers that ringtrain does not know how to initialise"
            )
        with torch.device(device):
            rebuilt = type(child)(config=child.config)
        parent_name, _, attr = name.rpartition(".")
        setattr(module.get_submodule(parent_name), attr, rebuilt)
