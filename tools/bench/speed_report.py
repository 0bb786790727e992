"""Old against new step paths, side by side, from the JSON of ``tools/gpu_checks.sh speed``
(and ``speed_moe``, ``speed_experts``).

``speed`` leaves ``speed_drafter.json`` (bench_drafter: the variant "base", today's
optimiser step, and the variants compared with it: "fast_step", the clip inside fused
AdamW's kernel and gradients freed instead of zeroed; "cudagraphs", fast_step replayed
as CUDA graphs; "muon", fast_step's switches with Muon) and ``speed_moe`` leaves
``speed_moe.json`` (bench_target on the Qwen3-30B-A3B shape, compiled, with the
mixture-of-experts blocks eager and compiled: ``--moe-compile both``) and
``speed_experts`` leaves ``speed_experts.json`` (the same, compiled, with transformers'
grouped_mm experts against ringtrain's: ``--moe-compile experts``) in ``$OUT``. This
writes ``$OUT/speed_report.json``, prints it as one JSON line, then a table of each
metric old and new with the ratio new / old, last (``drafter.<variant>.<metric>``
against base, ``moe_target.*`` eager against compiled blocks, ``moe_experts.*``
transformers' experts against ringtrain's). A benchmark that did not run or finish shows
as None.

    OUT=gpu-results python -m tools.bench.speed_report
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.bench.moe_report import read

DRAFTER_METRICS = ("step_s", "mfu", "peak_mem_gib", "recompiles", "final_loss")
MOE_METRICS = ("step_ms", "mfu", "peak_mem_gib", "recompiles", "graph_breaks", "graphs")


def drafter_rows(report: dict) -> dict[str, dict[str, dict]]:
    """bench_drafter's "base" (old) against each other variant (new), by variant name."""
    by_variant = {r.get("variant"): r for r in report.get("results", [])}
    base = by_variant.pop("base", {})
    return {name: {"old": base, "new": result} for name, result in by_variant.items()}


def moe_rows(report: dict, old: str) -> dict[str, dict]:
    """bench_target's GPU-output rows with the MoE blocks compiled ("on", new) against the
    variant named ``old`` ("off": eager blocks; "transformers": transformers' experts)."""
    device_rows = [r for r in report.get("results", []) if r.get("out") == "device"]
    by_moe = {r.get("moe_compile"): r for r in device_rows}
    return {"old": by_moe.get(old, {}), "new": by_moe.get("on", {})}


def compare(prefix: str, rows: dict[str, dict], metrics: tuple[str, ...]) -> list[dict]:
    """One {metric, old, new, ratio} entry per metric (ratio new / old, None without both)."""
    entries = []
    for metric in metrics:
        old, new = rows["old"].get(metric), rows["new"].get(metric)
        ratio = new / old if isinstance(old, int | float) and old and new is not None else None
        entries.append({"metric": f"{prefix}.{metric}", "old": old, "new": new, "ratio": ratio})
    return entries


def cell(value: object) -> str:
    """A table cell: floats to 4 significant digits, None as '-'."""
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main() -> dict:
    out = Path(os.environ.get("OUT", "gpu-results"))
    drafters = drafter_rows(read(out, "speed_drafter.json"))
    entries = [
        entry
        for name, rows in drafters.items()
        for entry in compare(f"drafter.{name}", rows, DRAFTER_METRICS)
    ]
    entries += compare("moe_target", moe_rows(read(out, "speed_moe.json"), "off"), MOE_METRICS)
    experts = moe_rows(read(out, "speed_experts.json"), "transformers")
    entries += compare("moe_experts", experts, MOE_METRICS)
    report = {
        "old": "drafter base / MoE blocks eager / transformers' experts",
        "new": "drafter variant / MoE blocks compiled / ringtrain's experts",
    }
    report["comparison"] = entries
    line = json.dumps(report)
    (out / "speed_report.json").write_text(line + "\n")
    print(line)
    width = max(len(e["metric"]) for e in entries)
    print(f"{'metric':<{width}} {'old':>10} {'new':>10} {'new/old':>8}")
    for e in entries:
        print(
            f"{e['metric']:<{width}} {cell(e['old']):>10} {cell(e['new']):>10} "
            f"{cell(e['ratio']):>8}"
        )
    return report


if __name__ == "__main__":
    main()
