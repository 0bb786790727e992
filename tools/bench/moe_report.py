"""The mixture-of-experts target's headline numbers from the JSON of one GPU check run.

``tools/gpu_checks.sh target_moe load pipeline_moe moe_report`` leaves
``target_moe.json`` (bench_target, Qwen3-30B-A3B shape), ``bench_load.json`` and
``pipeline_moe.json`` (bench_pipeline) in ``$OUT``; this prints their metrics as a
table and one JSON line, also saved as ``$OUT/moe_report.json``. A benchmark that did
not finish shows as None.

    OUT=gpu-results python -m tools.bench.moe_report
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.bench.bench_report import print_report

SHAPE = "qwen3-30b-a3b"
TOP_KERNELS = 4


def read(out: Path, name: str) -> dict:
    """A benchmark's JSON report, or {} when it is missing or cut short."""
    try:
        return json.loads((out / name).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def target_metrics(report: dict) -> dict:
    """Compiled target, GPU output: rate, MFU, experts implementation, recompiles."""
    rows = [r for r in report.get("results", []) if r.get("shape") == SHAPE]
    device = next((r for r in rows if r["out"] == "device"), {})
    host = next((r for r in rows if r["out"] == "host"), {})
    top = [k for k in device.get("profile", []) if k["kernel"] not in ("all kernels", "other")]
    return {
        "target_moe_tokens_per_s": device.get("tokens_per_s"),
        "target_moe_mfu": device.get("mfu"),
        "target_moe_step_ms": device.get("step_ms"),
        "target_moe_host_out_tokens_per_s": host.get("tokens_per_s"),
        "target_moe_experts_implementation": device.get("experts_implementation"),
        "target_moe_compile": device.get("compile"),
        "target_moe_first_call_s": device.get("first_call_s"),
        "target_moe_recompiles": device.get("recompiles"),
        "target_moe_peak_mem_gib": device.get("peak_mem_gib"),
        "target_moe_top_kernels": [
            f"{100 * k['share']:.0f}% {k['ms_per_step']:.1f} ms {k['kernel'][:60]}"
            for k in top[:TOP_KERNELS]
        ],
    }


def load_metrics(report: dict) -> dict:
    """Checkpoint load: warm and cold GB/s, the 48-layer estimate, what was read."""
    return {
        "target_load_gbps": report.get("target_load_gbps"),
        "target_load_gbps_cold": report.get("target_load_gbps_cold"),
        "full_model_load_s_est_warm": report.get("full_model_load_s_est_warm"),
        "full_model_load_s_est_cold": report.get("full_model_load_s_est_cold"),
        "load_cold_method": report.get("cold_method"),
        "load_filesystem": report.get("filesystem"),
        "load_only_kept_read": report.get("only_kept_read"),
        "load_loaded_equals_kept": report.get("loaded_equals_kept"),
    }


def pipeline_metrics(report: dict) -> dict:
    """1 target + 1 drafter on one GPU: efficiency against the standalone rates."""
    entry = report.get("shapes", {}).get(SHAPE, {})
    run = entry.get("warm") or entry.get("cold") or {}
    drafter = entry.get("drafter", {})
    return {
        "pipeline_efficiency_moe": entry.get("pipeline_efficiency"),
        "pipeline_moe_tokens_per_s": run.get("tokens_per_s"),
        "pipeline_moe_ideal_tokens_per_s": entry.get("ideal_tokens_per_s"),
        "drafter_moe_tokens_per_s": drafter.get("tokens_per_s"),
        "drafter_moe_mfu": drafter.get("mfu"),
        "pipeline_moe_first_step_s": run.get("first_step_s"),
        "pipeline_moe_steady_recompiles": run.get("steady_recompiles"),
        "pipeline_moe_error": run.get("error"),
    }


def main() -> None:
    out = Path(os.environ.get("OUT", "gpu-results"))
    report = {
        **target_metrics(read(out, "target_moe.json")),
        **load_metrics(read(out, "bench_load.json")),
        **pipeline_metrics(read(out, "pipeline_moe.json")),
    }
    print_report(report, "moe_report")


if __name__ == "__main__":
    main()
