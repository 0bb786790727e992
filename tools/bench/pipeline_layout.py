"""Layouts of the pipeline benchmark: roles on GPUs, their ideal rate, MPS, and what a run
measured (tools/bench/bench_pipeline.py): per rank, and from its step records and logs
(steady rate, GPU busy by role, where start-up time went).

A layout is T targets + D drafters on one node, each rank on the GPU `gpu_map` names
(ranks 0..T-1 are the targets, T..T+D-1 the drafters); with `target_tp` = k the targets
form T / k tensor-parallel groups of k consecutive ranks, each group one producer. Roles
and groups are the trainer's own (ringtrain.trainer.roles); the ideal rate is the rate at
which the busiest GPU saturates (ringtrain.trainer.roles.layout_rate), from the
standalone rates of one target group (one whole GPU when k = 1, its k GPUs together
otherwise) and of one drafter.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ringtrain.config import ConfigError, LayoutConfig
from ringtrain.trainer.logs import LOG_TIME_FORMAT
from ringtrain.trainer.roles import check_gpu_map, check_layout, layout_rate, local_role

# Steps whose DDP timings are skipped: the first ones compile and warm the allocator.
GRAD_SYNC_SKIP_STEPS = 4


@dataclass(frozen=True)
class Layout:
    """T targets + D drafters, and the GPU of each rank."""

    targets: int
    drafters: int
    gpu_map: tuple[int, ...]
    target_tp: int = 1

    @staticmethod
    def parse(split: str, gpu_map: str | None, target_tp: int = 1) -> Layout:
        """`split` "T+D", `gpu_map` "0,1,..." (default: every rank on GPU 0) and the target
        group size, checked as the trainer checks its [layout]."""
        try:
            targets, drafters = (int(part) for part in split.split("+"))
        except ValueError:
            raise SystemExit(f"--layout {split!r}: write targets+drafters, e.g. 2+2") from None
        gpus = tuple(int(g) for g in gpu_map.split(",")) if gpu_map else (0,) * (targets + drafters)
        layout = Layout(targets, drafters, gpus, target_tp)
        try:
            check_layout(layout.config)
            check_gpu_map(layout.config)
        except ConfigError as exc:
            raise SystemExit(
                f"--layout {split} --gpu-map {gpu_map} --target-tp {target_tp}: {exc}"
            ) from None
        return layout

    @property
    def config(self) -> LayoutConfig:
        """The trainer's [layout] of this layout."""
        return LayoutConfig(
            targets_per_node=self.targets,
            drafters_per_node=self.drafters,
            target_tp=self.target_tp,
            gpu_map=list(self.gpu_map),
        )

    @property
    def name(self) -> str:
        groups = f" tp{self.target_tp}" if self.target_tp > 1 else ""
        return f"{self.targets}+{self.drafters}@{','.join(map(str, self.gpu_map))}{groups}"

    def role(self, rank: int) -> str:
        return local_role(rank, self.targets)

    def ideal_tokens_per_s(self, target_rate: float, drafter_rate: float) -> float:
        """The rate at which the busiest GPU saturates; `target_rate` is one target
        group's standalone tokens/s."""
        return layout_rate(self.config, target_rate, drafter_rate)


@contextmanager
def mps_daemon(work: Path) -> Iterator[dict[str, str]]:
    """An MPS control daemon of its own (pipe and log directories under `work`) for the
    time of the block; yields the environment its clients need."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise SystemExit("--mps: nvidia-cuda-mps-control is not on PATH")
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(work / "mps-pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(work / "mps-log"),
    }
    for directory in env.values():
        Path(directory).mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **env}
    subprocess.run([control, "-d"], env=full, check=True)
    try:
        yield env
    finally:
        subprocess.run([control], input="quit\n", text=True, env=full, check=False)


class PeakMemory:
    """Peak GPU memory of each rank of a run, polled from nvidia-smi every half second.

    A process is matched to its rank by the RANK in its environment. Under MPS the
    clients are not listed (the server is): the result is then empty."""

    def __init__(self) -> None:
        self.peak_mib: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> PeakMemory:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _poll(self) -> None:
        query = [
            "nvidia-smi",
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ]
        while not self._stop.wait(0.5):
            listing = subprocess.run(query, capture_output=True, text=True, check=False).stdout
            for line in listing.splitlines():
                pid, _, used = line.partition(",")
                rank = _rank_of(pid.strip())
                if rank is not None and used.strip().isdigit():
                    self.peak_mib[rank] = max(self.peak_mib.get(rank, 0.0), float(used))


def _rank_of(pid: str) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in environ:
        if entry.startswith(b"RANK="):
            return int(entry[5:])
    return None


def busy_by_rank(window: list[dict]) -> dict[int, float]:
    """Each rank's mean published NVML busy fraction over the step records `window`."""
    samples: dict[int, list[float]] = {}
    for record in window:
        for rank, value in record.get("gpu_busy_by_rank", {}).items():
            samples.setdefault(int(rank), []).append(value)
    return {rank: sum(v) / len(v) for rank, v in sorted(samples.items())}


def grad_sync(steps: list[dict]) -> dict[str, float | int | None]:
    """Median DDP reduction time per step, median part of it not hidden by backward, and
    that part's share of the median step, over the sampled steps after warm-up."""
    sampled = [
        r for r in steps if r.get("grad_sync_ms") is not None and r["step"] > GRAD_SYNC_SKIP_STEPS
    ]
    if not sampled:
        return {"grad_sync_samples": 0}
    exposed = statistics.median(r["grad_sync_exposed_ms"] for r in sampled)
    step_ms = 1000 * statistics.median(r["seconds"] for r in steps[GRAD_SYNC_SKIP_STEPS:])
    return {
        "grad_sync_samples": len(sampled),
        "grad_sync_ms_p50": statistics.median(r["grad_sync_ms"] for r in sampled),
        "grad_sync_exposed_ms_p50": exposed,
        "step_ms_p50": step_ms,
        "grad_sync_exposed_fraction": exposed / step_ms,
    }


def steady_state(steps: list[dict], budget: int) -> dict:
    """Rate, batch fill, recompiles and loss over the step records after the first third
    (`budget`: the tokens all drafters together can take per step)."""
    window = steps[len(steps) // 3 :]
    seconds = window[-1]["wall"] - window[0]["wall"]
    tokens = sum(r["tokens"] for r in window[1:])
    return {
        "tokens_per_s": tokens / max(seconds, 1e-9),
        "fill": tokens / (len(window) - 1) / budget,
        "steady_recompiles": window[-1]["compiles"] - window[0]["compiles"],
        "loss_first": steps[0]["loss"],
        "loss_last": steps[-1]["loss"],
    }


def gpu_busy(window: list[dict], layout: Layout) -> dict:
    """Each rank's mean GPU busy over the step records `window`, and each role's mean."""
    busy = busy_by_rank(window)
    by_role = {
        role: [v for rank, v in busy.items() if layout.role(rank) == role]
        for role in ("target", "drafter")
    }
    return {
        "gpu_busy_target": statistics.fmean(by_role["target"]) if by_role["target"] else None,
        "gpu_busy_drafter": statistics.fmean(by_role["drafter"]) if by_role["drafter"] else None,
        "gpu_busy_by_rank": busy,
        "min_drafter_busy": min(by_role["drafter"], default=None),
    }


def startup_lines(run_dir: Path, steps: int) -> dict[str, list[str]]:
    """Each rank log's lines up to its `steps`-th step line: where start-up time goes."""
    lines: dict[str, list[str]] = {}
    for log in sorted((run_dir / "logs").glob("*.log")):
        head, seen = [], 0
        for line in log.read_text(errors="replace").splitlines():
            head.append(line[:200])
            seen += " step " in line
            if seen >= steps or len(head) >= 60:
                break
        lines[log.name] = head
    return lines


def split_advice(run_dir: Path) -> list[str]:
    """The lead drafter's role-split advice at the end of the run (ringtrain.monitor.advice:
    the rates it measured, the split now, the best split and its conclusion), without the
    lines' time stamps; empty where no drafter gave it."""
    for log in sorted((run_dir / "logs").glob("*-drafter.log")):
        lines = log.read_text(errors="replace").splitlines()
        start = next((i for i, line in enumerate(lines) if "role split over" in line), None)
        if start is None:
            continue
        advice = []
        for line in lines[start:]:
            advice.append(line.split(" INFO ", 1)[-1])
            if "=>" in line:
                break
        return advice
    return []


# How a rank log line begins (ringtrain.trainer.logs): its local time to the millisecond.
LOG_LINE_TIME = f"{LOG_TIME_FORMAT}.%f"


def first_log_time(run_dir: Path) -> float | None:
    """When the first rank to log wrote its first line (seconds since the epoch): the
    launch's share of start-up before it is the launcher's and the ranks' imports. None
    where no rank has logged."""
    times = []
    for log in (run_dir / "logs").glob("*.log"):
        with log.open(errors="replace") as lines:
            stamp = lines.readline()[:23]
        try:
            times.append(datetime.strptime(stamp, LOG_LINE_TIME).timestamp())
        except ValueError:
            continue
    return min(times, default=None)
