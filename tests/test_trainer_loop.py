"""The drafter's training loop and its bookkeeping, in one process without a ring.

DrafterLoop reads items through a `take` callable and talks to the ring through three
calls, so an in-memory stand-in (a list of items, a recorder of progress) drives it.
"""

from __future__ import annotations

import math

import msgspec
import pytest
import torch

from ringtrain.checkpoint.resume_record import ResumeRecord, StreamCursor, encode_resume_record
from ringtrain.config import Config, RunConfig
from ringtrain.data.config import DataConfig
from ringtrain.drafter import (
    EvalSums,
    FrozenHead,
    build_drafter,
    build_optimizer,
    drafter_spec_from_target,
)
from ringtrain.drafter.arch.dflash2.selector import SelectorSums
from ringtrain.trainer.batch_meta import BatchKind, BatchMeta
from ringtrain.trainer.drafter_loop import DrafterLoop, DrafterState, Trainee, anchor_seed
from ringtrain.trainer.heldout import EvalRounds, EvalTally
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.signals import StopRequest
from ringtrain.trainer.step_record import StepRecord
from ringtrain.trainer.step_sums import EVAL_ROUNDS_AHEAD, StepSums
from tests.helpers.drafter_loop_parts import ReporterStandIn, RingStandIn, RowStandIn, item
from tests.helpers.tiny_drafter import DOCS, MAX_TOKENS, TAPS, TARGET, make_cfg, paper_optim

BLOCK = make_cfg().block_size


def make_loop(
    ring: RingStandIn,
    max_steps: int,
    eval_every: int = 0,
    eval_batches: int = 0,
    max_nonfinite_steps: int = 10,
    **drafter: object,
) -> DrafterLoop:
    config = Config(
        run=RunConfig(max_steps=max_steps, eval_every=eval_every, checkpoint_every=2),
        data=DataConfig(token_budget=MAX_TOKENS),
        drafter=make_cfg(**drafter),
        optim=paper_optim(lr=1e-2, warmup_fraction=0.0, max_nonfinite_steps=max_nonfinite_steps),
    )
    torch.manual_seed(0)
    model = build_drafter(drafter_spec_from_target(TARGET, config.drafter, TAPS))
    embed, lm_head = torch.randn(2, 64, TARGET["hidden_size"]) * 0.5
    optimizer, scheduler = build_optimizer(model, config.optim, max_steps)
    trainee = Trainee(model, FrozenHead(embed, lm_head), optimizer, scheduler)
    return DrafterLoop(config, ring.take, ring, trainee, 0, 1, None, eval_batches)


def weights(loop: DrafterLoop) -> list[torch.Tensor]:
    return [p.detach().clone() for p in loop.trainee.model.parameters() if p.requires_grad]


def test_loop_trains_each_batch_once_evaluates_and_saves() -> None:
    items = [item(0), item(1), item(5, BatchKind.EVAL), item(2)]
    items.append(item(6, BatchKind.EVAL, round_id=2))
    ring, reporter, saved = RingStandIn(items), ReporterStandIn(), []
    loop = make_loop(ring, max_steps=3, eval_every=2, eval_batches=1)
    before = weights(loop)
    state = loop.train(
        DrafterState(0, BatchLedger()), StopRequest(), reporter, lambda s: saved.append(s.step)
    )
    assert state.step == 3 and ring.own_row.progress == [1, 2, 3]
    assert [r.step for r in reporter.steps] == [1, 2, 3]
    assert [r.batches for r in reporter.steps] == [[[0, 0, 100]], [[0, 1, 101]], [[0, 2, 102]]]
    assert all(r.tokens == sum(DOCS) and math.isfinite(r.loss) for r in reporter.steps)
    assert state.ledger.cursors() == {0: StreamCursor(start=3, skip=())}
    # The evaluation batch taken during step 3 completes round 1, due after step 2; the
    # one taken after the last step completes the last round, due after step 3.
    [(after_step, metrics), (last_step, last)] = reporter.evaluations
    assert after_step == 2 and metrics["round"] == 1 and metrics["tau_sim"] >= 1.0
    assert last_step == 3 and last["round"] == 2 and state.evaluated_step == 3
    assert saved == [2, 3]  # checkpoint_every = 2, and the last step
    assert all(not torch.equal(a, b) for a, b in zip(before, weights(loop), strict=True))


@pytest.mark.parametrize(("batches", "saves"), [(3, [2, 3]), (4, [2, 4])])
def test_loop_stops_after_the_last_complete_step_when_items_run_out(
    batches: int, saves: list[int]
) -> None:
    """Every step is reported, the last one too; the last step is saved once, also when
    it was a checkpoint step (checkpoint_every = 2)."""
    ring, reporter, saved = RingStandIn([item(i) for i in range(batches)]), ReporterStandIn(), []
    state = make_loop(ring, max_steps=10).train(
        DrafterState(0, BatchLedger()), StopRequest(), reporter, lambda s: saved.append(s.step)
    )
    assert state.step == batches and saved == saves
    assert [r.step for r in reporter.steps] == list(range(1, batches + 1))
    assert state.ledger.cursor(0) == StreamCursor(batches, ())


def test_a_resumed_session_owes_the_round_after_the_last_one_evaluated() -> None:
    """A session resumed after step 2, whose round 1 (due after step 2) was evaluated,
    completes round 2 (due after step 4) with its held-out batch."""
    items = [item(2), item(6, BatchKind.EVAL, round_id=2), item(3)]
    ring, reporter = RingStandIn(items), ReporterStandIn()
    loop = make_loop(ring, max_steps=4, eval_every=2, eval_batches=1)
    state = loop.train(DrafterState(2, BatchLedger(), evaluated_step=2), StopRequest(), reporter)
    assert state.step == 4 and state.evaluated_step == 4
    [(after_step, metrics)] = reporter.evaluations
    assert after_step == 4 and metrics["round"] == 2


def test_the_anchors_of_a_batch_follow_its_target_and_place() -> None:
    """The anchors' seed tells apart batches of one place in two targets' streams and two
    places in one stream, and is the same for the same batch."""
    seeds = {
        anchor_seed(7, BatchMeta(batch_id=0, epoch=0, seq=seq, producer=producer))
        for producer in (0, 1)
        for seq in (0, 1)
    }
    assert len(seeds) == 4
    assert anchor_seed(7, BatchMeta(batch_id=5, epoch=1, seq=1, producer=1)) in seeds


def test_stop_request_discards_the_step_and_trains_nothing() -> None:
    stop = StopRequest()
    stop.request("SIGTERM")
    ring = RingStandIn([item(0)])
    loop = make_loop(ring, max_steps=2)
    before = weights(loop)
    state = loop.train(DrafterState(0, BatchLedger()), stop)
    assert state.step == 0 and ring.own_row.progress == [] and len(ring.items) == 1
    assert all(torch.equal(a, b) for a, b in zip(before, weights(loop), strict=True))


class WeightsAfterEachStep(RowStandIn):
    """The rank's row, keeping the weights and fc's first AdamW moment as each step left
    them: the loop records a step's progress right after queuing its update (its record
    reaches the reporter a step later)."""

    def __init__(self, loop: DrafterLoop) -> None:
        super().__init__()
        self.loop = loop
        self.weights: list[list[torch.Tensor]] = []
        self.moments: list[torch.Tensor] = []

    def record_progress(self, count: int) -> None:
        super().record_progress(count)
        self.weights.append(weights(self.loop))
        state = self.loop.trainee.optimizer.state[self.loop.trainee.model.fc.weight]
        self.moments.append(state["exp_avg"].clone())


def weights_after_each_step(ring: RingStandIn, loop: DrafterLoop) -> WeightsAfterEachStep:
    ring.own_row = row = WeightsAfterEachStep(loop)
    return row


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_step_with_a_non_finite_loss_is_skipped_and_training_goes_on() -> None:
    ring = RingStandIn([item(0), item(1, poison=True), item(2)])
    loop = make_loop(ring, max_steps=3)
    row, reporter = weights_after_each_step(ring, loop), ReporterStandIn()
    state = loop.train(DrafterState(0, BatchLedger()), StopRequest(), reporter)
    assert [r.skipped for r in reporter.steps] == [False, True, False]
    assert math.isnan(reporter.steps[1].loss) and reporter.steps[1].grad_norm is None
    after_1, after_2, after_3 = row.weights
    assert same(after_1, after_2) and not same(after_2, after_3)
    # The poisoned batch was consumed: a resume does not meet it again; the schedule
    # advanced over the skipped step too.
    assert state.step == 3 and state.ledger.cursor(0) == StreamCursor(3, ())
    assert loop.trainee.scheduler.last_epoch == 3


def test_a_step_is_reported_once_the_next_update_is_queued() -> None:
    """The step's gradient norm is read after the next step's forward, and its record
    handed over once the next update is queued, so the report never holds back a
    backward; a checkpoint step's and the last step's at once."""
    ring = RingStandIn([item(0), item(1), item(2)])
    loop = make_loop(ring, max_steps=3)  # a checkpoint every 2 steps
    row = weights_after_each_step(ring, loop)

    class WeightsWhenReported(ReporterStandIn):
        def __init__(self) -> None:
            super().__init__()
            self.weights: list[list[torch.Tensor]] = []

        def step(self, record: StepRecord) -> None:
            super().step(record)
            self.weights.append(weights(loop))

    reporter, saved = WeightsWhenReported(), []
    loop.train(DrafterState(0, BatchLedger()), StopRequest(), reporter, saved.append)
    assert [r.step for r in reporter.steps] == [1, 2, 3] and len(saved) == 2
    assert not same(row.weights[0], row.weights[1])
    assert same(reporter.weights[0], row.weights[1])  # step 1's report: step 2 updated
    assert same(reporter.weights[1], row.weights[1])  # step 2 checkpointed: at once
    assert same(reporter.weights[2], row.weights[2])


def test_step_with_an_exploding_gradient_is_skipped_optimizer_state_and_all() -> None:
    ring = RingStandIn([item(0), item(1), item(2)])
    loop = make_loop(ring, max_steps=3)
    backwards = []

    def explode_on_step_2(grad: torch.Tensor) -> torch.Tensor:
        backwards.append(None)
        return grad * math.inf if len(backwards) == 2 else grad

    loop.trainee.model.fc.weight.register_hook(explode_on_step_2)
    row, reporter = weights_after_each_step(ring, loop), ReporterStandIn()
    loop.train(DrafterState(0, BatchLedger()), StopRequest(), reporter)
    assert [r.skipped for r in reporter.steps] == [False, True, False]
    assert math.isfinite(reporter.steps[1].loss)
    assert not math.isfinite(reporter.steps[1].grad_norm)
    assert same(row.weights[0], row.weights[1]) and torch.equal(*row.moments[:2])
    assert not same(row.weights[1], row.weights[2])
    assert all(torch.isfinite(w).all() for w in row.weights[2])


def test_a_run_of_non_finite_steps_stops_naming_the_count() -> None:
    """The third step's record says the limit is reached: the run stops before the
    fourth step's update, which would have followed the last finite one."""
    ring = RingStandIn([item(0), item(1, poison=True), item(2, poison=True), item(3)])
    loop = make_loop(ring, max_steps=4, max_nonfinite_steps=2)
    row, reporter = weights_after_each_step(ring, loop), ReporterStandIn()
    with pytest.raises(FloatingPointError, match=r"2 steps in a row \(up to step 3\).*"
                       r"optim.max_nonfinite_steps = 2"):  # fmt: skip
        loop.train(DrafterState(0, BatchLedger()), StopRequest(), reporter)
    assert [r.skipped for r in reporter.steps] == [False, True, True]
    assert same(row.weights[0], weights(loop)) and len(row.weights) == 3


def test_skipped_steps_apart_never_stop_the_run() -> None:
    """optim.max_nonfinite_steps counts skipped steps in a row: an applied step between two
    skipped ones starts the count again."""
    items = [item(0, poison=True), item(1), item(2, poison=True), item(3)]
    ring, reporter = RingStandIn(items), ReporterStandIn()
    loop = make_loop(ring, max_steps=4, max_nonfinite_steps=2)
    state = loop.train(DrafterState(0, BatchLedger()), StopRequest(), reporter)
    assert state.step == 4 and [r.skipped for r in reporter.steps] == [True, False, True, False]


def test_a_steps_metrics_line_holds_each_loss_part_beside_the_loss() -> None:
    record = StepRecord(
        step=3, loss=2.5, accuracy=[0.5], tau_uniform=1.5, tokens=64, seconds=0.1, lr=1e-3,
        batches=[[0, 2, 102]], wall=0.0, compiles=1, gpu_busy=None, gpu_busy_by_rank={},
        loss_parts={"selector_loss": 0.25},
    )  # fmt: skip
    line = record.as_json()
    assert "loss_parts" not in line and line["selector_loss"] == 0.25
    keys = list(line)
    assert keys[keys.index("loss") + 1] == "selector_loss"


def objective_sums(scale: float, block_size: int = BLOCK) -> SelectorSums:
    """Sums with a loss part (DFlash2's) of a quarter of the loss."""
    slots = block_size - 1
    return SelectorSums(
        loss_sum=torch.tensor(2.0 * scale), weight_sum=torch.tensor(4.0 * scale),
        correct=torch.arange(slots, dtype=torch.float64) * scale,
        counted=torch.full((slots,), 10.0 * scale), accepted_sum=torch.tensor(6.0 * scale),
        block_count=torch.tensor(3.0 * scale), selector_loss_sum=torch.tensor(0.5 * scale),
    )  # fmt: skip


def eval_sums(scale: float) -> EvalSums:
    return EvalSums(
        objective_sums(scale),
        replay_tokens=torch.tensor(9.0 * scale),
        replay_steps=torch.tensor(3.0 * scale),
    )


def test_step_sums_sections_read_back_by_name_and_start_afresh() -> None:
    sums = StepSums(BLOCK, drafters=3, device=torch.device("cpu"), sums_type=SelectorSums)
    meta = BatchMeta(batch_id=7, epoch=1, seq=4, producer=2)
    sums.add_training(1, objective_sums(1.0), tokens=120, meta=meta)
    sums.add_evaluation(eval_sums(1.0))
    sums.add_evaluation(eval_sums(2.0))
    reduced = sums.reduce(None)
    assert not reduced.stopped and reduced.tokens == 120
    assert reduced.batches == [[0, 0, 0], [2, 4, 7], [0, 0, 0]]
    assert torch.equal(reduced.objective, objective_sums(1.0).as_vector())
    assert reduced.summary()["loss"] == 0.5 and reduced.summary()["tau_uniform"] == 3.0
    assert reduced.summary()["selector_loss"] == 0.125
    step_metrics = reduced.step_metrics(reduced.summary())
    assert step_metrics["loss"] == 0.5 and step_metrics["loss_parts"] == {"selector_loss": 0.125}
    assert step_metrics["accuracy"] == reduced.summary()["accuracy_per_slot"]
    assert reduced.eval_batches == [2, 0, 0, 0]
    assert torch.equal(reduced.eval[0], eval_sums(3.0).as_vector())
    assert not sums.vector.any()
    sums.request_stop()
    assert sums.reduce(None).stopped and not sums.reduce(None).stopped


def test_each_drafters_batch_identity_is_kept_apart_from_the_stop_flag() -> None:
    sums = StepSums(BLOCK, drafters=2, device=torch.device("cpu"), sums_type=SelectorSums)
    sums.add_training(0, objective_sums(1.0), 60, BatchMeta(batch_id=5, epoch=0, seq=3, producer=1))
    sums.add_training(1, objective_sums(1.0), 60, BatchMeta(batch_id=9, epoch=0, seq=8, producer=0))
    reduced = sums.reduce(None)
    assert not reduced.stopped and reduced.batches == [[1, 3, 5], [0, 8, 9]]


@pytest.mark.parametrize("ahead", [EVAL_ROUNDS_AHEAD, -1])
def test_a_held_out_batch_of_a_round_a_step_cannot_carry_is_refused_by_name(ahead: int) -> None:
    sums = StepSums(BLOCK, drafters=1, device=torch.device("cpu"), sums_type=SelectorSums)
    sums.add_evaluation(eval_sums(1.0), ahead=EVAL_ROUNDS_AHEAD - 1)
    with pytest.raises(RuntimeError, match=rf"{ahead} rounds after .* {EVAL_ROUNDS_AHEAD} rounds"):
        sums.add_evaluation(eval_sums(1.0), ahead=ahead)
    assert sums.reduce(None).eval_batches == [0] * (EVAL_ROUNDS_AHEAD - 1) + [1]


def test_eval_tally_completes_a_round_by_batch_count() -> None:
    tally = EvalTally(total_batches=3, block_size=BLOCK, sums_type=SelectorSums)
    vector = eval_sums(1.0).as_vector()
    none = torch.zeros_like(vector)
    assert tally.absorb([0, 0], [none, none]) == []
    assert tally.absorb([2, 0], [2 * vector, none]) == []
    [metrics] = tally.absorb([1, 0], [vector, none])
    assert metrics == EvalSums.summarise(3 * vector, SelectorSums, BLOCK)
    assert metrics["tau_sim"] == 3.0 and tally.next_round == 2
    assert tally.absorb([3, 0], [5 * vector, none]) == [
        EvalSums.summarise(5 * vector, SelectorSums, BLOCK)
    ]


def test_a_step_that_meets_two_rounds_keeps_the_next_rounds_batches_for_it() -> None:
    """Two targets' shards of a round boundary in one step: one target's last batch of
    round 1 and the other's first of round 2. Round 2's batch must count for round 2 (a
    tally that counted it for round 1 left round 2 a batch short and the run's last
    round never complete)."""
    tally = EvalTally(total_batches=2, block_size=BLOCK, sums_type=SelectorSums, next_round=1)
    one, two = eval_sums(1.0).as_vector(), eval_sums(2.0).as_vector()
    sums = StepSums(BLOCK, drafters=1, device=torch.device("cpu"), sums_type=SelectorSums)
    sums.add_evaluation(eval_sums(1.0), tally.ahead(1))
    assert tally.absorb(*_eval_sections(sums)) == []
    sums.add_evaluation(eval_sums(1.0), tally.ahead(1))
    sums.add_evaluation(eval_sums(2.0), tally.ahead(2))
    assert tally.absorb(*_eval_sections(sums)) == [EvalSums.summarise(2 * one, SelectorSums, BLOCK)]
    sums.add_evaluation(eval_sums(2.0), tally.ahead(2))
    assert tally.absorb(*_eval_sections(sums)) == [EvalSums.summarise(2 * two, SelectorSums, BLOCK)]
    with pytest.raises(RuntimeError, match="rounds after the round being completed"):
        sums.add_evaluation(eval_sums(1.0), tally.ahead(2))  # a round already complete


def _eval_sections(sums: StepSums) -> tuple[list[int], list[torch.Tensor]]:
    reduced = sums.reduce(None)
    return reduced.eval_batches, reduced.eval


def test_eval_rounds_every_eval_every_steps_and_after_the_last() -> None:
    rounds = EvalRounds(eval_every=20, max_steps=50)
    assert rounds.count == 3
    assert [rounds.step_of(k) for k in (1, 2, 3)] == [20, 40, 50]
    assert [rounds.done_by(step) for step in (0, 19, 20, 40, 50)] == [0, 0, 1, 2, 3]
    assert EvalRounds(eval_every=10, max_steps=40).count == 4
    assert EvalRounds(eval_every=0, max_steps=40).count == 0


def test_ledger_keeps_a_prefix_and_the_later_batches_and_refuses_repeats() -> None:
    ledger = BatchLedger()
    for target, seq in [(0, 1), (0, 3), (1, 0), (0, 0)]:
        ledger.record(target, seq)
    assert ledger.cursor(0) == StreamCursor(2, (3,)) and ledger.cursor(1).start == 1
    assert ledger.cursor(5) == StreamCursor(0, ())
    with pytest.raises(RuntimeError, match="batch 1 of target 0 was trained twice"):
        ledger.record(0, 1)
    with pytest.raises(RuntimeError, match="batch 3 of target 0 was trained twice"):
        ledger.record(0, 3)
    saved = encode_resume_record(ResumeRecord(step=1, cursors=ledger.cursors()))
    resumed = BatchLedger(msgspec.json.decode(saved, type=ResumeRecord).cursors)
    assert (
        resumed.cursors() == ledger.cursors() == {0: StreamCursor(2, (3,)), 1: StreamCursor(1, ())}
    )
    resumed.record(0, 2)
    assert resumed.cursor(0) == StreamCursor(4, ())


@pytest.mark.parametrize(
    "drafter",
    [{}, {"architecture": "dflash2", "objective": "dpace"}],
    ids=["dflash-decayed_ce", "dflash2-dpace"],
)
def test_compiling_ahead_leaves_the_drafter_and_its_training_unchanged(drafter: dict) -> None:
    """The forward and backward that compile the drafter before its first batch leave no
    gradient, weight, optimizer or schedule change: the steps after it equal those of a
    loop that did not run it, weight for weight."""
    runs = []
    for ahead in (False, True):
        ring = RingStandIn([item(0), item(1), item(2)])
        loop = make_loop(ring, max_steps=3, **drafter)
        before = weights(loop)
        if ahead:
            loop.compile_ahead()
            assert all(p.grad is None for p in loop.trainee.model.parameters())
            assert all(torch.equal(a, b) for a, b in zip(before, weights(loop), strict=True))
            assert loop.trainee.scheduler.last_epoch == 0
        loop.train(DrafterState(0, BatchLedger()), StopRequest())
        runs.append((weights(loop), loop.trainee.optimizer.state_dict()["state"]))
    (plain, plain_state), (ahead, ahead_state) = runs
    assert all(torch.equal(a, b) for a, b in zip(plain, ahead, strict=True))
    assert plain_state.keys() == ahead_state.keys()
    for key, values in plain_state.items():
        for name, value in values.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(ahead_state[key][name]))
