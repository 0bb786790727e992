"""The one line that says how a launch ended, and its exit code (ringtrain-launch's report).

From the ranks' outcomes (trainer/outcome.py), the exit codes of the workers that torch's
launcher saw fail, and the signal the launcher itself received: a failure names the rank
that failed first, why, and that rank's log (a peer that found a rank hung or dead says
what happened to it, so a rank killed for being frozen is reported as what it was); a
stop names the step and the checkpoint to resume from.
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
    echoes = [outcome for outcome in outcomes if outcome.kind == PEER_FAILED]
    if killed:  # killed outright (out of memory, SIGKILL, a peer ending a frozen rank)
        rank, code = min(killed.items())
        seen = [outcome for outcome in echoes if outcome.culprit == rank]
        if seen:  # the peer that found it says what happened to it
            first = first_failure(seen)
            return shell_code(code), _failure_line(first, f"; rank {rank} {exit_text(code)}")
        return shell_code(code), f"rank {rank} {exit_text(code)} without reporting an error"
    own = [outcome for outcome in outcomes if outcome.kind in (REFUSED, FAILED)]
    if own:  # a rank's own error before its echoes
        first = min(own, key=lambda outcome: outcome.wall)
        return first.code or 1, _failure_line(first)
    if echoes:
        first = first_failure(echoes)
        return first.code or 1, _failure_line(first)
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


def first_failure(echoes: Sequence[Outcome]) -> Outcome:
    """Among the ranks that stopped for another's failure, the report of the rank that
    failed first: the earliest that saw a rank die or hang itself (primary), else, from
    the earliest report, follow each culprit to its own report while that one blames
    another rank (a peer that saw a peer fail)."""
    if primary := [outcome for outcome in echoes if outcome.primary]:
        return min(primary, key=lambda outcome: outcome.wall)
    by_rank = {outcome.rank: outcome for outcome in echoes}
    current = min(echoes, key=lambda outcome: outcome.wall)
    seen = {current.rank}
    while current.culprit is not None and current.culprit not in seen:
        blamed = by_rank.get(current.culprit)
        if blamed is None or blamed.culprit is None:
            break
        current = blamed
        seen.add(current.rank)
    return current


def _failure_line(outcome: Outcome, detail: str = "") -> str:
    """A failure's message, with the log that explains it (the culprit's, when named)."""
    log = outcome.culprit_log if outcome.culprit is not None else outcome.log
    return f"{outcome.message}{detail}" + (f" (its log: {log})" if log else "")


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
