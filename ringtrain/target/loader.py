"""Load a target from a local Hugging Face directory, truncated after its deepest tap.

The model is built by transformers' own loader from a config whose layer count (and
per-layer lists) is cut to ``max(tap_layers) + 1``, fed only lazy views of the weights
it keeps: the embedding, the kept layers, and the final norm only when the last layer is
tapped. Dropped layers, the LM head, vision towers and multi-token-prediction heads are
never allocated or read, and no host copy of the whole model is ever made. transformers
applies each model type's weight conversions (checkpoints store one tensor per expert,
its modules hold fused expert stacks; wrappers rename prefixes) and dequantizes FP8 and
MXFP4 weights (``ringtrain.target.quantized``), so every family it can build loads.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.utils import logging as hf_logging

from ringtrain.target.compiled import resolve_compile
from ringtrain.target.linear_attention import choose_linear_attention, settle_linear_attention
from ringtrain.target.model_dir import (
    WITHOUT_HUB_KERNELS,
    TargetLoadError,
    TargetModelDir,
    layer_index,
)
from ringtrain.target.quantized import dequantizing_config
from ringtrain.target.structure import (
    base_model_class,
    check_structure,
    resolve_attn_implementation,
)
from ringtrain.target.tapped import TappedTarget
from ringtrain.target.taps import check_tap_layers, default_tap_layers, taps_final_norm

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def group_size(group: torch.distributed.ProcessGroup | None) -> int:
    """Members of a target group (1 without one)."""
    return 1 if group is None else group.size()


def check_target_group(config: PretrainedConfig, members: int) -> None:
    """Raise TargetLoadError unless the truncated target of ``config`` can be split over a
    group of ``members`` (parallel.check_tensor_parallel). DTensor's import takes seconds:
    only runs with target groups pay for it."""
    if members > 1:
        from ringtrain.target.parallel import check_tensor_parallel

        check_tensor_parallel(config, members)


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


def load_target(
    path: str | Path,
    *,
    tap_layers: list[int] | None = None,
    num_taps: int = 5,
    device: torch.device | str = "cpu",
    dtype: str | torch.dtype = "auto",
    attn_implementation: str = "auto",
    random_weights: bool = False,
    compile: str = "auto",
    compile_moe: bool = True,
    linear_attention: str = "auto",
    group: torch.distributed.ProcessGroup | None = None,
) -> TappedTarget:
    """Load a frozen, truncated target ready to write its tapped layers.

    ``random_weights`` draws the weights at random instead of reading them (benchmarks
    of large shapes from a config-only directory). ``compile`` (``target.compile``):
    ``"auto"`` compiles the decoder layers with torch.compile on CUDA and runs them
    eagerly on CPU; ``"on"`` / ``"off"`` force it; ``compile_moe`` (``target.compile_moe``)
    compiles mixture-of-experts blocks with them. ``linear_attention``
    (``target.linear_attention``): a hybrid target's Gated DeltaNet kernels, "auto" (FLA
    where installed), "fla" or "torch" (ringtrain.target.linear_attention).
    ``attn_implementation``
    (``target.attn_implementation``): ``"auto"`` picks SDPA where the model allows it.
    ``group``: the process group of a tensor-parallel target group (every member calls
    ``load_target`` with the same arguments and later ``forward_into`` with the same
    batch, and gets identical taps); None or a group of one loads the whole truncated
    target on this rank. With k > 1 members each holds 1/k of every layer's attention
    and MLP / expert weights (``ringtrain.target.parallel``): the truncated model is read
    into host memory, then split layer by layer onto ``device``.

    ``tap_layers`` empty or None picks the DFlash spread over the FULL layer count
    (``default_tap_layers(L, num_taps)``). Every check on the directory, config, weights,
    quantization and tapped layers runs before any weight is read.
    """
    started = time.perf_counter()
    checkpoint = TargetModelDir(path, weights=not random_weights)
    taps = _resolve_taps(checkpoint, tap_layers, num_taps)
    device = torch.device(device)
    dtype = resolve_dtype(dtype, device)
    compiled = resolve_compile(compile, device)
    full_config = checkpoint.text_config()
    # Before the structure check: it imports the model's code, and with it FLA, which
    # reads its kernel configurations only when imported.
    backend = choose_linear_attention(full_config, device, linear_attention)
    check_structure(full_config)
    attention = resolve_attn_implementation(attn_implementation, full_config, device)
    kept = max(taps) + 1
    members = group_size(group)
    check_target_group(checkpoint.text_config(num_layers=kept), members)
    _announce(checkpoint, taps, dtype, device, attention, compiled, members, backend)
    final_norm = taps_final_norm(taps, checkpoint.num_layers)
    place = TargetPlacement(device, dtype, attention, group)
    module = _truncated_module(checkpoint, kept, final_norm, place, random_weights)
    backend = settle_linear_attention(module, backend, linear_attention, device)
    target = TappedTarget(module, full_config, taps, device, dtype, backend)
    if compiled:
        target.compile_layers(moe=compile_moe)
        target.precompile()
    log.info("target loaded in %.1f s", time.perf_counter() - started)
    return target


@dataclass(frozen=True)
class TargetPlacement:
    """Where and how the truncated model is built: device, dtype, attention
    implementation and the tensor-parallel group (None: this rank alone)."""

    device: torch.device
    dtype: torch.dtype
    attention: str
    group: torch.distributed.ProcessGroup | None


def _truncated_module(
    checkpoint: TargetModelDir,
    kept: int,
    final_norm: bool,
    place: TargetPlacement,
    random_weights: bool,
) -> nn.Module:
    """The first ``kept`` layers, read (or drawn at random) and, for a group, split.

    A group's members read the whole truncated model into host memory, then split it
    layer by layer onto the device; random weights are drawn alike on every member
    (replicated weights must agree).
    """
    members = group_size(place.group)
    load_device = place.device if members == 1 else torch.device("cpu")
    if random_weights:
        config = checkpoint.text_config(num_layers=kept)
        module = build_truncated_model(
            config, load_device, place.dtype, place.attention, final_norm
        )
        with torch.random.fork_rng(devices=[], enabled=members > 1):
            if members > 1:
                torch.manual_seed(0)
            randomise_weights(module)
    else:
        module = read_truncated_model(
            checkpoint, kept, final_norm, load_device, place.dtype, place.attention
        )
    if members > 1:
        from ringtrain.target.parallel import shard_target

        shard_target(module, place.group, place.device)
    return module


def _resolve_taps(
    checkpoint: TargetModelDir, tap_layers: list[int] | None, num_taps: int
) -> list[int]:
    """The tapped layers: the given ones checked, or the DFlash spread; a tap of the last
    layer is logged with a warning (see ringtrain.target.taps)."""
    full_layers = checkpoint.num_layers
    if not tap_layers:
        return default_tap_layers(full_layers, num_taps)
    taps = check_tap_layers(tap_layers, full_layers, str(checkpoint.path))
    if taps_final_norm(taps, full_layers):
        log.warning(
            "tapping the last layer (%d): its tap is taken after the final norm, as the DFlash "
            "reference computes it; SGLang and vLLM capture taps as the input of the next "
            "layer and cannot serve a drafter that taps the last one",
            full_layers - 1,
        )
    return taps


def _announce(
    checkpoint: TargetModelDir,
    taps: list[int],
    dtype: torch.dtype,
    device: torch.device,
    attention: str,
    compiled: bool,
    members: int,
    backend: str | None,
) -> None:
    """Log what is about to load (and refuse an unsupported quantization scheme first)."""
    source = str(checkpoint.path)
    quantization = dequantizing_config(checkpoint.quantization, source)
    log.info(
        "loading target %s (%s): layers 0..%d of %d, taps %s, %s on %s, %s attention%s%s%s%s",
        source,
        checkpoint.model_type,
        max(taps),
        checkpoint.num_layers,
        taps,
        dtype,
        device,
        attention,
        f", {quantization['quant_method']} weights dequantized" if quantization else "",
        f", Gated DeltaNet kernels: {backend}" if backend else "",
        ", layers compiled" if compiled else "",
        f", split over a tensor-parallel group of {members}" if members > 1 else "",
    )


def build_truncated_model(
    config: PretrainedConfig,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str = "sdpa",
    final_norm: bool = False,
) -> nn.Module:
    """The frozen HF text model of an (already truncated) config, weights NOT yet set.

    Built on the meta device, final norm replaced by identity unless ``final_norm``, then
    given uninitialised storage on ``device``; computed buffers (rotary frequencies) are
    real. The caller fills every parameter (randomly, for benchmarks).
    """
    with torch.device("meta"):
        module = base_model_class(config)._from_config(
            config, dtype=dtype, attn_implementation=attn_implementation
        )
    if not final_norm:
        module.norm = nn.Identity()
    module.to_empty(device=device)
    _rebuild_computed_buffers(module, device)
    return module.eval().requires_grad_(False)


def read_truncated_model(
    checkpoint: TargetModelDir,
    kept: int,
    final_norm: bool,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str,
) -> nn.Module:
    """The first ``kept`` decoder layers of the checkpoint's text model, frozen on ``device``.

    Only the embedding, the kept layers and (with ``final_norm``) the final norm are
    handed to transformers' loader, as lazy views, so nothing else is ever read; the
    loader applies the model type's weight conversions (per-expert tensors fused into
    the modules' expert stacks, renamed keys) and dequantizes quantized weights. Any
    weight it could not place, or any parameter left without a weight, is an error.
    """
    config = checkpoint.text_config(num_layers=kept)
    if checkpoint.quantization is not None:
        config.quantization_config = dequantizing_config(
            checkpoint.quantization, str(checkpoint.path)
        )

    def keep(key: str) -> bool:
        layer = layer_index(key)
        if layer is not None:
            return layer < kept
        return key.startswith("embed_tokens.") or (final_norm and key.startswith("norm."))

    with checkpoint.text_weights(keep) as weights, _quiet_transformers():
        module, report = base_model_class(config).from_pretrained(
            None,
            config=config,
            state_dict=weights,
            dtype=dtype,
            device_map={"": device},
            attn_implementation=attn_implementation,
            output_loading_info=True,
            **WITHOUT_HUB_KERNELS,
        )
    _check_report(report, checkpoint, final_norm)
    if not final_norm:
        module.norm = nn.Identity()
    return module.eval().requires_grad_(False)


def _check_report(report: dict, checkpoint: TargetModelDir, final_norm: bool) -> None:
    """Raise TargetLoadError unless every kept weight landed in the model and every
    parameter of the model (but the unread final norm) got one."""
    missing = sorted(
        key for key in report["missing_keys"] if final_norm or not key.startswith("norm.")
    )
    problems = {
        "parameters without a weight in the checkpoint": missing,
        "checkpoint weights the model has no place for": sorted(report["unexpected_keys"]),
        "weights of the wrong shape": sorted(str(key) for key in report["mismatched_keys"]),
    }
    found = {what: keys for what, keys in problems.items() if keys}
    if found:
        detail = "; ".join(f"{what}: {', '.join(keys[:4])}" for what, keys in found.items())
        raise TargetLoadError(
            f"{checkpoint.path}: the {checkpoint.model_type} weights do not match the model "
            f"transformers builds from config.json ({detail}); config and weights belong to "
            f"different models, or this transformers version converts them differently. "
            f"ringtrain refuses to run a target it cannot load exactly"
        )


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' own load report and progress bars: ringtrain checks the
    report itself and logs what it loads."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


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
