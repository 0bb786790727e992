"""How the benchmarks in tools/bench/ report:
a table (an aligned key/value one here, or the benchmark's own), then the report as one
JSON line, the last line of output, also written to $OUT/<name>.json when $OUT is set."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def report_head(name: str, device: torch.device | None = None) -> dict:
    """The fields a device benchmark's report starts with: the benchmark's `name`, the device
    it ran on (CUDA's current device when `device` is None; "cpu" for a CPU device) and
    torch's version. torch is imported here, not by the benchmarks that only time processes."""
    import torch

    device = device or torch.device("cuda")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"benchmark": name, "device": device_name, "torch": torch.__version__}


def save_report(report: dict, name: str, print_line: bool = True) -> None:
    """Save `report` as one JSON line in $OUT/`name`.json when $OUT is set; print the line
    (the last line of output) when `print_line`."""
    line = json.dumps(report)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"{name}.json").write_text(line + "\n")
    if print_line:
        print(line)


def print_report(report: dict, name: str) -> None:
    """Print `report` as a table and a final JSON line; save the line as $OUT/`name`.json."""
    width = max(len(key) for key in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    save_report(report, name)
