"""What one rank's session runs with, handed to each part of it as one value."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ringtrain.config import Config
from ringtrain.trainer.groups import RankGroups
from ringtrain.trainer.plan import Plan
from ringtrain.trainer.roles import RankInfo
from ringtrain.trainer.signals import StopRequest


@dataclass(frozen=True)
class SessionContext:
    """One rank's session: the run's config, the rank's place in the run, the run
    directory, the validated inputs (with the checkpoint a resume continues from), the
    rank's process groups and its stop flag."""

    config: Config
    info: RankInfo
    run_dir: Path
    plan: Plan
    groups: RankGroups
    stop: StopRequest

    @property
    def checkpoints(self) -> Path:
        """The run's checkpoints root."""
        return self.run_dir / "checkpoints"
