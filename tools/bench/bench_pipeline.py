#!/usr/bin/env python3
"""End-to-end pipeline benchmark on one GPU: standalone rates, the shared-GPU pipeline,
start-up times and steady-state recompiles. Prints a table, then one JSON object.

For each target shape (Qwen3-8B-like; Qwen3-30B-A3B-like mixture of experts; Qwen3.5-like
hybrid with Gated DeltaNet layers):
  a. target-only tokens/s and MFU     (tools/bench/bench_target.py)
  b. drafter-only tokens/s and MFU    (tools/bench/bench_drafter.py)
  c. the full trainer, 1 target + 1 drafter sharing the GPU over the device ring:
     pipeline_efficiency = tokens/s / (1 / (1/a + 1/b))
  d. launch -> first optimizer step, cold (empty compile caches) and warm (same caches)
  e. compiles after warm-up (must be 0)

Random-weight targets (`target.random_weights`) need no checkpoint on disk. Every row of
the synthetic dataset has exactly `--mean-len` tokens, so each batch is budget // mean_len
full rows (`fill` in the JSON: real tokens per step / budget), the batch the standalone
target benchmark runs: the three rates see the same work per token. (Rows of varied
lengths fill a 9216-token budget to only about 82%, since a batch holds rows of one
padded length; then tokens/s drops with the fill while the per-step work barely does.)
`--target-result FILE` takes a. from a bench_target JSON of the same run instead (same
shape, --tokens = budget, --seq-len = mean-len, compiled): one target benchmark fewer.
`--layout T+D --gpu-map G,G,...` runs c. with T targets and D drafters on the GPUs named
per rank (targets first), `--mps` under an MPS daemon of its own; then the ideal of c.
is the rate at which the busiest GPU saturates (tools/bench/pipeline_layout.py), each rank's
GPU busy and peak memory are reported, and with more than one drafter DDP's gradient
reduction: median time per step and the median share of the step it is not hidden
behind backward. Every run also records the lead drafter's role-split advice
(`split_advice`: the rates it measured, the split now, the best one) and each rank log's
start-up lines. `--scale-reference` also runs 1 + 1 on GPU 0 under the same MPS
setting: scaling_efficiency = tokens/s / (GPUs of the layout x its rate). `--target-tp 2`
makes the targets tensor-parallel groups of two (`layout.target_tp`); the standalone rate
a. is then one group's, measured by tools/bench/bench_target_tp.py over GPUs 0 and 1, and the
ideal counts each group on both its GPUs. `--set K=V` passes a trainer override (e.g.
optim.grad_reduce_dtype="bfloat16").
Usage: tools/bench/bench_pipeline.py [--shapes qwen3-8b,qwen3-30b-a3b,qwen3.5-hybrid] [--steps N]
[--layout 2+2 --gpu-map 0,1,0,1 --mps --scale-reference] [--target-tp 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from tools.bench.model_shapes import (
    QWEN3_5_27B,
    QWEN3_5_MASK_TOKEN_ID,
    QWEN3_8B,
    QWEN3_30B_A3B,
    QWEN3_32B,
    QWEN3_MASK_TOKEN_ID,
)
from tools.bench.pipeline_layout import (
    Layout,
    PeakMemory,
    first_log_time,
    gpu_busy,
    grad_sync,
    mps_daemon,
    split_advice,
    startup_lines,
    steady_state,
)
from tools.recipes.children import stop

ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "model_type": "qwen3",
    "hidden_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 256,
    "vocab_size": 1024,
    "mask_token_id": 1023,
}
TINY_EXPERTS = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
TARGET_SHAPES = {
    "tiny": TINY,
    "tiny-moe": {**TINY, "model_type": "qwen3_moe", **TINY_EXPERTS, "norm_topk_prob": True},
    "qwen3-8b": {"model_type": "qwen3", **QWEN3_8B, "mask_token_id": QWEN3_MASK_TOKEN_ID},
    "qwen3-32b": {"model_type": "qwen3", **QWEN3_32B, "mask_token_id": QWEN3_MASK_TOKEN_ID},
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe",
        **QWEN3_30B_A3B,
        "mask_token_id": QWEN3_MASK_TOKEN_ID,
    },
    "qwen3.5-hybrid": {
        "model_type": "qwen3_5_text",
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "intermediate_size": 6144,
        "vocab_size": 248320,
        "mask_token_id": QWEN3_5_MASK_TOKEN_ID,
    },
    "qwen3.5-27b": {
        "model_type": "qwen3_5_text",
        **QWEN3_5_27B,
        "mask_token_id": QWEN3_5_MASK_TOKEN_ID,
    },
}
# Shapes whose drafter tools/bench/bench_drafter.py benchmarks (--target-shape).
DRAFTER_SHAPES = ("qwen3-8b", "qwen3-30b-a3b", "qwen3-32b")
DEFAULT_LAYOUT = Layout(1, 1, (0, 0))
DATASET_TOKENS = 4000 * 3072


def last_json(text: str) -> dict:
    """The last line of `text` that parses as a JSON object."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON object in output:\n" + text[-2000:])


def run_tool(args: list[str], timeout: float) -> dict:
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "tail": (proc.stdout + proc.stderr)[-3000:]}
    return last_json(proc.stdout)


def write_target_dir(path: Path, shape: dict) -> None:
    """A config-only target directory (weights are drawn at random by the trainer)."""
    path.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in shape.items() if k != "mask_token_id"}
    config.update(
        {
            "architectures": ["Qwen3ForCausalLM"],
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        }
    )
    if shape["model_type"] == "qwen3_5_text":
        layers = shape["num_hidden_layers"]
        config["layer_types"] = [
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)
        ]
        config.update(
            {
                "linear_num_key_heads": 16,
                "linear_num_value_heads": 32,
                "linear_key_head_dim": 128,
                "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4,
                "full_attention_interval": 4,
                "architectures": ["Qwen3_5ForCausalLM"],
            }
        )
    if shape["model_type"] == "qwen3_moe":
        config["architectures"] = ["Qwen3MoeForCausalLM"]
    (path / "config.json").write_text(json.dumps(config, indent=2))


def trainer_command(
    work: Path, name: str, shape: dict, args: argparse.Namespace, cache_dir: Path,
    layout: Layout, run_dir: Path,
) -> list[str]:  # fmt: skip
    """The torchrun command that trains `layout` on a random-weights target of `shape`."""
    target_dir = work / f"{name}-target"
    write_target_dir(target_dir, shape)
    overrides = {
        "run.run_dir": json.dumps(str(run_dir)),
        "run.name": json.dumps(f"bench-{name}"),
        "run.max_steps": args.steps,
        "run.log_every": 5,
        "run.checkpoint_every": 0,
        "run.cache_dir": json.dumps(str(cache_dir)),
        "layout.targets_per_node": layout.targets,
        "layout.drafters_per_node": layout.drafters,
        "layout.gpu_map": json.dumps(list(layout.gpu_map)),
        "layout.target_tp": layout.target_tp,
        "ring.transport": '"device"',
        "ring.slots_per_producer": 3,
        "data.path": json.dumps(str(work / "data")),
        "data.token_budget": args.budget,
        "data.max_len": max_len(args),
        "target.path": json.dumps(str(target_dir)),
        "target.random_weights": "true",
        "drafter.mask_token_id": shape["mask_token_id"],
    }
    if args.device == "cpu":
        overrides.update(
            {"run.device": '"cpu"', "layout.gpu_map": "[]", "ring.transport": '"host"'}
        )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={len(layout.gpu_map)}", "-m", "ringtrain.main"]
    command += ["--config", "configs/bench.toml"]
    for key, value in overrides.items():
        command += ["--set", f"{key}={value}"]
    for setting in args.set:
        command += ["--set", setting]
    return command


def run_pipeline(
    work: Path,
    name: str,
    shape: dict,
    args: argparse.Namespace,
    cache_dir: Path,
    layout: Layout = DEFAULT_LAYOUT,
    env: dict[str, str] | None = None,
) -> dict:
    """Train `layout` (1 target + 1 drafter on GPU 0 by default); rate after warm-up,
    launch->first rank log line and launch->first step, each rank's GPU busy and peak
    memory, DDP's gradient reduction."""
    run_dir = work / f"{name}-run-{time.monotonic_ns()}"
    command = trainer_command(work, name, shape, args, cache_dir, layout, run_dir)
    print(
        f"bench_pipeline: {name} ({layout.name}) training, at most {args.run_timeout:g} s",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    started = time.time()
    # The output goes to a file, not a pipe: a rank that outlived its launcher cannot
    # keep the read waiting.
    with PeakMemory() as memory, tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        try:
            proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            stop([proc])  # SIGTERM: torchrun stops its ranks; SIGKILL after a grace period
            return {
                "error": f"ran past --run-timeout {args.run_timeout:g} s",
                "startup_log": startup_lines(run_dir, steps=4),
            }
        output.seek(0)
        text = output.read()
    records = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line]
    steps_done = [r for r in records if r.get("event") == "step"]
    startup = startup_lines(run_dir, steps=4)
    if proc.returncode != 0 or len(steps_done) < 4:
        return {
            "error": f"exit {proc.returncode}",
            "tail": text[-3000:],
            "startup_log": startup,
        }
    return {
        "layout": layout.name,
        **steady_state(steps_done, args.budget * layout.drafters),
        "first_step_s": steps_done[0]["wall"] - started,
        "first_log_s": first_log - started if (first_log := first_log_time(run_dir)) else None,
        **gpu_busy(steps_done[len(steps_done) // 3 :], layout),
        "peak_memory_mib_by_rank": memory.peak_mib,
        **grad_sync(steps_done),
        "steps": len(steps_done),
        "split_advice": split_advice(run_dir),
        "startup_log": startup,
    }


def max_len(args: argparse.Namespace) -> int:
    """The dataset's and the trainer's longest row: 4096 (or the budget), or the row
    length when rows are longer."""
    return max(min(4096, args.budget), args.mean_len)


def standalone_group(name: str, args: argparse.Namespace) -> dict:
    """One tensor-parallel target group's standalone rate (tools/bench/bench_target_tp.py over
    GPUs 0 and 1, the same batch as the pipeline's), with the whole report (its error
    names the shapes it has when it has not this one)."""
    report = run_tool(
        ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "tools.bench.bench_target_tp", "--shape", name, "--tokens", str(args.budget),
         "--seq-len", str(args.mean_len), "--json"],
        timeout=500,
    )  # fmt: skip
    if "target_tp2_tokens_per_s" not in report:
        return report
    return {"tokens_per_s": report["target_tp2_tokens_per_s"], "bench_target_tp": report}


def standalone_target(name: str, args: argparse.Namespace) -> dict:
    """The standalone target's result row: one group's with ``--target-tp``; else from
    ``--target-result`` when it holds the shape, else measured (the trainer's own
    settings: compiled layers, GPU output)."""
    if args.layout.target_tp > 1:
        return standalone_group(name, args)
    if args.target_result:
        report = json.loads(Path(args.target_result).read_text())
    else:
        report = run_tool(
            ["-m", "tools.bench.bench_target", "--shape", name, "--tokens", str(args.budget),
             "--seq-len", str(args.mean_len), "--compile", "on", "--json"],
            timeout=400,
        )  # fmt: skip
    rows = [
        r
        for r in report.get("results", [])
        if (r["shape"], r["out"], r["compile"], r["seq_len"])
        == (name, "device", "on", args.mean_len)
        and r["tokens"] == args.budget // args.mean_len * args.mean_len
    ]
    if args.target_result and not rows:
        return {
            "error": f"{args.target_result} has no compiled {name} result (device out) of "
            f"{args.budget // args.mean_len} rows of {args.mean_len} tokens"
        }
    return rows[0] if rows else report


def measure_standalone(name: str, args: argparse.Namespace, entry: dict, results: dict) -> None:
    """The standalone target and drafter rates of a shape, saved as each arrives."""
    entry["target"] = standalone_target(name, args)
    save(results)
    if name in DRAFTER_SHAPES:
        drafter = run_tool(
            ["-m", "tools.bench.bench_drafter", "--target-shape", name, "--json"], timeout=500
        )
        entry["drafter"] = drafter.get("results", [drafter])[0]
        save(results)


def save(results: dict) -> None:
    """Write the results so far to $OUT/bench_pipeline.json (when $OUT is set)."""
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_pipeline.json").write_text(json.dumps(results))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="qwen3-8b,qwen3.5-hybrid")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--run-timeout",
        type=float,
        default=560.0,
        help="seconds one training run may take; a run cut there is recorded with its "
        "ranks' start-up log lines (where the time went)",
    )
    parser.add_argument("--budget", type=int, default=16384)
    parser.add_argument("--skip-standalone", action="store_true")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--cold-shapes",
        default="qwen3-8b,tiny",
        help="shapes that get a cold-cache run and then a warm-cache one (the others run "
        "once, with empty caches, reported as cold)",
    )
    parser.add_argument(
        "--mean-len",
        type=int,
        default=3072,
        help="length of every dataset row (and the standalone target's row length)",
    )
    parser.add_argument(
        "--target-result",
        help="a bench_target JSON (same run, --tokens BUDGET --seq-len MEAN_LEN, compiled) to "
        "take the standalone target rate from instead of measuring it",
    )
    parser.add_argument("--layout", default="1+1", help="targets+drafters of one node")
    parser.add_argument(
        "--gpu-map", help="GPU of each rank, targets first, e.g. 0,1,0,1 (default: all on 0)"
    )
    parser.add_argument(
        "--mps", action="store_true", help="run the pipelines under an MPS daemon of their own"
    )
    parser.add_argument(
        "--scale-reference",
        action="store_true",
        help="also run 1 target + 1 drafter on GPU 0 (same MPS setting) and report "
        "scaling_efficiency = tokens/s / (GPUs of the layout x that rate)",
    )
    parser.add_argument(
        "--target-tp",
        type=int,
        default=1,
        choices=(1, 2),
        help="GPUs per target group (layout.target_tp); 2 measures the standalone group rate "
        "with tools/bench/bench_target_tp.py",
    )
    parser.add_argument(
        "--set", action="append", default=[], help="extra trainer override KEY=VALUE"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.layout = Layout.parse(args.layout, args.gpu_map, args.target_tp)
    return args


def write_dataset(work: Path, args: argparse.Namespace) -> None:
    """Rows of exactly --mean-len tokens over the smallest vocabulary of the shapes,
    DATASET_TOKENS in all (4000 rows of the default length; fewer long ones)."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from ringtrain.data import write_synthetic_dataset as w; "
            "w(sys.argv[1], rows=int(sys.argv[5]), vocab_size=int(sys.argv[2]), "
            "mean_len=int(sys.argv[3]), seed=0, max_len=int(sys.argv[4]), sigma=0.0)",
            str(work / "data"),
            str(min(s["vocab_size"] for s in TARGET_SHAPES.values())),
            str(args.mean_len),
            str(max_len(args)),
            str(max(64, DATASET_TOKENS // args.mean_len)),
        ],
        check=True,
        cwd=ROOT,
    )


def bench_shape(
    work: Path, name: str, args: argparse.Namespace, env: dict, entry: dict, results: dict
) -> None:
    """Standalone rates, the layout's runs (cold, then warm for --cold-shapes), the
    reference run, and the efficiencies."""
    shape = TARGET_SHAPES[name]
    if not args.skip_standalone:
        measure_standalone(name, args, entry, results)
    cache = work / f"cache-{name}"
    shutil.rmtree(cache, ignore_errors=True)
    # The first run starts with empty compile caches; a second one reuses them.
    runs = ["cold", "warm"] if name in args.cold_shapes.split(",") else ["cold"]
    for run in runs:
        entry[run] = run_pipeline(work, name, shape, args, cache, args.layout, env)
        save(results)
    rate = entry[runs[-1]].get("tokens_per_s")
    if args.scale_reference:
        entry["reference"] = run_pipeline(work, name, shape, args, cache, DEFAULT_LAYOUT, env)
        reference = entry["reference"].get("tokens_per_s")
        if rate and reference:
            gpus = len(set(args.layout.gpu_map))
            entry["scaling_efficiency"] = rate / (gpus * reference)
    a = entry.get("target", {}).get("tokens_per_s")
    b = entry.get("drafter", {}).get("tokens_per_s")
    if a and b and rate:
        entry["ideal_tokens_per_s"] = args.layout.ideal_tokens_per_s(a, b)
        entry["pipeline_efficiency"] = rate / entry["ideal_tokens_per_s"]
    save(results)


def print_table(results: dict) -> None:
    print(
        f"{'shape':16} {'layout':14} {'tok/s':>10} {'eff':>6} {'scale':>6} {'cold s':>7} "
        f"{'warm s':>7} {'recomp':>6} {'minbusy':>7} {'sync ms':>8} {'exposed':>7}"
    )
    for name, entry in results["shapes"].items():
        cold, warm = entry.get("cold", {}), entry.get("warm", {})
        last = warm or cold
        print(
            f"{name:16} {last.get('layout', '-'):14} {last.get('tokens_per_s', 0):10.0f} "
            f"{entry.get('pipeline_efficiency', 0):6.3f} "
            f"{entry.get('scaling_efficiency', 0):6.3f} {cold.get('first_step_s', 0):7.1f} "
            f"{warm.get('first_step_s', 0):7.1f} {last.get('steady_recompiles', -1):6} "
            f"{last.get('min_drafter_busy') or 0:7.2f} {last.get('grad_sync_ms_p50', 0):8.1f} "
            f"{last.get('grad_sync_exposed_fraction', 0):7.3f}"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results: dict = {"layout": args.layout.name, "mps": args.mps, "shapes": {}}
    with tempfile.TemporaryDirectory(prefix="ringtrain-bench-") as tmp:
        work = Path(tmp)
        write_dataset(work, args)
        with mps_daemon(work) if args.mps else nullcontext({}) as env:
            for name in args.shapes.split(","):
                entry: dict = {}
                results["shapes"][name] = entry  # saved after each part: a cut run keeps some
                bench_shape(work, name, args, env, entry, results)
    print_table(results)
    save(results)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
