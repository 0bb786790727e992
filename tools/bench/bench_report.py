"""How the benchmarks in tools/bench/ report:
a table (an aligned key/value one here, or the benchmark's own), then the report as one
JSON line, the last line of output, also written to $OUT/<name>.json when $OUT is set."""

from __future__ import annotations

import json
import os
from pathlib import Path


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
