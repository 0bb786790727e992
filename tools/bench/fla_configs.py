"""Tune flash-linear-attention's kernels on this GPU and ship the results with ringtrain,
then time a fresh process's first hybrid-target forward without and with them.

1. tune: a child process with an empty Triton cache runs the shape's target, truncated
   after its first full-attention layer (its Gated DeltaNet layers all have one shape),
   random weights, bf16, eager, on a full batch and on one row; every autotuned FLA kernel
   those layers call tunes. Each kernel's results (its autotune keys and the
   configuration chosen for each) are merged into FLA's ``<kernel>.json`` files under
   ringtrain/target/fla_configs/<GPU>/, beside ``versions.json`` naming the FLA release
   (ringtrain.target.fla_configs reads them; another release starts the folder afresh).
2. first call: the tune step's first forward is the autotuning one; another child, with
   an empty Triton cache of its own, times the first forward of the same target with the
   configurations just written, as ringtrain's target loader points FLA at them.

Commit the written folder: a fresh machine with this GPU and FLA release then skips the
autotune. CUDA only (FLA's kernels are Triton kernels).

    python -m tools.bench.fla_configs --shape qwen3.5-27b
    python -m tools.bench.fla_configs --shape qwen3.5-hybrid
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ringtrain.target.fla_configs import (
    FLA_DISTRIBUTION,
    SHIPPED_FLA_CONFIGS,
    VERSIONS_FILE,
    gpu_folder,
    installed_fla_version,
    shipped_fla_configs,
)
from tools.bench.bench_report import print_report

ROOT = Path(__file__).resolve().parents[2]
CHILD_STEPS = ("tune", "shipped")


def build_runner(shape: str, device: torch.device):
    """The shape's target truncated after its first full-attention layer, with its runner."""
    from ringtrain.target.runner import TargetRunner
    from tools.bench.bench_target import build_config, build_target

    config = build_config(shape, small=False)
    last = config.layer_types.index("full_attention")
    target, _ = build_target(config, [last], device, compiled=False, moe="off")
    return TargetRunner(target), config.vocab_size


def first_forwards(shape: str, tokens: int, seq_len: int) -> float:
    """Seconds of the first forward of a full batch (FLA's kernels tune there where they
    tune); one row runs after it, so the one-row shapes tune too."""
    from tools.bench.bench_target import padded_batch, run_once, synchronize

    device = torch.device("cuda")
    runner, vocab_size = build_runner(shape, device)
    target = runner.target

    def forward(rows: int) -> None:
        out = torch.empty(rows * seq_len, target.tap_width, dtype=target.dtype, device=device)
        run_once(runner, padded_batch(rows, seq_len, vocab_size), out)
        synchronize(device)

    started = time.perf_counter()
    forward(max(1, tokens // seq_len))
    first = time.perf_counter() - started
    forward(1)
    return first


def fla_autotuners() -> dict[str, object]:
    """Every autotuned FLA kernel that has tuned, by kernel name."""
    from triton.runtime.autotuner import Autotuner

    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None:
            continue
        for value in vars(module).values():
            while value is not None and not isinstance(value, Autotuner):
                value = getattr(value, "fn", None)  # through @triton.heuristics wrappers
            if value is not None and value.cache:
                kernel = getattr(value, "kernel_name", None) or value.base_fn.__name__
                found[kernel] = value
    return found


def config_record(config) -> dict:
    """A Triton configuration as FLA's configuration files hold it."""
    return {
        "kwargs": dict(config.kwargs),
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        "num_ctas": config.num_ctas,
        "maxnreg": config.maxnreg,
    }


def write_configs(folder: Path) -> dict[str, int]:
    """Merge the tuned kernels' results into ``folder``; entries per kernel written."""
    import triton
    from fla.ops.utils.cache import AutotuneKey

    versions = {FLA_DISTRIBUTION: installed_fla_version(), "triton": triton.__version__}
    versions_file = folder / VERSIONS_FILE
    if versions_file.is_file() and json.loads(versions_file.read_text()) != versions:
        for stale in folder.glob("*.json"):
            stale.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for kernel, autotuner in sorted(fla_autotuners().items()):
        path = folder / f"{kernel}.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        entries = data.get("autotune_entries", {})
        for key, config in autotuner.cache.items():
            entries[AutotuneKey.key_hash(key)] = {
                "autotune_key": list(key),
                "config": config_record(config),
            }
        record = {"kernel_name": kernel, "triton_version": triton.__version__}
        path.write_text(json.dumps({**record, "autotune_entries": entries}, indent=1) + "\n")
        written[kernel] = len(autotuner.cache)
    versions_file.write_text(json.dumps(versions) + "\n")
    return written


def child(args: argparse.Namespace) -> dict:
    """One step in this process (the parent set its environment)."""
    gpu = torch.cuda.get_device_name()
    if args.child == "shipped" and shipped_fla_configs(gpu, installed_fla_version()) is None:
        raise SystemExit("fla_configs: no shipped configurations apply to this GPU")
    seconds = first_forwards(args.shape, args.tokens, args.seq_len)
    result = {"first_forward_s": round(seconds, 2)}
    if args.child == "tune":
        folder = SHIPPED_FLA_CONFIGS / gpu_folder(gpu)
        result["kernels"] = write_configs(folder)
        result["folder"] = str(folder.relative_to(ROOT))
    return result


def run_child(args: argparse.Namespace, step: str) -> dict:
    """One step in a fresh process with an empty Triton cache of its own."""
    with tempfile.TemporaryDirectory(prefix="fla-configs-") as cache:
        path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "PYTHONPATH": path}
        env.pop("FLA_CONFIG_DIR", None)
        env.pop("FLA_CACHE_MODE", None)
        if step == "tune":
            env["FLA_CACHE_MODE"] = "disabled"
        command = [
            sys.executable, "-m", "tools.bench.fla_configs", "--child", step,
            "--shape", args.shape, "--tokens", str(args.tokens), "--seq-len", str(args.seq_len),
        ]  # fmt: skip
        proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"fla_configs: the {step} step failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3.5-27b", help="a hybrid bench_target shape")
    parser.add_argument("--tokens", type=int, default=9216)
    parser.add_argument("--seq-len", type=int, default=3072)
    parser.add_argument("--child", choices=CHILD_STEPS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fla_configs needs a CUDA GPU (FLA's kernels are Triton kernels)")
    if args.child:
        print(json.dumps(child(args)))
        return
    tuned = run_child(args, "tune")
    shipped = run_child(args, "shipped")
    report = {
        "gpu": torch.cuda.get_device_name(),
        "shape": args.shape,
        "tokens": args.tokens,
        "folder": tuned["folder"],
        "kernels": len(tuned["kernels"]),
        "entries": sum(tuned["kernels"].values()),
        "first_forward_autotune_s": tuned["first_forward_s"],
        "first_forward_shipped_s": shipped["first_forward_s"],
    }
    print_report(report, "fla_configs")


if __name__ == "__main__":
    main()
