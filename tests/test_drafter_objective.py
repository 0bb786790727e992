"""The block objective against first-principles references, on a tiny fp64 drafter (CPU)."""

from __future__ import annotations

import math
from dataclasses import replace

import msgspec
import pytest
import torch

from ringtrain.config import ConfigError, parse_config
from ringtrain.drafter import ObjectiveSums
from ringtrain.drafter.block_step import prepare_batch
from ringtrain.drafter.blocks import build_blocks, layout_sizes
from tests.helpers.tiny_drafter import DOCS, MAX_TOKENS, make_setup, objective, train

pytestmark = pytest.mark.usefixtures("one_thread")


def reference_weights(ces: dict[int, float], gamma: float, alpha: float | None) -> dict[int, float]:
    """Slot weights of one block from its scored slots' CE: decayed, or D-PACE with alpha."""
    if alpha is None:
        return {k: math.exp(-(k - 1) / gamma) for k in ces}
    reach, run = {}, 1.0
    for k in sorted(ces):
        run *= alpha + (1 - alpha) * math.exp(-ces[k])
        reach[k] = run
    return {k: sum(r for m, r in reach.items() if m >= k) for k in ces}


def reference_sums(
    model, head, batch, cfg, seed: int, gamma: float, alpha: float | None = None
) -> dict[str, object]:
    """The objective from the inference entry, one block and one label at a time."""
    blocks = build_blocks(
        batch, torch.Generator().manual_seed(seed), cfg,
        model.spec.mask_token_id, *layout_sizes(cfg, MAX_TOKENS),
    )  # fmt: skip
    ids, mask = batch.input_ids.tolist(), batch.loss_mask.tolist()
    block = cfg.block_size
    loss = weight = 0.0
    correct, counted = [0] * (block - 1), [0] * (block - 1)
    accepted = 0
    anchors = blocks.anchor[blocks.valid].tolist()
    for p in anchors:
        start, end = batch.doc_bounds(p)
        block_ids = torch.tensor([ids[p]] + [model.spec.mask_token_id] * (block - 1))
        positions = batch.position_ids[p].long() + torch.arange(block)
        logits = model.draft_logits(
            head, batch.hidden[start:p], batch.position_ids[start:p].long(), block_ids, positions
        )
        prefix_open = True
        ces = {}
        for k in range(1, block):
            scored = p + k < end and mask[p + k] == 1
            hit = scored and int(logits[k].argmax()) == ids[p + k]
            prefix_open = prefix_open and hit
            accepted += prefix_open
            if scored:
                ces[k] = float(torch.logsumexp(logits[k], 0) - logits[k, ids[p + k]])
                counted[k - 1] += 1
                correct[k - 1] += hit
        for k, w in reference_weights(ces, gamma, alpha).items():
            loss += w * ces[k]
            weight += w if alpha is None else 1.0
    return {
        "loss_sum": loss, "weight_sum": weight, "correct": correct, "counted": counted,
        "accepted_sum": accepted, "block_count": len(anchors),
    }  # fmt: skip


@pytest.fixture(scope="module")
def trained():
    """A drafter trained a little on one batch, so that some predictions are right."""
    cfg, model, head, batch = make_setup(sliding_windows=[0, 24])
    losses = train(model, head, batch, cfg, seeds=[0] * 25)
    return cfg, model, head, batch, losses


def test_a_few_optimizer_steps_lower_the_loss(trained) -> None:
    *_, losses = trained
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("seed", [0, 1])
def test_objective_equals_the_per_block_inference_reference(trained, seed: int) -> None:
    cfg, model, head, batch, _ = trained
    with torch.no_grad():
        sums = objective(model, head, batch, cfg, seed)
    ref = reference_sums(model, head, batch, cfg, seed, gamma=4.0)
    assert sum(ref["correct"]) > 0 and ref["accepted_sum"] > 0, "the check needs some hits"
    assert sum(ref["correct"]) < sum(ref["counted"]), "... and some misses"
    assert math.isclose(float(sums.loss_sum), ref["loss_sum"], rel_tol=1e-9)
    assert math.isclose(float(sums.weight_sum), ref["weight_sum"], rel_tol=1e-12)
    assert sums.correct.tolist() == ref["correct"]
    assert sums.counted.tolist() == ref["counted"]
    assert int(sums.accepted_sum) == ref["accepted_sum"]
    assert int(sums.block_count) == ref["block_count"]
    metrics = ObjectiveSums.summarise(sums.as_vector(), cfg.block_size)
    assert metrics["tau_uniform"] == pytest.approx(1 + ref["accepted_sum"] / ref["block_count"])


def test_dpace_objective_equals_the_per_block_reference(trained) -> None:
    cfg, model, head, batch, _ = trained
    cfg = msgspec.structs.replace(cfg, objective="dpace", dpace_alpha=0.3)
    with torch.no_grad():
        sums = objective(model, head, batch, cfg, seed=0)
    ref = reference_sums(model, head, batch, cfg, 0, gamma=4.0, alpha=0.3)
    assert math.isclose(float(sums.loss_sum), ref["loss_sum"], rel_tol=1e-9)
    assert float(sums.weight_sum) == ref["weight_sum"] == sum(ref["counted"])
    assert sums.counted.tolist() == ref["counted"]


def test_causal_sliding_objective_equals_the_per_block_inference_reference() -> None:
    cfg, model, head, batch = make_setup(sliding_attention="causal")
    _, bidirectional, *_ = make_setup()
    assert model.spec.sliding_causal and not bidirectional.spec.sliding_causal
    with torch.no_grad():
        sums = objective(model, head, batch, cfg, seed=1)
        other = objective(bidirectional, head, batch, cfg, seed=1)
    ref = reference_sums(model, head, batch, cfg, 1, gamma=4.0)
    assert math.isclose(float(sums.loss_sum), ref["loss_sum"], rel_tol=1e-9)
    assert abs(float(other.loss_sum) - ref["loss_sum"]) > 1e-6 * ref["loss_sum"]


def test_dpace_training_lowers_the_loss() -> None:
    cfg, model, head, batch = make_setup(objective="dpace")
    losses = train(model, head, batch, cfg, seeds=[0] * 15)
    assert losses[-1] < 0.8 * losses[0], losses


def block_outputs(model, head, batch, cfg, hidden, flex: bool):
    """Drafter outputs [A, B, H] of the blocks of `batch` with context `hidden`."""
    blocks, masks, workspace = prepare_batch(
        model, replace(batch, hidden=hidden), torch.Generator().manual_seed(0), cfg, MAX_TOKENS
    )
    if flex:
        by_window = workspace.builder.build(blocks.ctx_lo, blocks.ctx_hi, blocks.anchor)
        masks = tuple(by_window[w] for w in model.spec.sliding_windows)
    with torch.no_grad():
        out = model(
            blocks.ctx_features, blocks.ctx_positions, head.embed[blocks.block_ids],
            blocks.block_positions, masks,
        )  # fmt: skip
    return blocks, out.view(blocks.valid.shape[0], cfg.block_size, -1)


def test_context_is_strictly_before_the_anchor() -> None:
    """A block ignores its anchor's row, later rows and other documents; it sees row p - 1.

    Runs the dense-mask path; the flex path is tied to it by the test below and by the
    BlockMask-versus-reference test.
    """
    flex = False
    cfg, model, head, batch = make_setup(sliding_windows=[0, 0])
    blocks, base = block_outputs(model, head, batch, cfg, batch.hidden, flex)
    anchors = blocks.anchor.tolist()
    candidates = [
        a for a in torch.nonzero(blocks.valid).flatten().tolist()
        if anchors[a] > batch.doc_bounds(anchors[a])[0]
    ]  # fmt: skip
    docs_seen = set()
    for a in candidates:
        p = anchors[a]
        start, _ = batch.doc_bounds(p)
        if start in docs_seen:
            continue
        docs_seen.add(start)
        hidden = batch.hidden.clone()
        hidden[p:] += 1.0
        hidden[:start] += 1.0
        _, out = block_outputs(model, head, batch, cfg, hidden, flex)
        torch.testing.assert_close(out[a], base[a], rtol=0, atol=0, msg=f"anchor {p}")
        hidden = batch.hidden.clone()
        hidden[p - 1] += 1.0
        _, out = block_outputs(model, head, batch, cfg, hidden, flex)
        assert (out[a] - base[a]).abs().max() > 1e-6, f"anchor {p} must see row {p - 1}"
    assert len(docs_seen) == len(DOCS)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_block_mask_path_equals_dense_path() -> None:
    cfg, model, head, batch = make_setup(seed=2, sliding_windows=[0, 24])
    blocks, dense = block_outputs(model, head, batch, cfg, batch.hidden, flex=False)
    _, flex = block_outputs(model, head, batch, cfg, batch.hidden, flex=True)
    valid = blocks.valid
    torch.testing.assert_close(flex[valid], dense[valid], rtol=1e-9, atol=1e-9)


def test_draft_tokens_are_the_argmax_of_slots_one_on() -> None:
    cfg, model, head, batch = make_setup(sliding_windows=[0, 0])
    ctx, positions = batch.hidden[:20], batch.position_ids[:20].long()
    tokens = model.draft_tokens(head, ctx, positions, last_token=7, start_position=20)
    block_ids = torch.tensor([7] + [model.spec.mask_token_id] * (cfg.block_size - 1))
    logits = model.draft_logits(head, ctx, positions, block_ids, 20 + torch.arange(8))
    assert tokens.tolist() == logits[1:].argmax(-1).tolist()
    assert tokens.shape == (cfg.block_size - 1,)


@pytest.mark.parametrize(
    ("override", "key"),
    [("drafter.objective=ce", "objective"), ("drafter.dpace_alpha=1.5", "dpace_alpha")],
)
def test_bad_objective_settings_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"drafter\.{key}"):
        parse_config("", overrides=[override])
    assert parse_config("", overrides=["drafter.objective=dpace"]).drafter.objective == "dpace"


def test_two_drafters_sums_give_the_metrics_over_their_global_counts() -> None:
    """Sums add over drafters first; the metrics then divide by the global counts: the loss
    by the weight sum, accuracy by the scored labels (per slot and in all), tau_uniform
    by the blocks. Each count differs here, so any other normaliser shows."""
    one = ObjectiveSums(
        loss_sum=torch.tensor(6.0),
        weight_sum=torch.tensor(2.0),
        correct=torch.tensor([3.0, 1.0, 0.0]),
        counted=torch.tensor([4.0, 4.0, 2.0]),
        accepted_sum=torch.tensor(5.0),
        block_count=torch.tensor(4.0),
    )
    other = replace(one, loss_sum=torch.tensor(2.0), weight_sum=torch.tensor(4.0))
    summary = ObjectiveSums.summarise(one.plus(other).as_vector(), block_size=4)
    assert summary["loss"] == pytest.approx(8.0 / 6.0)
    assert summary["weight_sum"] == 6.0
    assert summary["accuracy_per_slot"] == pytest.approx([6 / 8, 2 / 8, 0.0])
    assert summary["accuracy"] == pytest.approx(8 / 20)
    assert summary["tau_uniform"] == pytest.approx(1.0 + 10 / 8)
    assert (summary["blocks"], summary["scored_labels"]) == (8.0, 20.0)
