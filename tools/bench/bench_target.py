r"""Benchmark the target forward: tokens/s, MFU, first-call time, recompiles, peak memory.

Random-weight targets are built in memory from a config (no files), truncated after the
deepest of the 5 DFlash taps, and run through TargetRunner (pinned staging, side-stream
H2D) into a packed [N, K*H] output on the GPU ("device" out) and in pinned host memory
("host" out, the host-ring transport). Shapes:

- qwen3-8b: Qwen3-8B (36 layers, hidden 4096, 32 q / 8 kv heads of 128, MLP 12288,
  vocab 151936);
- qwen3-30b-a3b: Qwen3-30B-A3B (qwen3_moe: 48 layers, hidden 2048, 32 q / 4 kv heads of
  128, 128 experts of MLP 768, top-8, no shared expert), routed experts run by the
  experts implementation transformers picks (``experts_implementation`` in the JSON:
  "grouped_mm" runs all experts in grouped GEMMs, no Python loop over experts);
- qwen3.5-hybrid: transformers' Qwen3.5 text config defaults (Gated DeltaNet layers,
  3 linear : 1 full attention); FLA Triton kernels when flash-linear-attention is
  installed, else the torch fallback;
- qwen3.5-27b: Qwen3.5-27B's text decoder at full size (model_shapes.QWEN3_5_27B: 64
  layers, hidden 5120, Gated DeltaNet 16 / 48 heads of 128, attention 24 / 4 heads of
  256, MLP 17408, vocab 248320), the hybrid target class at its real size.

FLOPs (forward, per token): 2 x the weights a token is multiplied by in the kept layers
(every matrix outside expert stacks: linear layers and routers; of each mixture-of-experts
block's expert stacks only its top-k experts' share, the ACTIVE parameters), plus causal
attention 4 * q_heads * head_dim * (S+1)/2, plus for Gated DeltaNet layers the causal
convolution 2 * channels * kernel and the chunked delta-rule core, estimated as
v_heads * (6 * dk * dv + 2 * 64 * (dk + dv)) (chunk size 64). MFU = FLOPs/s / 989e12
(H200 dense bf16). Random router weights spread tokens about evenly over the experts.

Each shape runs eagerly and/or with its decoder layers compiled (``--compile``, as
``target.compile`` does: ringtrain.target.compiled); ``--moe-compile`` says whether the
compiled variants compile mixture-of-experts blocks too (``target.compile_moe``: "on",
the default, as the trainer does, with ringtrain's grouped experts where they fit
(ringtrain.target.moe_experts); "off" keeps them eager; "both" times the two side by
side, a "moe_compile" column and field; "experts" times the compiled blocks with
transformers' own grouped_mm experts ("transformers") against ringtrain's ("on")); the
first call of a compiled variant includes compilation. ``graph_breaks`` counts Dynamo's
graph breaks over the variant. Recompiles: after the measured shapes and a warm-up on a
single row and on more rows of other lengths, the graphs compiled while running three
further shapes (0 in steady state). ``--profile`` adds the top kernels of 3 steps of each
variant's first measurement.

    # every shape but the 27B, 8192 and 16384 tokens
    python -m tools.bench.bench_target --json
    python -m tools.bench.bench_target --shape qwen3-8b --tokens 9216 --seq-len 3072 \
        --json --profile
    python -m tools.bench.bench_target --shape qwen3-30b-a3b --tokens 9216 --seq-len 3072 \
        --compile on --json
    python -m tools.bench.bench_target --shape qwen3-30b-a3b --tokens 9216 --seq-len 3072 \
        --compile on --moe-compile both --json
    python -m tools.bench.bench_target --shape qwen3-30b-a3b --tokens 9216 --seq-len 3072 \
        --compile on --moe-compile experts --json
    python -m tools.bench.bench_target --device cpu --small --json  # smoke run without a GPU
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.metadata
import time

import numpy as np
import torch
import transformers
from torch import nn
from transformers import CONFIG_MAPPING, PretrainedConfig

from ringtrain.compile_caches import compiled_graph_count
from ringtrain.target.compiled import experts_implementation, is_mixture_of_experts
from ringtrain.target.linear_attention import (
    choose_linear_attention,
    linear_attention_backend,
    settle_linear_attention,
)
from ringtrain.target.loader import build_truncated_model, randomise_weights
from ringtrain.target.model_dir import truncated_config_values
from ringtrain.target.runner import TargetRunner
from ringtrain.target.tapped import TappedTarget
from ringtrain.target.taps import default_tap_layers
from tools.bench.bench_report import report_head, save_report
from tools.bench.gpu_timing import PEAK_BF16_FLOPS
from tools.bench.kernel_profile import print_top, top_kernels
from tools.bench.model_shapes import QWEN3_5_27B, QWEN3_8B, QWEN3_30B_A3B

NUM_TAPS = 5
GDN_CHUNK = 64
# --compile: which variants run, eager (False) and/or compiled (True).
COMPILE_VARIANTS = {"off": (False,), "on": (True,), "both": (False, True)}
# --moe-compile: for compiled variants, whether mixture-of-experts blocks compile too
# ("on": with ringtrain's grouped experts, as the trainer does; "transformers": with
# transformers' own grouped_mm experts).
MOE_COMPILE_VARIANTS = {
    "off": ("off",),
    "on": ("on",),
    "both": ("off", "on"),
    "experts": ("transformers", "on"),
}
SHAPES: dict[str, tuple[str, dict]] = {
    "qwen3-8b": ("qwen3", {**QWEN3_8B, "max_position_embeddings": 40960}),
    "qwen3-30b-a3b": ("qwen3_moe", {**QWEN3_30B_A3B, "max_position_embeddings": 40960}),
    "qwen3.5-hybrid": ("qwen3_5_text", {}),
    "qwen3.5-27b": ("qwen3_5_text", {**QWEN3_5_27B, "max_position_embeddings": 262144}),
}
# Shapes run when --shape names none: all but the 27B hybrid (about 54 GB of weights),
# which runs when named.
DEFAULT_SHAPES = ("qwen3-8b", "qwen3-30b-a3b", "qwen3.5-hybrid")
# --small: the same model types at toy size, for a CPU smoke run.
SMALL_SIZES = {
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
SMALL: dict[str, dict] = {
    "qwen3-8b": SMALL_SIZES,
    "qwen3-30b-a3b": {
        **SMALL_SIZES,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
    },
    "qwen3.5-hybrid": {
        **SMALL_SIZES,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
    },
}
SMALL["qwen3.5-27b"] = SMALL["qwen3.5-hybrid"]


def build_config(shape: str, small: bool) -> PretrainedConfig:
    """The full (untruncated) text config of a benchmark shape."""
    model_type, values = SHAPES[shape]
    if small:
        values = {**values, **SMALL[shape]}
    return CONFIG_MAPPING[model_type](**values)


def expert_stacks(layers: nn.Module) -> list[nn.Module]:
    """The expert modules of the mixture-of-experts blocks among ``layers`` (the ``experts``
    of a block; transformers 5 holds them as fused [experts, out, in] parameters)."""
    return [m.experts for m in layers.modules() if is_mixture_of_experts(m)]


def active_matmul_params(layers: nn.Module, top_k: int) -> float:
    """Weights one token is multiplied by in ``layers``: every matrix (2-D parameter:
    linear layers, routers) outside expert stacks, and ``top_k / num_experts`` of the
    matrices in each block's expert stacks (fused 3-D stacks or per-expert linears)."""
    total = 0.0
    in_experts: set[int] = set()
    for experts in expert_stacks(layers):
        count = getattr(experts, "num_experts", None) or len(experts)
        matrices = [
            p for name, p in experts.named_parameters() if p.ndim >= 2 and "bias" not in name
        ]
        total += sum(p.numel() for p in matrices) * top_k / count
        in_experts.update(id(p) for p in experts.parameters())
    for param in layers.parameters():
        if param.ndim == 2 and id(param) not in in_experts:
            total += param.numel()
    return total


def routed_experts_implementation(module: nn.Module) -> str | None:
    """How the routed experts run (transformers' "grouped_mm", "batched_mm" or "eager": a
    Python loop over experts; "ringtrain_grouped_mm" once the compiled blocks took
    ringtrain's), None for a model without mixture-of-experts blocks."""
    stacks = expert_stacks(module.layers)
    if not stacks:
        return None
    return experts_implementation(stacks[0]) or "eager"


def flops_per_token(config: PretrainedConfig, module: nn.Module, seq_len: int) -> float:
    """Forward FLOPs per token of the kept layers (see the module docstring)."""
    top_k = getattr(config, "num_experts_per_tok", 0)
    total = 2.0 * active_matmul_params(module.layers, top_k)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for layer_type in getattr(config, "layer_types", None) or ["full_attention"] * len(
        module.layers
    ):
        if layer_type == "linear_attention":
            dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
            heads_v, heads_k = config.linear_num_value_heads, config.linear_num_key_heads
            channels = 2 * heads_k * dk + heads_v * dv
            total += 2 * channels * config.linear_conv_kernel_dim
            total += heads_v * (6 * dk * dv + 2 * GDN_CHUNK * (dk + dv))
        else:
            total += 4 * config.num_attention_heads * head_dim * (seq_len + 1) / 2
    return total


def padded_batch(rows: int, seq_len: int, vocab_size: int) -> object:
    """A full [rows, seq_len] batch (no padding) with random token ids."""
    rng = np.random.default_rng(0)

    class Batch:
        input_ids = rng.integers(0, vocab_size, size=(rows, seq_len), dtype=np.int64)
        attention_mask = np.ones((rows, seq_len), dtype=np.int64)

    return Batch()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(runner: TargetRunner, batch: object, out: torch.Tensor) -> None:
    """One prefetch and forward (not overlapped)."""
    runner.prefetch(batch)
    runner.forward_into(out)


def measure(
    runner: TargetRunner, batch: object, out: torch.Tensor, iters: int, device: torch.device
) -> tuple[float, float]:
    """(first call seconds, mean seconds per step over ``iters`` steps after warm-up)."""
    started = time.perf_counter()
    run_once(runner, batch, out)
    synchronize(device)
    first_call = time.perf_counter() - started
    for _ in range(2):
        run_once(runner, batch, out)
    synchronize(device)
    started = time.perf_counter()
    runner.prefetch(batch)
    for step in range(iters):
        runner.forward_into(out)
        if step + 1 < iters:
            runner.prefetch(batch)
    synchronize(device)
    return first_call, (time.perf_counter() - started) / iters


def run_shapes(
    runner: TargetRunner, shapes: list[tuple[int, int]], vocab_size: int, device: torch.device
) -> None:
    """One forward of a full random batch of each (rows, length) shape."""
    target = runner.target
    for rows, length in shapes:
        out = torch.empty(rows * length, target.tap_width, dtype=target.dtype, device=device)
        run_once(runner, padded_batch(rows, length, vocab_size), out)
    synchronize(device)


def recompiles_over_shapes(
    runner: TargetRunner, rows: int, seq_len: int, vocab_size: int, device: torch.device
) -> int:
    """Graphs compiled by three further shapes after a warm-up on two others.

    The warm-up adds one row and more rows than measured (Dynamo specialises sizes of 1);
    no shape has more tokens than ``rows * seq_len``.
    """
    half = max(2, seq_len // 2)
    run_shapes(runner, [(1, half + 1), (rows + 1, half)], vocab_size, device)
    before = compiled_graph_count()
    further = [(2, seq_len * 3 // 8 + 5), (1, seq_len // 3 + 7), (rows + 2, seq_len // 4 + 3)]
    run_shapes(runner, further, vocab_size, device)
    return compiled_graph_count() - before


def build_target(
    config: PretrainedConfig, taps: list[int], device: torch.device, compiled: bool, moe: str
) -> tuple[TappedTarget, float]:
    """A random-weight target truncated after its deepest tap (layers compiled: with
    mixture-of-experts blocks where ``moe``), and its build seconds."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    truncated = CONFIG_MAPPING[config.model_type].from_dict(
        truncated_config_values(config.to_dict(), max(taps) + 1)
    )
    backend = choose_linear_attention(config, device)
    started = time.perf_counter()
    module = build_truncated_model(truncated, device, dtype)
    torch.manual_seed(0)
    randomise_weights(module)
    synchronize(device)
    backend = settle_linear_attention(module, backend, "auto", device)
    target = TappedTarget(module, config, taps, device, dtype, backend)
    if compiled:
        torch._dynamo.reset()
        target.compile_layers(moe=moe != "off", grouped_experts=moe == "on")
    return target, time.perf_counter() - started


def describe_target(
    shape: str, config: PretrainedConfig, target: TappedTarget, backend: str | None, moe: str
) -> dict:
    """The facts of a built target that every result row of its variant repeats."""
    module = target.module
    top_k = getattr(config, "num_experts_per_tok", 0)
    return {
        "shape": shape,
        "compile": "on" if target.compiled_units else "off",
        "moe_compile": moe if target.compiled_units else "off",
        "model_type": config.model_type,
        "layers_kept": len(module.layers),
        "layers_total": config.num_hidden_layers,
        "taps": target.tap_layers,
        "hidden_size": config.hidden_size,
        "linear_attention": backend,
        "experts_implementation": routed_experts_implementation(module),
        "active_params_per_token_m": round(active_matmul_params(module.layers, top_k) / 1e6, 1),
        "compiled_units": len(target.compiled_units),
        "weights_gib": round(sum(p.nbytes for p in module.parameters()) / 2**30, 2),
    }


def measure_placement(
    runner: TargetRunner, batch: object, placement: str, args: argparse.Namespace
) -> tuple[dict, torch.Tensor]:
    """Time one batch into a GPU ("device") or pinned host ("host") output; the timings
    and the output buffer."""
    target, device = runner.target, runner.device
    rows, seq_len = batch.input_ids.shape
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    out_device = device if placement == "device" else torch.device("cpu")
    out = torch.empty(
        rows * seq_len,
        target.tap_width,
        dtype=target.dtype,
        device=out_device,
        pin_memory=placement == "host",
    )
    first_call, step_s = measure(runner, batch, out, args.iters, device)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    flops = flops_per_token(target.module.config, target.module, seq_len) * rows * seq_len
    timings = {
        "tokens": rows * seq_len,
        "rows": rows,
        "seq_len": seq_len,
        "out": placement,
        "first_call_s": round(first_call, 3),
        "step_ms": round(step_s * 1e3, 3),
        "tokens_per_s": round(rows * seq_len / step_s),
        "tflops": round(flops / step_s / 1e12, 1),
        "mfu": round(flops / step_s / PEAK_BF16_FLOPS, 4),
        "peak_mem_gib": round(peak, 2),
    }
    return timings, out


def bench_variant(
    args: argparse.Namespace, shape: str, device: torch.device, compiled: bool, moe: str
) -> list[dict]:
    """All token counts and output placements of one shape, eager or compiled (with
    mixture-of-experts blocks where ``moe``)."""
    config = build_config(shape, args.small)
    taps = default_tap_layers(config.num_hidden_layers, NUM_TAPS)
    backend = linear_attention_backend(config, device)
    target, build_s = build_target(config, taps, device, compiled, moe)
    runner = TargetRunner(target)
    facts = {**describe_target(shape, config, target, backend, moe), "build_s": round(build_s, 2)}
    graphs_before, breaks_before = compiled_graph_count(), graph_break_count()
    results = []
    for tokens in args.tokens:
        rows = max(1, tokens // args.seq_len)
        batch = padded_batch(rows, min(args.seq_len, tokens), config.vocab_size)
        placements = ["device", "host"] if device.type == "cuda" else ["device"]
        for placement in placements:
            timings, out = measure_placement(runner, batch, placement, args)
            row = {**facts, **timings}
            if args.profile and not results:
                row["profile"] = top_kernels(functools.partial(run_once, runner, batch, out))
                title = f"target {shape}, compile {row['compile']}, {row['tokens']} tokens"
                print_top(title, row["profile"])
            results.append(row)
            del out
    first_rows = max(1, args.tokens[0] // args.seq_len)
    recompiles = recompiles_over_shapes(
        runner, first_rows, min(args.seq_len, args.tokens[0]), config.vocab_size, device
    )
    for row in results:
        row["graphs"] = compiled_graph_count() - graphs_before
        row["recompiles"] = recompiles
        row["graph_breaks"] = graph_break_count() - breaks_before
    # The compiled forwards and the tap hooks hold the target in reference cycles: collect
    # them, or the next variant's peak memory counts this one's weights too.
    del runner, target
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def graph_break_count() -> int:
    """Graph breaks Dynamo has taken so far in this process (each splits a compiled unit)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def versions() -> dict[str, str | None]:
    """The versions of the libraries a target's forward runs on, beside torch's."""
    try:
        fla = importlib.metadata.version("flash-linear-attention")
    except importlib.metadata.PackageNotFoundError:
        fla = None
    return {
        "transformers": transformers.__version__,
        "flash_linear_attention": fla,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append")
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--seq-len", type=int, default=2048, help="padded row length")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--compile",
        choices=sorted(COMPILE_VARIANTS),
        help="compile the decoder layers: off, on or both (default: both on CUDA, off on CPU)",
    )
    parser.add_argument(
        "--moe-compile",
        choices=sorted(MOE_COMPILE_VARIANTS),
        default="on",
        help="compiled variants: compile mixture-of-experts blocks too (as target.compile_moe "
        "does by default): on, off, both (off and on) or experts (transformers' experts and on)",
    )
    parser.add_argument("--small", action="store_true", help="toy sizes (CPU smoke run)")
    parser.add_argument("--profile", action="store_true", help="top kernels of 3 steps")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    compile_variants = COMPILE_VARIANTS[
        args.compile or ("both" if device.type == "cuda" else "off")
    ]
    variants = [
        (compiled, moe)
        for compiled in compile_variants
        for moe in (MOE_COMPILE_VARIANTS[args.moe_compile] if compiled else ("off",))
    ]
    results = []
    for shape in args.shape or DEFAULT_SHAPES:
        for compiled, moe in variants:
            results.extend(bench_variant(args, shape, device, compiled, moe))

    print(
        f"{'shape':<15} {'compile':<7} {'moe':<12} {'tokens':>6} "
        f"{'out':<6} {'tok/s':>9} {'mfu':>6} "
        f"{'first s':>8} {'recomp':>6} {'peak GiB':>8} experts"
    )
    for r in results:
        print(
            f"{r['shape']:<15} {r['compile']:<7} {r['moe_compile']:<12} {r['tokens']:>6} "
            f"{r['out']:<6} "
            f"{r['tokens_per_s']:>9} {r['mfu']:>6.3f} {r['first_call_s']:>8.2f} "
            f"{r['recompiles']:>6} {r['peak_mem_gib']:>8.2f} {r['experts_implementation'] or '-'}"
        )
    report = {**report_head("bench_target", device), **versions(), "results": results}
    save_report(report, "bench_target", args.json)


if __name__ == "__main__":
    main()
