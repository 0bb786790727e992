"""How the members of a target group follow their lead's decisions
(ringtrain/trainer/target_group.py).

Two real processes (gloo) share a sequence of decisions from a lead that is not rank 0:
every member gets each decision as the lead made it, in order. In this process: a rank
without a group keeps its own decision and exchanges nothing; a member waiting for a
decision refreshes its progress at every look, pauses between looks, checks its peers
once per ring wait timeout (a dead lead ends the wait), and a failed broadcast is raised,
not read as a decision.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from ringtrain.ring import RankHung
from ringtrain.trainer import target_group
from ringtrain.trainer.target_group import Decision, GroupDecisions
from tests.helpers.gloo_pair import run_pair

LEAD = 1  # the lead is the group's first rank; here the world's second, to tell them apart
DECISIONS = [Decision(True, False), Decision(True, True), Decision(False, True)]
WAIT_TIMEOUT_S = 1.0
PAUSE_S = 0.25  # the pause between two looks, on the clock the test sets


class RingStandIn:
    """The parts of a Ring a waiting member uses: its ring wait timeout, its own row's
    progress refresh and the check of its peers (which raises `peer_error` when set)."""

    def __init__(self, peer_error: Exception | None = None) -> None:
        self.spec = SimpleNamespace(wait_timeout_s=WAIT_TIMEOUT_S)
        self.refreshes, self.checks = 0, 0
        self.own_row = SimpleNamespace(waiting=self._refresh)
        self.peer_error = peer_error

    def _refresh(self) -> None:
        self.refreshes += 1

    def check_peers(self) -> None:
        self.checks += 1
        if self.peer_error is not None:
            raise self.peer_error


def member_worker(rank: int, out: str) -> None:
    """Rank `rank` of a group of two led by LEAD: shares DECISIONS, saves what it got."""
    group = dist.new_group([0, 1], backend="gloo")
    decisions = GroupDecisions(RingStandIn(), group, LEAD)
    got = [decisions.share(made if decisions.is_lead else None) for made in DECISIONS]
    pairs = [(decision.go, decision.eval_due) for decision in got]
    torch.save({"is_lead": decisions.is_lead, "got": pairs}, Path(out) / f"{rank}.pt")


def test_every_member_follows_the_lead_s_decisions_in_order(tmp_path: Path) -> None:
    member, lead = run_pair(member_worker, tmp_path)
    assert (member["is_lead"], lead["is_lead"]) == (False, True)
    made = [(decision.go, decision.eval_due) for decision in DECISIONS]
    assert member["got"] == made
    assert lead["got"] == made


def test_without_a_group_the_rank_s_own_decision_stands() -> None:
    """target_tp = 1: no process group exists (none is initialised here), nothing is sent."""
    decisions = GroupDecisions(RingStandIn(), None, lead_rank=3)
    assert decisions.is_lead
    for made in DECISIONS:
        assert decisions.share(made) is made


class WorkStandIn:
    """A pending broadcast that completes after `looks` looks; its wait raises `error`."""

    def __init__(self, looks: int, error: Exception | None = None) -> None:
        self.looks, self.error = looks, error
        self.waited = False

    def is_completed(self) -> bool:
        self.looks -= 1
        return self.looks < 0

    def wait(self) -> bool:
        self.waited = True
        if self.error is not None:
            raise self.error
        return True


class Clock:
    """time.monotonic and time.sleep of target_group: the time passes only in sleeps."""

    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, 0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(target_group, "time", clock)
    monkeypatch.setattr(target_group, "POLL_S", PAUSE_S)
    return clock


def test_a_waiting_member_refreshes_its_progress_at_every_look(clock: Clock) -> None:
    ring, work = RingStandIn(), WorkStandIn(looks=10)
    GroupDecisions(ring, None, 0)._await(work)
    assert (ring.refreshes, clock.sleeps) == (10, 10)  # a pause after each look
    assert work.waited


def test_a_waiting_member_checks_its_peers_once_per_ring_wait_timeout(clock: Clock) -> None:
    """Ten looks 0.25 s apart: the peers are checked at 1.0 s and 2.0 s."""
    ring = RingStandIn()
    GroupDecisions(ring, None, 0)._await(WorkStandIn(looks=10))
    assert ring.checks == 2


def test_a_dead_lead_ends_the_member_s_wait(clock: Clock) -> None:
    hung = RankHung("rank 0 (target, group 0 member 0) is hung", rank=0, primary=True)
    ring = RingStandIn(peer_error=hung)
    with pytest.raises(RankHung, match="rank 0"):
        GroupDecisions(ring, None, 0)._await(WorkStandIn(looks=10**6))
    assert clock.now == WAIT_TIMEOUT_S


def test_a_failed_broadcast_is_raised_not_read_as_a_decision(clock: Clock) -> None:
    failed = WorkStandIn(looks=0, error=RuntimeError("Connection closed by peer"))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        GroupDecisions(RingStandIn(), None, 0)._await(failed)
