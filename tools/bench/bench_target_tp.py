"""Benchmark a tensor-parallel target group of two against one GPU: tokens/s and efficiency.

Run with two processes, one per GPU::

    torchrun --nproc-per-node 2 tools/bench/bench_target_tp.py --json
    torchrun --nproc-per-node 2 tools/bench/bench_target_tp.py --shape tiny --device cpu --json

Shape ``qwen3-32b``: Qwen3-32B (64 layers, hidden 5120, 64 query / 8 key-value heads of
128, MLP 25600), random bf16 weights built in memory from the config (as
tools/bench/bench_target.py does), truncated after the deepest of the 5 DFlash taps (layer
61), decoder layers compiled as ``target.compile`` does (``--compile``: auto compiles on
CUDA only). ``tiny``: the same model type at toy size, for a CPU smoke run over gloo
(float32).

First rank 0 alone runs the whole target (TP=1) while rank 1 waits; then both run it as
one group (``ringtrain.target.parallel``: attention and MLP split over the two, their
outputs all-reduced), every member on the same batch. Prints
``target_tp1_tokens_per_s``, ``target_tp2_tokens_per_s`` (the group's tokens/s: each
batch's tokens once) and ``target_tp2_efficiency`` = TP=2 / (2 x TP=1), then where a
TP=2 step's time goes on rank 0 (torch.profiler over 3 steps): all-reduce kernels (NCCL;
gloo's all-reduce on CPU) against the rest, per step and per layer. The full JSON goes to
``$OUT/bench_target_tp.json`` when OUT is set.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os

import torch
import torch.distributed as dist
from transformers import CONFIG_MAPPING, PretrainedConfig

from ringtrain.target.compiled import COMPILE_SETTINGS, resolve_compile
from ringtrain.target.parallel import shard_target
from ringtrain.target.runner import TargetRunner
from ringtrain.target.tapped import TappedTarget
from ringtrain.target.taps import default_tap_layers
from tools.bench.bench_report import report_head, save_report
from tools.bench.bench_target import (
    SMALL_SIZES,
    build_target,
    measure,
    padded_batch,
    run_once,
    versions,
)
from tools.bench.kernel_profile import top_kernels
from tools.bench.model_shapes import QWEN3_32B

NUM_TAPS = 5
SHAPES = {
    "qwen3-32b": {**QWEN3_32B, "max_position_embeddings": 40960},
    "tiny": SMALL_SIZES,
}
COLLECTIVE_NAMES = ("nccl", "allreduce", "all_reduce")


def init_group(device_type: str) -> tuple[dist.ProcessGroup, torch.device]:
    """The torchrun job's two ranks as one group (NCCL on CUDA, gloo on CPU) and this
    rank's device."""
    if device_type == "cuda":
        local_rank = int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=30))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    if dist.get_world_size() != 2:
        raise SystemExit("run with two processes: torchrun --nproc-per-node 2 ...")
    return dist.new_group([0, 1]), device


def measured(target: TappedTarget, args: argparse.Namespace) -> tuple[dict, functools.partial]:
    """Timings of the benchmark batch, and one step of it (for the profiler)."""
    runner = TargetRunner(target)
    rows = max(1, args.tokens // args.seq_len)
    batch = padded_batch(rows, args.seq_len, target.vocab_size)
    out = torch.empty(
        rows * args.seq_len, target.tap_width, dtype=target.dtype, device=target.device
    )
    if target.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(target.device)
    first_call, step_s = measure(runner, batch, out, args.iters, target.device)
    peak = torch.cuda.max_memory_allocated(target.device) if target.device.type == "cuda" else 0
    timings = {
        "tokens": rows * args.seq_len,
        "first_call_s": round(first_call, 3),
        "step_ms": round(step_s * 1e3, 3),
        "tokens_per_s": round(rows * args.seq_len / step_s),
        "weights_gib": round(sum(local_bytes(p) for p in target.module.parameters()) / 2**30, 2),
        "peak_mem_gib": round(peak / 2**30, 2),
    }
    return timings, functools.partial(run_once, runner, batch, out)


def local_bytes(param: torch.Tensor) -> int:
    """Bytes this rank holds of a parameter (its shard of a split one)."""
    return getattr(param, "_local_tensor", param).nbytes


def collective_split(step: functools.partial, layers: int) -> dict:
    """Device time of 3 profiled steps split into all-reduce kernels and the rest."""
    rows = [
        r
        for r in top_kernels(step, steps=3, top=10**6)
        if r["kernel"] not in ("all kernels", "other")
    ]
    collective = [r for r in rows if any(n in r["kernel"].lower() for n in COLLECTIVE_NAMES)]
    reduce_ms = sum(r["ms_per_step"] for r in collective)
    compute_ms = sum(r["ms_per_step"] for r in rows) - reduce_ms
    return {
        "allreduce_ms_per_step": round(reduce_ms, 3),
        "compute_ms_per_step": round(compute_ms, 3),
        "allreduce_ms_per_layer": round(reduce_ms / layers, 4),
        "compute_ms_per_layer": round(compute_ms / layers, 4),
        "allreduce_calls_per_step": round(sum(r["calls_per_step"] for r in collective), 1),
        "allreduce_share": round(reduce_ms / max(reduce_ms + compute_ms, 1e-9), 4),
    }


def run_tp1(config: PretrainedConfig, taps: list[int], device: torch.device, args) -> dict:
    """The whole target on this rank alone."""
    target, _ = build_target(config, taps, device, args.compile, moe="on")
    timings, _ = measured(target, args)
    del target
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return timings


def run_tp2(config: PretrainedConfig, taps: list[int], group, device, args) -> dict:
    """The target split over the group; timings and the all-reduce/compute split."""
    target, _ = build_target(config, taps, device, compiled=False, moe="off")
    shard_target(target.module, group, device)
    if args.compile:
        torch._dynamo.reset()
        target.compile_layers()
    timings, step = measured(target, args)
    return {**timings, "profile": collective_split(step, len(target.module.layers))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-32b")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per batch")
    parser.add_argument("--seq-len", type=int, default=2048, help="padded row length")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--compile",
        choices=COMPILE_SETTINGS,
        default="auto",
        help="compile the decoder layers as target.compile does (auto: on CUDA only)",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    args.compile = resolve_compile(args.compile, torch.device(args.device))
    group, device = init_group(args.device)
    rank = dist.get_rank()
    config = CONFIG_MAPPING["qwen3"](**SHAPES[args.shape])
    taps = default_tap_layers(config.num_hidden_layers, NUM_TAPS)
    tp1 = run_tp1(config, taps, device, args) if rank == 0 else None
    dist.barrier(group)
    tp2 = run_tp2(config, taps, group, device, args)
    if rank == 0:
        report(args, config, taps, device, tp1, tp2)
    dist.destroy_process_group()


def report(args, config: PretrainedConfig, taps: list[int], device, tp1: dict, tp2: dict) -> None:
    """The short table, the JSON file under $OUT and (``--json``) the JSON line."""
    profile = tp2["profile"]
    result = {
        **report_head("bench_target_tp", device),
        **versions(),
        "shape": args.shape,
        "layers_kept": max(taps) + 1,
        "layers_total": config.num_hidden_layers,
        "taps": taps,
        "seq_len": args.seq_len,
        "compiled": args.compile,
        "target_tp1_tokens_per_s": tp1["tokens_per_s"],
        "target_tp2_tokens_per_s": tp2["tokens_per_s"],
        "target_tp2_efficiency": round(tp2["tokens_per_s"] / (2 * tp1["tokens_per_s"]), 4),
        "tp1": tp1,
        "tp2": tp2,
    }
    print(
        f"{'group':<6} {'tokens':>6} {'tok/s':>9} {'step ms':>9} "
        f"{'weights GiB':>11} {'peak GiB':>8}"
    )
    for name, row in (("TP=1", tp1), ("TP=2", tp2)):
        print(
            f"{name:<6} {row['tokens']:>6} {row['tokens_per_s']:>9} {row['step_ms']:>9.2f} "
            f"{row['weights_gib']:>11.2f} {row['peak_mem_gib']:>8.2f}"
        )
    print(
        f"efficiency {result['target_tp2_efficiency']:.3f}; TP=2 per layer: all-reduce "
        f"{profile['allreduce_ms_per_layer']:.3f} ms, "
        f"compute {profile['compute_ms_per_layer']:.3f} "
        f"ms ({100 * profile['allreduce_share']:.1f}% of device time in all-reduce, "
        f"{profile['allreduce_calls_per_step']:.0f} calls per step)"
    )
    save_report(result, "bench_target_tp", args.json)


if __name__ == "__main__":
    main()
