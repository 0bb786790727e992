"""Scalar sinks for `[run] report_to`: TensorBoard event files and W&B runs.

The lead drafter's metrics writer hands every record it writes to metrics.jsonl to each
sink as well (`write(record)`, `close()` at the end); a sink turns it into scalars (see
scalars.py). Both sinks are optional extras: `check_report_to` runs in the pre-flight
checks, before any model work, and names the extra to install when a package is missing.

- TensorBoard: event files under `<run_dir>/tensorboard/`. A resumed run starts a new
  event file that discards, in TensorBoard's view, the earlier files' scalars from the
  first step it logs on (those steps were trained again after the checkpoint).
- W&B: one run per run directory (its id is kept in `<run_dir>/wandb-run-id`, so a resumed
  run continues it), files under `<run_dir>/wandb/`, scalars against the training step.
  The project is `$WANDB_PROJECT` (default "ringtrain"); `WANDB_MODE=offline` works
  without network (upload later with `wandb sync`).
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ringtrain.config import Config, ConfigError
from ringtrain.monitor.scalars import ScalarConverter

# report_to name -> (module that must import, optional extra that installs it)
_PACKAGES = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
}
WANDB_ID_FILE = "wandb-run-id"


class Sink(Protocol):
    """Where the lead drafter's metrics records also go."""

    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def check_report_to(report_to: Sequence[str]) -> None:
    """Raise ConfigError naming the extra to install if a sink's package cannot be imported."""
    for name in report_to:
        module, extra = _PACKAGES[name]
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(
                f'run.report_to includes "{name}" but it cannot be used here ({exc}): '
                f"install it with `pip install 'ringtrain[{extra}]'`, or remove \"{name}\" "
                "from run.report_to"
            ) from None


class TensorBoardSink:
    """Scalars as TensorBoard event files under `<run_dir>/tensorboard/`."""

    def __init__(self, run_dir: Path) -> None:
        self.log_dir = run_dir / "tensorboard"
        self._converter = ScalarConverter()
        self._writer = None

    def write(self, record: dict[str, Any]) -> None:
        step, scalars = self._converter.scalars(record)
        if not scalars:
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            # Steps from the first one logged now on were trained again after a resume.
            first_new = step if record.get("event") == "step" else step + 1
            self._writer = SummaryWriter(str(self.log_dir), purge_step=first_new, flush_secs=10)
        wall = record.get("wall")
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, step, walltime=wall)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class WandbSink:
    """Scalars logged to one W&B run per run directory, against the training step."""

    def __init__(self, run_dir: Path, name: str, config: dict[str, Any]) -> None:
        import wandb

        id_file = run_dir / WANDB_ID_FILE
        if id_file.exists():
            run_id = id_file.read_text(encoding="utf-8").strip()
        else:
            run_id = uuid.uuid4().hex[:12]
            id_file.write_text(run_id + "\n", encoding="utf-8")
        self._converter = ScalarConverter()
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "ringtrain"),
            name=name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
        )
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")

    def write(self, record: dict[str, Any]) -> None:
        step, scalars = self._converter.scalars(record)
        if scalars:
            self._run.log({"step": step, **scalars})

    def close(self) -> None:
        self._run.finish()


def open_sinks(config: Config, run_dir: Path) -> list[Sink]:
    """One sink per `run.report_to` entry (W&B also shows the run's config)."""
    sinks: list[Sink] = []
    for entry in config.run.report_to:
        if entry == "tensorboard":
            sinks.append(TensorBoardSink(run_dir))
        else:
            sinks.append(WandbSink(run_dir, config.run.name, msgspec.to_builtins(config)))
    return sinks
