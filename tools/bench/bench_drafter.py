r"""Benchmark one drafter training step: forward + backward + optimiser, MFU, memory, recompiles.

Default shape: a Qwen3-8B-shaped drafter (hidden 4096, 5 layers, 32 query / 8 KV heads of
128, MLP 12288, vocabulary 151936, 5 taps) with a random frozen head, on packed batches of
3 x 3072-token documents with 512 anchors per 3072 tokens and blocks of 16
(``--target-shape qwen3-30b-a3b``: the drafter of Qwen3-30B-A3B, hidden 2048, 32 query /
4 KV heads of 128, MLP 6144; ``qwen3-32b``: hidden 5120, 64 query / 8 KV heads, MLP
25600; ``smollm2-135m``: the real-model recipe's drafter, 4 layers of hidden 576, 9 query
/ 3 KV heads of 64, MLP 1536, vocabulary 49152, on 32 x 512-token documents with 128
anchors per 512 tokens, as configs/smollm2-135m.toml trains it). After warm-up, two timed
sets of 20 steps each, with 1-6 documents of random lengths per batch (the recipe's shape:
documents of 64 to 1,024 tokens, its `data.max_len`, as many as fill the batch; set by
``--longest-doc``, 0 for the 1-6 documents):
"packed" batches filled to 97-100% of the token budget, as the data pipeline packs them
(padding fraction about 1.5%), give tokens/s (context tokens) and MFU; "varied" batches
filled to only 60-100% give `mfu_varied_fill` (the drafter runs at a static layout, so
the unfilled part is computed and not counted). The compiled-graph counter must not move
over both sets (recompiles == 0).

Model FLOPs are counted explicitly per step from the real (non-padding) blocks: block-token
projections and MLP, context K/V projections, fc, attention over the (query, key) pairs the
mask allows, and the LM head over slots 1..B-1. Trainable matmuls count 3x their forward
(forward, input grad, weight grad); fc and the frozen LM head count 2x (one of the two
gradients is not needed); attention counts 3x.

Optimiser-step variants (drafter/optim.py's optimizer_step switches, otherwise "base"):
"grads_none" frees the gradients after the step instead of zeroing them, "clip_in_step"
clips and skips inside the fused AdamW kernel, "fast_step" does both; "final_loss" shows
they train alike. "cudagraphs" is fast_step with the compiled parts replayed as CUDA
graphs (compile mode "reduce-overhead"); "muon" is fast_step's switches with Muon on the
layers' matrices; "dflash2" is fast_step's switches with the DFlash2 drafter (its
dynamic convolutions and candidate selector: work the model FLOPs above do not count, so
its MFU is DFlash's work over DFlash2's time and its tokens/s ratio is the cost);
"default" is what the config's defaults train (DFlash2, D-PACE, Muon); "_graphs" names
replay a variant's compiled parts as CUDA graphs, "_chunk16k" forms the loss over
16,384-row chunks (the real recipe's loss_chunk), "_read" reads the step's sums on the
host between forward and backward, as the trainer's reduction of them does (what that
wait for the GPU costs a step). Every other
variant trains the paper's drafter and objective (DFlash, decayed cross-entropy).

    python -m tools.bench.bench_drafter --json                        # H200, default variant
    python -m tools.bench.bench_drafter --json --variants all         # + loss_chunk / compile modes
    python -m tools.bench.bench_drafter --json --profile              # + top kernels of 3 steps
    python -m tools.bench.bench_drafter --json --variants base,fast_step,cudagraphs,muon --steps 10
    python -m tools.bench.bench_drafter --json --variants fast_step,dflash2 --profile \
        --profile-top 500
                                     # + every kernel, and what dflash2 runs beyond fast_step
    python -m tools.bench.bench_drafter --json --target-shape smollm2-135m --gaps
                                     # + where the GPU idles in a step, by code
    python -m tools.bench.bench_drafter --json --target-shape smollm2-135m \
        --variants fast_step,dflash2,default
    python -m tools.bench.bench_drafter --json --target-shape smollm2-135m \
        --variants default --batch-docs 64
                                     # a batch of 64 documents (32,768 tokens) instead of 32
    python -m tools.bench.bench_drafter --device cpu --small --json   # smoke run on a CPU
"""

from __future__ import annotations

import argparse
import gc
import time
import traceback
from dataclasses import replace

import torch

from ringtrain.compile_caches import compiled_graph_count
from ringtrain.drafter import (
    FrozenHead,
    block_objective,
    build_drafter,
    build_optimizer,
    drafter_spec_from_target,
    optimizer_step,
)
from ringtrain.drafter.blocks import build_blocks, layout_sizes
from ringtrain.drafter.config import PAPER_DRAFTER, PAPER_OPTIM, DrafterConfig, OptimConfig
from ringtrain.drafter.spec import DrafterSpec
from ringtrain.packed_batch import PackedBatch
from ringtrain.target.taps import default_tap_layers
from tools.bench.bench_report import report_head, save_report
from tools.bench.drafter_batches import make_batches
from tools.bench.gpu_gaps import idle_gaps, print_gaps
from tools.bench.gpu_timing import PEAK_BF16_FLOPS
from tools.bench.kernel_profile import kernel_diff, print_diff, print_top, top_kernels
from tools.bench.model_shapes import (
    QWEN3_8B,
    QWEN3_30B_A3B,
    QWEN3_32B,
    QWEN3_MASK_TOKEN_ID,
    SMOLLM2_135M,
    SMOLLM2_MASK_TOKEN_ID,
)

PEAK_FLOPS = {"cuda": PEAK_BF16_FLOPS}
# --target-shape: the target whose drafter is benchmarked; the drafter takes its hidden
# size, heads, MLP width and vocabulary from it.
TARGETS = {
    name: {**shape, "rms_norm_eps": 1e-6, "rope_theta": 1e6}
    for name, shape in (
        ("qwen3-8b", QWEN3_8B),
        ("qwen3-30b-a3b", QWEN3_30B_A3B),
        ("qwen3-32b", QWEN3_32B),
        ("smollm2-135m", SMOLLM2_135M),
    )
}
MASK_TOKEN_IDS = {"smollm2-135m": SMOLLM2_MASK_TOKEN_ID}
# The batch layout per target shape where it is not the default (5 layers; 3 documents
# of 3072 tokens, 512 anchors each; measured batches of 1-6 documents): the real-model
# recipe's, whose documents are at most its data.max_len long.
LAYOUTS = {
    "smollm2-135m": {"layers": 4, "docs": 32, "doc_len": 512, "anchors": 128, "longest": 1024}
}
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
}
# The optimiser-step switches of "fast_step", which the variants after it start from.
FAST_STEP = {
    "loss_chunk": 4096,
    "compile_mode": "default",
    "grads_to_none": True,
    "clip_in_step": True,
}
# Drafter settings of each variant, and how it steps the optimiser (optimizer_step's
# switches; "base": clip then step, gradients zeroed in place).
VARIANTS = {
    "base": {"loss_chunk": 4096, "compile_mode": "default"},
    "chunk2048": {"loss_chunk": 2048, "compile_mode": "default"},
    "chunk8192": {"loss_chunk": 8192, "compile_mode": "default"},
    "autotune": {"loss_chunk": 4096, "compile_mode": "max-autotune-no-cudagraphs"},
    "grads_none": {"loss_chunk": 4096, "compile_mode": "default", "grads_to_none": True},
    "clip_in_step": {"loss_chunk": 4096, "compile_mode": "default", "clip_in_step": True},
    "fast_step": FAST_STEP,
    # fast_step with the compiled drafter and loss replayed as CUDA graphs (the layout is
    # static per token budget): no host launch gaps.
    "cudagraphs": {**FAST_STEP, "compile_mode": "reduce-overhead"},
    # fast_step's switches with Muon on the layers' matrices (optim.name = "muon"; the
    # clip is then a pass of its own, its norm read before the step).
    "muon": {**FAST_STEP, "optim": "muon"},
    # fast_step's switches with the DFlash2 drafter (drafter.architecture = "dflash2").
    "dflash2": {**FAST_STEP, "architecture": "dflash2"},
    # fast_step's switches with the config's defaults (DFlash2, D-PACE, Muon).
    "default": {
        **FAST_STEP,
        **{key: getattr(DrafterConfig(), key) for key in PAPER_DRAFTER},
        "optim": OptimConfig().name,
    },
}
# The defaults' step with its compiled parts replayed as CUDA graphs, and with larger loss
# chunks (fewer, larger LM-head and cross-entropy launches on small drafters).
VARIANTS["default_graphs"] = {**VARIANTS["default"], "compile_mode": "reduce-overhead"}
VARIANTS["default_chunk16k"] = {**VARIANTS["default"], "loss_chunk": 16384}
VARIANTS["default_graphs_chunk16k"] = {**VARIANTS["default_graphs"], "loss_chunk": 16384}
VARIANTS["dflash2_graphs"] = {**VARIANTS["dflash2"], "compile_mode": "reduce-overhead"}
# DFlash and DFlash2 each at the real recipe's loss chunk (its config's loss_chunk).
VARIANTS["fast_step_chunk16k"] = {**FAST_STEP, "loss_chunk": 16384}
VARIANTS["dflash2_chunk16k"] = {**VARIANTS["dflash2"], "loss_chunk": 16384}
# The switch that reads the step's sums on the host after the forward pass.
READ_SUMS = "read_sums"
VARIANTS["default_chunk16k_read"] = {**VARIANTS["default_chunk16k"], READ_SUMS: True}
VARIANTS["fast_step_read"] = {**FAST_STEP, READ_SUMS: True}
STEP_SWITCHES = ("grads_to_none", "clip_in_step")


def log(message: str) -> None:
    """A timestamped progress line (before the table and the final JSON line)."""
    print(f"[bench_drafter {time.strftime('%H:%M:%S')}] {message}", flush=True)


def step_flops(
    spec: DrafterSpec,
    batch: PackedBatch,
    cfg: DrafterConfig,
    max_tokens: int,
    generator_state: torch.Tensor,
) -> float:
    """Model FLOPs of one training step on `batch` (see the module docstring).

    The anchors are drawn again from the generator state the step started with, so the
    blocks and mask are exactly the step's own.
    """
    generator = torch.Generator(batch.hidden.device)
    generator.set_state(generator_state)
    blocks = build_blocks(
        replace(batch, hidden=batch.hidden[:, :1]),
        generator,
        cfg,
        spec.mask_token_id,
        *layout_sizes(cfg, max_tokens),
    )
    valid = blocks.valid
    num_blocks = int(valid.sum())
    visible = int(((blocks.ctx_hi - blocks.ctx_lo)[valid] + cfg.block_size).sum()) * cfg.block_size
    hidden, q_width = spec.hidden_size, spec.num_attention_heads * spec.head_dim
    kv_width = spec.num_key_value_heads * spec.head_dim
    block_tokens, ctx_tokens = num_blocks * cfg.block_size, batch.num_tokens
    per_layer = (
        2 * block_tokens * hidden * (2 * q_width)  # q_proj, o_proj
        + 2 * (block_tokens + ctx_tokens) * hidden * (2 * kv_width)  # k_proj, v_proj
        + 2 * block_tokens * hidden * 3 * spec.intermediate_size  # gate, up, down
        + 2 * 2 * visible * spec.head_dim * spec.num_attention_heads  # QK^T, PV
    )
    fc = 2 * ctx_tokens * spec.num_taps * hidden * hidden
    lm_head = 2 * num_blocks * (cfg.block_size - 1) * hidden * spec.vocab_size
    return 3 * spec.num_layers * per_layer + 2 * fc + 2 * lm_head


class VariantRun:
    """A fresh drafter, head and optimiser for one variant, and its timed training steps."""

    def __init__(self, overrides: dict, args: argparse.Namespace, device: torch.device) -> None:
        target = TINY if args.small else TARGETS[args.target_shape]
        self.step_switches = {k: v for k, v in overrides.items() if k in STEP_SWITCHES}
        self.read_sums = overrides.get(READ_SUMS, False)
        optimizer = overrides.get("optim", PAPER_OPTIM["name"])
        own = (*STEP_SWITCHES, "optim", READ_SUMS)
        overrides = {k: v for k, v in overrides.items() if k not in own}
        mask_token_id = MASK_TOKEN_IDS.get(args.target_shape, QWEN3_MASK_TOKEN_ID)
        self.cfg = DrafterConfig(
            num_layers=args.layers, block_size=args.block, num_anchors=args.anchors,
            anchor_ref_len=args.doc_len, mask_token_id=-1 if args.small else mask_token_id,
            compile=device.type == "cuda", **{**PAPER_DRAFTER, **overrides},
        )  # fmt: skip
        taps = default_tap_layers(target["num_hidden_layers"], 5)
        self.spec = drafter_spec_from_target(target, self.cfg, taps)
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.device, self.max_tokens = device, args.max_tokens
        torch.manual_seed(0)
        self.model = build_drafter(self.spec).to(device)
        self.head = FrozenHead.random(
            self.spec.vocab_size, self.spec.hidden_size, device, self.dtype
        )
        self.optim_cfg = OptimConfig(name=optimizer)
        self.optimizer, self.scheduler = build_optimizer(
            self.model, self.optim_cfg, total_steps=10_000
        )
        self.generator = torch.Generator(device).manual_seed(0)

    def forward(self, batch: PackedBatch):
        """The step's forward pass: the block objective's sums."""
        return block_objective(
            self.model, self.head, batch, self.generator, self.cfg, max_tokens=self.max_tokens
        )

    def finish(self, sums) -> torch.Tensor:
        """The step's backward pass and optimiser step; the loss."""
        if self.read_sums:
            sums.weight_sum.item()
        (sums.loss_sum / sums.weight_sum.clamp(min=1e-6)).backward()
        optimizer_step(
            self.model, self.optimizer, self.scheduler, self.optim_cfg, **self.step_switches
        )
        return sums.loss_sum.detach() / sums.weight_sum

    def step(self, batch: PackedBatch) -> torch.Tensor:
        """One training step; the loss."""
        return self.finish(self.forward(batch))

    def memory(self, batch: PackedBatch) -> dict:
        """GiB above the memory held between steps (CUDA): after the forward pass (what
        backward keeps), the forward's peak and the whole step's peak."""
        self.sync()
        held = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        sums = self.forward(batch)
        self.sync()
        saved = torch.cuda.memory_allocated(self.device) - held
        forward_peak = torch.cuda.max_memory_allocated(self.device) - held
        self.finish(sums)
        self.sync()
        step_peak = torch.cuda.max_memory_allocated(self.device) - held
        return {
            "held_gib": held / 2**30,
            "saved_for_backward_gib": saved / 2**30,
            "forward_peak_gib": forward_peak / 2**30,
            "step_peak_gib": step_peak / 2**30,
        }

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def warm_up(self, name: str, batches: list[PackedBatch]) -> None:
        for i, batch in enumerate(batches):
            log(f"{name}: warm-up step {i + 1}/{len(batches)} (docs {batch.num_docs}, "
                f"{batch.num_tokens} tokens)"
                f"{' (compiles on CUDA: minutes)' if i == 0 else ''}")  # fmt: skip
            began = time.perf_counter()
            loss = self.step(batch)
            self.sync()
            log(f"{name}: warm-up step {i + 1} took {time.perf_counter() - began:.1f} s, "
                f"loss {float(loss):.3f}")  # fmt: skip

    def timed(self, batches: list[PackedBatch]) -> tuple[float, float, float, float]:
        """(step seconds, context tokens, model FLOPs) per step, means over `batches`, and
        the last step's loss."""
        self.sync()
        states = []
        began = time.perf_counter()
        for batch in batches:
            states.append(self.generator.get_state())
            loss = self.step(batch)
        self.sync()
        step_s = (time.perf_counter() - began) / len(batches)
        flops = sum(
            step_flops(self.spec, b, self.cfg, self.max_tokens, state)
            for b, state in zip(batches, states, strict=True)
        )
        tokens = sum(b.num_tokens for b in batches) / len(batches)
        return step_s, tokens, flops / len(batches), float(loss)


def run_variant(name: str, overrides: dict, args, device: torch.device) -> dict:
    """Build a fresh drafter for one variant, warm up, then time the measured steps."""
    run = VariantRun(overrides, args, device)
    warm, packed, varied = make_batches(args, run.spec, device, run.dtype)
    run.warm_up(name, warm)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    graphs_before = compiled_graph_count()
    log(f"{name}: timing {len(packed)} packed steps")
    step_s, tokens, flops, final_loss = run.timed(packed)
    log(f"{name}: timing {len(varied)} varied-fill steps")
    varied_s, _, varied_flops, _ = run.timed(varied)
    recompiles = compiled_graph_count() - graphs_before
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    memory = run.memory(packed[0]) if device.type == "cuda" else {}
    profile = {}
    if args.profile:
        profile["profile"] = top_kernels(lambda: run.step(packed[0]), top=args.profile_top)
        print_top(f"drafter step, variant {name}", profile["profile"])
    if args.gaps:
        profile["gaps"] = idle_gaps(lambda: run.step(packed[0]))
        print_gaps(f"drafter step, variant {name}", profile["gaps"])
    peak_flops = PEAK_FLOPS.get(device.type)
    return {
        "variant": name,
        **overrides,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "tflops_per_s": flops / step_s / 1e12,
        "mfu": flops / step_s / peak_flops if peak_flops else None,
        "mfu_varied_fill": varied_flops / varied_s / peak_flops if peak_flops else None,
        "mean_fill": tokens / args.max_tokens,
        "model_tflop_per_step": flops / 1e12,
        "peak_mem_gib": peak,
        **memory,
        "recompiles": recompiles,
        "final_loss": final_loss,
        **profile,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke run)")
    parser.add_argument(
        "--target-shape", choices=sorted(TARGETS), default="qwen3-8b", help="the drafter's target"
    )
    parser.add_argument("--variants", default="base", help="comma list of names, or 'all'")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--time-budget", type=float, default=480.0, help="skip variants after")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--profile", action="store_true", help="top kernels of 3 steps")
    parser.add_argument(
        "--profile-top",
        type=int,
        default=25,
        help="kernels kept in the JSON's profile (the table prints the top 25)",
    )
    parser.add_argument(
        "--gaps", action="store_true", help="the GPU's idle time in 2 steps, by code (CUDA)"
    )
    parser.add_argument(
        "--batch-docs",
        type=int,
        default=0,
        help="documents per batch (the batch's size: this many of the shape's length; "
        "0: the shape's own count)",
    )
    parser.add_argument(
        "--longest-doc",
        type=int,
        default=None,
        help="measured batches packed from documents of 64 to this many tokens (0: 1-6 "
        "documents of random lengths; default: the shape's, 1024 for smollm2-135m, else 0)",
    )
    args = parser.parse_args(argv)
    args.docs, args.block, args.longest = 3, 16, 0
    args.layers = 2 if args.small else 5
    args.doc_len = 96 if args.small else 3072
    args.anchors = 16 if args.small else 512
    if not args.small:
        vars(args).update(LAYOUTS.get(args.target_shape, {}))
    args.docs = args.batch_docs or args.docs
    if args.longest_doc is not None:
        args.longest = args.longest_doc
    args.max_tokens = args.docs * args.doc_len
    if args.small:
        args.steps = min(args.steps, 5)
    return args


def summary_line(r: dict) -> str:
    """One variant's result as a row of the closing table (or why it has none)."""
    if "step_s" not in r:
        return str(r.get("error") or r.get("skipped"))
    mem = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else "-"
    saved = f"{r['saved_for_backward_gib']:.1f}" if "saved_for_backward_gib" in r else "-"
    return (f"{r['step_s']:>8.3f} {r['tokens_per_s']:>10.0f} {r['tflops_per_s']:>8.1f} "
            f"{r['mfu'] or 0:>6.3f} {mem:>8} {saved:>6} {r['recompiles']:>6}")  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    started = time.perf_counter()
    results = []
    for name in names:
        if name not in VARIANTS:
            results.append({"variant": name, "error": f"unknown variant (known: {list(VARIANTS)})"})
            continue
        if time.perf_counter() - started > args.time_budget:
            results.append({"variant": name, "skipped": "time budget spent"})
            continue
        try:
            results.append(run_variant(name, VARIANTS[name], args, device))
            log(f"{name}: {summary_line(results[-1])}")  # kept if a later variant overruns
        except Exception as exc:  # report and go on with the next variant
            traceback.print_exc()
            results.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        finally:
            torch._dynamo.reset()
            gc.collect()  # the drafter and its compiled wrapper form a reference cycle
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(
        f"{'variant':<12} {'step_s':>8} {'tok/s':>10} {'TFLOP/s':>8} {'mfu':>6} {'mem GiB':>8} "
        f"{'saved':>6} {'recomp':>6}"
    )
    for r in results:
        print(f"{r['variant']:<12} {summary_line(r)}")
    profiled = [r for r in results if "profile" in r]
    for r in profiled[1:]:
        r["profile_diff"] = kernel_diff(profiled[0]["profile"], r["profile"])
        print_diff(f"{r['variant']} against {profiled[0]['variant']}", r["profile_diff"])
    report = {
        **report_head("bench_drafter", device),
        "shape": "small" if args.small else args.target_shape,
        "docs": args.docs,
        "doc_len": args.doc_len,
        "anchors_per_doc": args.anchors,
        "longest_doc": args.longest,
        "block_size": args.block,
        "steps": args.steps,
        "results": results,
    }
    best = [r for r in results if r.get("mfu") is not None]
    if best:
        report["best_mfu"] = max(r["mfu"] for r in best)
    save_report(report, "bench_drafter", args.json)
    return report


if __name__ == "__main__":
    main()
