"""One rank's whole run once its inputs are validated (trainer/plan.py): the ring, the role's loop.

Local rank 0 of each node creates the node's ring and the others attach; a watchdog
turns a peer's death into this rank's exit; then the rank runs its role's session
(trainer/target_role.py, trainer/drafter_role.py) and leaves the ring cleanly, or marks
it failed so every peer stops within seconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from ringtrain.checkpoint import latest_checkpoint
from ringtrain.ring import PeerDied, Ring
from ringtrain.trainer import phases
from ringtrain.trainer.context import SessionContext
from ringtrain.trainer.drafter_role import run_drafter
from ringtrain.trainer.logs import FILE_ONLY, get_logger
from ringtrain.trainer.outcome import (
    DONE,
    STOPPED,
    Outcome,
    env_rank,
    launched,
    peer_failure,
    report_outcome,
)
from ringtrain.trainer.plan import ring_spec
from ringtrain.trainer.report import stop_line
from ringtrain.trainer.run_dir import read_run_id
from ringtrain.trainer.target_role import run_target

# How long a failed rank looks for a peer's death before reporting its own error, and how
# often it looks (see _peer_death).
PEER_DEATH_GRACE_S = 2.0
PEER_DEATH_POLL_S = 0.05


def join_ring(ctx: SessionContext) -> Ring:
    """Local rank 0 creates the node's ring, the others attach, then names are unlinked."""
    info = ctx.info
    spec = ring_spec(ctx.config, info, ctx.run_dir, ctx.plan)
    ring = Ring.create(spec, info.local_rank, info.device) if info.local_rank == 0 else None
    dist.barrier()
    if ring is None:
        ring = Ring.attach(spec.run_id, info.local_rank, info.device)
    dist.barrier()
    ring.unlink()
    ring.own_row.describe_work(phases.WORK[info.role])
    get_logger().info("ring %s ready: transport %s", spec.run_id, ring.transport)
    return ring


def _die_on_peer_death(ring: Ring, run_dir: Path):
    def on_dead(exc: PeerDied) -> None:
        # Under ringtrain-launch the launcher says it once, naming the rank that failed.
        get_logger().error("%s; stopping this rank", exc, extra=FILE_ONLY if launched() else None)
        for handler in get_logger().handlers:
            handler.flush()
        # Ranks that see this one abort then report the original death, not just the abort.
        ring.fail(str(exc))
        report_outcome(peer_failure(env_rank(), exc, run_dir, None))
        os._exit(1)

    return on_dead


def _launcher_alive() -> Callable[[], None]:
    """A check that raises PeerDied once the process that started this rank (torchrun's
    agent) is gone: its ranks run in sessions of their own, so a SIGKILL to the launcher
    reaches none of them, and without this they would train on with no one to stop them."""
    parent = os.getppid()

    def check() -> None:
        if os.getppid() != parent:
            raise PeerDied(
                f"the launcher of this rank (pid {parent}, torchrun's agent) is gone: "
                "killed, so nothing would stop this rank; it stops (resume the run with "
                "--resume)",
                label="launcher",
                primary=True,
            )

    return check


def run_session(ctx: SessionContext) -> Outcome:
    """Join the ring and run this rank's role; returns how it ended (exit code 0)."""
    ring = join_ring(ctx)
    ring.start_watchdog(_die_on_peer_death(ring, ctx.run_dir), _launcher_alive())
    step = None
    try:
        if ctx.info.is_target:
            run_target(ctx, ring)
        else:
            step = run_drafter(ctx, ring)
        if ctx.stop.requested:
            # torchrun sends SIGTERM to every rank when one of them died: that is a failure.
            ring.check_peers()
    except PeerDied as died:
        # Seen directly: checking again could find only what this rank left behind (a
        # frozen peer it killed reads as failed), not what it saw.
        ring.fail(str(died))
        raise
    except BaseException as exc:
        died = _peer_death(ring)
        # A collective or a copy fails when a peer died first (gloo/NCCL report only
        # "connection closed"): then the death, which names the rank, is the report.
        ring.fail(f"{type(exc).__name__}: {exc}" if died is None else str(died))
        if died is not None:
            raise died from exc
        raise
    ring.close(clean=True)
    return _session_end(ctx, step if ctx.info.is_lead_drafter else None)


def _session_end(ctx: SessionContext, step: int | None) -> Outcome:
    """How this rank's session ended; `step`: the lead drafter's last step (None on the
    other ranks). A stop on the lead drafter names the step and the newest checkpoint
    (ringtrain-launch prints it with the command to resume; under plain torchrun the lead
    drafter says it)."""
    stop = ctx.stop
    if not stop.requested:
        return Outcome(ctx.info.rank, 0, DONE, step=step)
    checkpoint = None
    if step is not None:
        checkpoint = latest_checkpoint(ctx.checkpoints, read_run_id(ctx.run_dir))
    outcome = Outcome(
        ctx.info.rank,
        0,
        STOPPED,
        signal=stop.signal_name,
        step=step,
        checkpoint=None if checkpoint is None else str(checkpoint),
    )
    if step is not None:
        line = stop_line(
            step, stop.signal_name, outcome.checkpoint, "the same command and --resume"
        )
        get_logger().info("%s", line, extra=FILE_ONLY if launched() else None)
    return outcome


def _peer_death(ring: Ring) -> PeerDied | None:
    """The death of a peer that this rank's failure may come from, looked for during
    PEER_DEATH_GRACE_S: a collective with a killed peer fails as soon as the peer's
    sockets close, a moment before its process leaves the process table."""
    deadline = time.monotonic() + PEER_DEATH_GRACE_S
    while True:
        try:
            ring.check_peers()
        except PeerDied as died:
            return died
        if time.monotonic() >= deadline:
            return None
        time.sleep(PEER_DEATH_POLL_S)
