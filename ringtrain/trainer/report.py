"""The one line that says how a launch ended, and its exit code (ringtrain-launch's report).

From the ranks' outcomes (trainer/outcome.py), the exit codes of the workers that torch's
launcher saw fail, and the signal the launcher itself received: a failure names the rank
that failed first and why; a stop names the step and the checkpoint to resume from.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from ringtrain.trainer.outcome import FAILED, PEER_FAILED, REFUSED, STOPPED, Outcome


def stop_line(step: int | None, signal_name: str, checkpoint: str | None, resume: str) -> str:
    """What a stop after start-up leaves: the step reached and the checkpoint to resume
    from (`resume`: how)."""
    if checkpoint is None:
        return f"stopped at step {step} ({signal_name}) before any checkpoint: nothing to resume"
    return f"stopped at step {step} ({signal_name}), checkpoint {checkpoint}: resume with {resume}"


def exit_text(code: int) -> str:
    """A worker's exit code in words: torch's launcher gives -N for signal N."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def shell_code(code: int) -> int:
    """The exit code a shell gives a process that ended so (128 + N for signal N)."""
    return 128 - code if code < 0 else code


def describe_end(
    outcomes: Sequence[Outcome],
    local_ranks: int,
    failures: dict[int, int],
    signal_name: str,
    resume: str,
) -> tuple[int, str]:
    """(exit code, line; empty when there is nothing to add to the ranks' own lines)."""
    reported = {outcome.rank for outcome in outcomes}
    silent = {rank: code for rank, code in failures.items() if rank not in reported}
    killed = {rank: code for rank, code in silent.items() if code < 0}
    if killed:  # killed outright (out of memory, SIGKILL): the others only saw it die
        rank, code = min(killed.items())
        return shell_code(code), f"rank {rank} {exit_text(code)} without reporting an error"
    for kinds in ((REFUSED, FAILED), (PEER_FAILED,)):  # a rank's own error before its echoes
        problems = [outcome for outcome in outcomes if outcome.kind in kinds]
        if problems:
            first = min(problems, key=lambda outcome: outcome.wall)
            where = f" (its log: {first.log})" if first.log else ""
            return first.code or 1, f"{first.message}{where}"
    if silent:
        rank, code = min(silent.items())
        return code, f"rank {rank} {exit_text(code)} without reporting an error"
    if signal_name and len(outcomes) < local_ranks:
        return 128 + signal.Signals[signal_name], (
            f"{signal_name}: {local_ranks - len(outcomes)} of {local_ranks} ranks did not stop "
            "within torch's shutdown timeout and were killed (torchrun's --shutdown-timeout "
            "gives them longer); the newest complete checkpoint is kept"
        )
    stopped = [outcome for outcome in outcomes if outcome.kind == STOPPED]
    return _stop_report(stopped, signal_name, resume) if stopped else (0, "")


def _stop_report(stopped: Sequence[Outcome], signal_name: str, resume: str) -> tuple[int, str]:
    """A stop: during start-up (some rank left with 128 + signal: nothing trained), or at
    a safe point with the lead drafter's step and checkpoint."""
    name = next((outcome.signal for outcome in stopped if outcome.signal), signal_name)
    code = max(outcome.code for outcome in stopped)
    if code:
        return (
            code,
            f"stopped by {name} during start-up: nothing trained yet, no checkpoint written",
        )
    lead = next((outcome for outcome in stopped if outcome.step is not None), None)
    if lead is None:
        return 0, f"stopped by {name}; every rank of this node stopped cleanly"
    return 0, stop_line(lead.step, name, lead.checkpoint, resume)
