"""What a rank's main thread tells the ring it is doing, in words (`ringtrain-stat` shows
them, and a hang is reported with them).

Announced phases get the ring's start-up allowance (ring.startup_timeout_s) until the
rank's next progress; a rank's steady work (`WORK`, by role) gets progress_timeout_s.
"""

from __future__ import annotations

from ringtrain.trainer.roles import DRAFTER, TARGET

LOADING_TARGET = "loading the target"
BUILDING_DRAFTER = "building the drafter (head, weights, checkpoint)"
FIRST_STEP = "its first step (compiling, autotuning)"
CHECKPOINT = "writing a checkpoint"
# Each role's steady work.
WORK = {TARGET: "producing batches", DRAFTER: "training"}
