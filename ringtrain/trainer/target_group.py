"""How the members of a tensor-parallel target group follow one sequence of batches.

A target group (`[layout] target_tp` > 1) is one producer on the ring: only its lead
(member 0) takes and publishes slots; the other members run the same forward into a
scratch buffer. The forward's collectives pair up only if every member runs the same
batch, and the members must stop at the same iteration. So the lead decides each
iteration -- go on (it holds a slot) or stop (the ring closed, or a stop was requested),
and whether an evaluation round starts with the next batch -- and broadcasts that
decision, two integers, over the group's gloo group before the forward.

A member waits for the decision while its lead waits for a free slot, which may take as
long as the drafters need. It polls the broadcast instead of blocking in it, so its main
thread refreshes its progress (it waits on its lead, it is not hung: a hung lead is named
by its own progress) and checks its peers every ring wait timeout, as a ring wait does.
Without a group (target_tp = 1) the rank's own decision stands and nothing is exchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringtrain.ring import Ring

# Pause between two looks at a pending broadcast (short next to any forward pass).
POLL_S = 0.0005


@dataclass(frozen=True)
class Decision:
    """What every member of a target group does in one iteration."""

    go: bool  # run the forward of the current batch (False: leave the loop)
    eval_due: bool  # the next batch starts an evaluation round, if none is in progress


class GroupDecisions:
    """The per-iteration decision of a target group: made by the lead, followed by all."""

    def __init__(self, ring: Ring, group: dist.ProcessGroup | None, lead_rank: int) -> None:
        """`group`: the target group's gloo group (trainer/groups.py), None without one."""
        self._ring, self._group, self._lead_rank = ring, group, lead_rank
        self.is_lead = group is None or dist.get_rank() == lead_rank
        self._buffer = torch.zeros(2, dtype=torch.int64)

    def share(self, decision: Decision | None) -> Decision:
        """The lead's `decision` (given on the lead, None on the other members), on every
        member of the group."""
        if self._group is None:
            assert decision is not None
            return decision
        if self.is_lead:
            assert decision is not None
            self._buffer.copy_(torch.tensor([decision.go, decision.eval_due]))
        work = dist.broadcast(self._buffer, src=self._lead_rank, group=self._group, async_op=True)
        self._await(work)
        go, eval_due = self._buffer.tolist()
        return Decision(go=bool(go), eval_due=bool(eval_due))

    def _await(self, work: dist.Work) -> None:
        """Wait for `work` with fresh progress and peer checks (see the module docstring)."""
        check_every_s = self._ring.spec.wait_timeout_s
        checked = time.monotonic()
        while not work.is_completed():
            self._ring.own_row.waiting()
            if time.monotonic() - checked >= check_every_s:
                self._ring.check_peers()
                checked = time.monotonic()
            time.sleep(POLL_S)
        work.wait()
