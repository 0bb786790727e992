"""Drafter evaluation: every decoding anchor, and the replay of speculative decoding (CPU)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ringtrain.compile_caches import compiled_graph_count
from ringtrain.drafter import (
    DFlashDrafter,
    EvalSums,
    FrozenHead,
    block_objective,
    block_step,
    build_drafter,
    build_optimizer,
    drafter_spec_from_target,
    evaluate_batch,
    optimizer_step,
)
from ringtrain.drafter.blocks import pack_context
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.heldout import replay_sums
from ringtrain.drafter.loss import HeadLoss
from ringtrain.eval import VerifyingTarget, greedy_generate, speculative_generate
from ringtrain.eval.dflash import DFlashBlockDrafter
from ringtrain.eval.graphed_drafts import FixedShapeProposals
from ringtrain.generate.model import load_causal_lm
from ringtrain.packed_batch import PackedBatch, random_packed_batch
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.tiny_drafter import (
    MAX_TOKENS,
    TAPS,
    TARGET,
    make_cfg,
    make_setup,
    objective,
    paper_optim,
    train,
)

pytestmark = pytest.mark.usefixtures("one_thread")

DFLASH2 = {"architecture": "dflash2", "selector_rank": 8, "selector_top_k": 4}


def spans_of(mask: list[int], bounds: list[int]) -> list[tuple[int, int]]:
    """(q, r) of every maximal run of mask == 1 inside a document."""
    spans = []
    for start, end in itertools.pairwise(bounds):
        p = start
        while p < end:
            if not mask[p]:
                p += 1
                continue
            r = p
            while r + 1 < end and mask[r + 1]:
                r += 1
            spans.append((p, r))
            p = r + 1
    return spans


def walk(mask: list[int], bounds: list[int], accepted: list[int]) -> tuple[int, int, list[int]]:
    """Reference replay, one anchor at a time: (tokens, steps, anchors visited)."""
    tokens = steps = 0
    visited = []
    for q, r in spans_of(mask, bounds):
        p = q
        while p < r:
            visited.append(p)
            steps += 1
            tokens += accepted[p] + 1
            p += accepted[p] + 1
    return tokens, steps, visited


def packed_of(mask: list[int], bounds: list[int]):
    """A PackedContext of the given loss mask and documents (features do not matter here)."""
    n = len(mask)
    batch = PackedBatch(
        hidden=torch.zeros(n, 1),
        input_ids=torch.zeros(n, dtype=torch.int32),
        loss_mask=torch.tensor(mask, dtype=torch.uint8),
        position_ids=torch.zeros(n, dtype=torch.int32),
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32),
        num_tokens=n,
        num_docs=len(bounds) - 1,
    )
    return pack_context(batch, ctx_capacity=n + 5)


def replay(mask: list[int], bounds: list[int], accepted: list[int]) -> tuple[int, int]:
    packed = packed_of(mask, bounds)
    padded = torch.tensor(accepted + [7] * (packed.eligible.shape[0] - len(accepted)))
    tokens, steps = replay_sums(packed, padded)
    return int(tokens), int(steps)


def test_replay_by_hand() -> None:
    # doc 0 = rows 0..11: prompt 0..2, span 3..7, prompt row 8, span 9..11 (to the doc end).
    # doc 1 = rows 12..17: span 12..13 right at the doc start, prompt 14, one-row span 15,
    # prompt 16..17.
    mask = [0, 0, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 0]
    bounds = [0, 12, 18]
    accepted = [9] * len(mask)  # rows that are no anchor must be ignored
    accepted[3:7] = [1, 0, 2, 0]  # 3 -> 5 -> 8 (>= r = 7): 2 steps, 5 tokens
    accepted[9:11] = [0, 1]  # 9 -> 10 -> 12: 2 steps, 3 tokens
    accepted[12] = 1  # 12 -> 14: 1 step, 2 tokens; the one-row span 15 has no anchor
    assert replay(mask, bounds, accepted) == (5 + 3 + 2, 2 + 2 + 1)
    assert walk(mask, bounds, accepted)[:2] == (10, 5)


@pytest.mark.parametrize("seed", range(6))
def test_replay_equals_the_reference_walk(seed: int) -> None:
    rng = np.random.default_rng(seed)
    block = int(rng.integers(2, 9))
    lens = [int(n) for n in rng.integers(1, 60, size=int(rng.integers(1, 6)))]
    bounds = [0, *np.cumsum(lens).tolist()]
    mask = (rng.random(bounds[-1]) < 0.8).astype(int).tolist()
    accepted = [0] * len(mask)
    for q, r in spans_of(mask, bounds):
        for p in range(q, r):
            accepted[p] = int(rng.integers(0, min(block - 1, r - p) + 1))
    tokens, steps, _ = walk(mask, bounds, accepted)
    assert replay(mask, bounds, accepted) == (tokens, steps)


def evaluate(model, head, batch: PackedBatch, cfg: DrafterConfig, max_tokens: int = MAX_TOKENS):
    return evaluate_batch(
        model, head, batch, cfg, max_tokens,
    )  # fmt: skip


def test_oracle_drafter_right_on_j_slots_gives_tau_sim_j_plus_one(monkeypatch) -> None:
    """Slots 1..j always right, the rest always wrong: decoding gains j + 1 per step."""
    block, j = 8, 3
    cfg = make_cfg(max_anchors=16)  # several chunks per batch
    _, model, head, _ = make_setup()
    prompt, response = 9, 1 + 20 * (j + 1)  # r - q = 80: the walk lands on r exactly
    doc = prompt + response
    batch = random_packed_batch([doc, doc], 3 * 32, 64, "cpu", torch.float64, 0, prompt / doc)

    def scripted_loss(hidden, weight, labels, row_weights, chunk, fns):
        slot = torch.arange(hidden.shape[0]) % (block - 1) + 1
        none = labels.new_empty((len(slot), 0))
        return HeadLoss(row_weights.sum() * 0.0, slot <= j, none, none.to(hidden.dtype))

    monkeypatch.setattr(block_step, "chunked_head_loss", scripted_loss)
    sums = evaluate(model, head, batch, cfg, max_tokens=2 * doc)
    metrics = EvalSums.summarise(sums.as_vector(), type(sums.blocks), block)
    assert metrics["tau_sim"] == j + 1
    assert metrics["replay_steps"] == 2 * 20
    assert metrics["replay_tokens"] == 2 * (response - 1)
    # Uniform anchors q .. r - 1 accept min(j, r - p): j everywhere but near the end.
    per_span = [min(j, response - 1 - i) for i in range(response - 1)]
    assert int(sums.blocks.block_count) == 2 * len(per_span)
    assert metrics["tau_uniform"] == pytest.approx(1 + sum(per_span) / len(per_span))
    assert metrics["tau_uniform"] < metrics["tau_sim"]
    assert metrics["accuracy_per_slot"][:j] == [1.0] * j
    assert metrics["accuracy_per_slot"][j:] == [0.0] * (block - 1 - j)


@pytest.fixture(scope="module")
def trained():
    """A drafter trained a little on one batch, so that some predictions are right."""
    cfg, model, head, batch = make_setup()
    train(model, head, batch, cfg, seeds=range(25))
    return cfg, model, head, batch


def test_evaluation_runs_without_grad_and_changes_nothing(trained) -> None:
    cfg, model, head, batch = trained
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    sums = evaluate(model, head, batch, cfg)
    vector = sums.as_vector()
    assert torch.isfinite(vector).all()
    assert not any(getattr(sums.blocks, name).requires_grad for name in ("loss_sum", "correct"))
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    metrics = EvalSums.summarise(vector, type(sums.blocks), cfg.block_size)
    assert metrics["replay_steps"] > 0 and 1.0 <= metrics["tau_sim"] <= cfg.block_size
    assert metrics["tau_uniform"] > 1.0, "the checks below need some accepted drafts"


def test_evaluation_equals_the_objective_over_every_anchor(trained) -> None:
    """Training with a quota of every eligible row samples exactly the evaluation anchors."""
    _, model, head, batch = trained
    every = make_cfg(num_anchors=40, max_anchors=MAX_TOKENS + 96)  # quota = doc length
    ours = evaluate(model, head, batch, make_cfg(max_anchors=16)).blocks
    with torch.no_grad():
        theirs = objective(model, head, batch, every, seed=0)
    assert math.isclose(float(ours.loss_sum), float(theirs.loss_sum), rel_tol=1e-9)
    assert math.isclose(float(ours.weight_sum), float(theirs.weight_sum), rel_tol=1e-12)
    for name in ("correct", "counted", "accepted_sum", "block_count"):
        assert getattr(ours, name).tolist() == getattr(theirs, name).tolist(), name


def accepted_by_inference(model, head, batch: PackedBatch, block: int) -> dict[int, int]:
    """a(p) at every decoding anchor p from the inference entry (the drafter's own
    `propose`), one block at a time."""
    ids, mask = batch.input_ids.tolist(), batch.loss_mask.tolist()
    accepted = {}
    for start, end in itertools.pairwise(batch.cu_seqlens.tolist()):
        for p in range(start, end - 1):
            if not (mask[p] and mask[p + 1]):
                continue
            block_ids = torch.tensor([ids[p]] + [model.spec.mask_token_id] * (block - 1))
            drafts = model.propose(
                head, batch.hidden[start:p], batch.position_ids[start:p].long(), block_ids,
                batch.position_ids[p].long() + torch.arange(block),
            ).tolist()  # fmt: skip
            accepted[p] = 0
            for k in range(1, block):
                if p + k >= end or not mask[p + k] or drafts[k - 1] != ids[p + k]:
                    break
                accepted[p] += 1
    return accepted


def test_tau_sim_equals_a_replay_of_inference_drafts(trained) -> None:
    cfg, model, head, batch = trained
    accepted = accepted_by_inference(model, head, batch, cfg.block_size)
    per_row = [accepted.get(p, 0) for p in range(batch.num_tokens)]
    tokens, steps, visited = walk(batch.loss_mask.tolist(), batch.cu_seqlens.tolist(), per_row)
    assert any(per_row[p] for p in visited), "the check needs accepted drafts on the walk"
    sums = evaluate(model, head, batch, make_cfg(max_anchors=16))
    assert (int(sums.replay_tokens), int(sums.replay_steps)) == (tokens, steps)
    assert int(sums.blocks.accepted_sum) == sum(accepted.values())
    assert int(sums.blocks.block_count) == len(accepted)


def test_dflash2_tau_sim_replays_the_selector_walk_not_the_argmax() -> None:
    """A DFlash2 drafter whose successor codebook makes its walk leave the argmax path:
    tau_sim is the replay of what `propose` (the walk) drafts, and differs from the
    replay of each slot's argmax."""
    cfg, _, head, batch = make_setup(0, **DFLASH2)
    torch.manual_seed(0)
    model = build_drafter(drafter_spec_from_target(TARGET, cfg, TAPS)).double()
    train(model, head, batch, cfg, seeds=range(25))
    selector = model.candidate_selector
    with torch.no_grad():
        selector.successor_codebook.normal_(std=3.0, generator=torch.Generator().manual_seed(1))
    mask, bounds = batch.loss_mask.tolist(), batch.cu_seqlens.tolist()
    walked = accepted_by_inference(model, head, batch, cfg.block_size)
    selector.top_k = 1  # a walk over one candidate is each slot's argmax
    argmax = accepted_by_inference(model, head, batch, cfg.block_size)
    selector.top_k = DFLASH2["selector_top_k"]
    want = walk(mask, bounds, [walked.get(p, 0) for p in range(batch.num_tokens)])
    by_argmax = walk(mask, bounds, [argmax.get(p, 0) for p in range(batch.num_tokens)])
    assert want[0] > want[1], "the check needs accepted drafts on the walk"
    assert want[:2] != by_argmax[:2], "the check needs a walk that leaves the argmax"
    sums = evaluate(model, head, batch, make_cfg(max_anchors=16, **DFLASH2))
    assert (int(sums.replay_tokens), int(sums.replay_steps)) == want[:2]
    assert int(sums.blocks.accepted_sum) == sum(walked.values())


def test_tau_sim_equals_tau_real_of_speculative_decoding(tmp_path: Path) -> None:
    """On a target's own greedy responses, the replay is speculative decoding step by step."""
    target = VerifyingTarget(
        load_causal_lm(build_tiny_target(tmp_path, seed=4, hybrid=False), dtype="float32").double(),
        TAPS,
        mode="cache",
    )
    prompt_len, new_tokens = 10, 40
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (prompt_len,), generator=gen) for _ in range(3)]
    docs = [p.tolist() + greedy_generate(target, p, new_tokens).tokens for p in prompts]
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor(docs), output_hidden_states=True)
    taps = torch.cat([out.hidden_states[layer + 1] for layer in TAPS], dim=-1)
    doc_len = prompt_len + new_tokens
    batch = PackedBatch(
        hidden=taps.reshape(len(docs) * doc_len, -1).clone(),
        input_ids=torch.tensor(docs, dtype=torch.int32).flatten(),
        loss_mask=(torch.arange(doc_len) >= prompt_len).to(torch.uint8).repeat(len(docs)),
        position_ids=torch.arange(doc_len, dtype=torch.int32).repeat(len(docs)),
        cu_seqlens=torch.arange(len(docs) + 1, dtype=torch.int32) * doc_len,
        num_tokens=len(docs) * doc_len,
        num_docs=len(docs),
    )
    cfg = make_cfg(sliding_windows=[], num_anchors=40, anchor_ref_len=doc_len)
    torch.manual_seed(0)
    model = DFlashDrafter(drafter_spec_from_target(target.model.config, cfg, TAPS)).double()
    lm = target.model
    head = FrozenHead(lm.get_input_embeddings().weight, lm.get_output_embeddings().weight)
    train(model, head, batch, cfg, seeds=range(30), max_tokens=batch.num_tokens)

    model.eval().requires_grad_(False)
    proposals = FixedShapeProposals(model, head, doc_len, target.tap_width, target.dtype, False)
    drafter = DFlashBlockDrafter(proposals)
    tokens = steps = 0
    for prompt, doc in zip(prompts, docs, strict=True):
        decoded = speculative_generate(target, drafter, prompt, new_tokens)
        assert decoded.tokens == doc[prompt_len:]
        anchor = 0  # response coordinates: the prefill produced token 0, the first anchor
        for count in decoded.accepted:
            # The replay stops accepting at the response end; decoding may match past it.
            tokens += min(count, new_tokens - 1 - anchor) + 1
            steps += 1
            anchor += count + 1
    assert tokens > steps, "the check needs accepted drafts"
    sums = evaluate(model, head, batch, cfg, max_tokens=batch.num_tokens)
    assert (int(sums.replay_tokens), int(sums.replay_steps)) == (tokens, steps)
    metrics = EvalSums.summarise(sums.as_vector(), type(sums.blocks), cfg.block_size)
    assert metrics["tau_sim"] == tokens / steps


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
def test_compiled_evaluation_between_training_steps_never_recompiles(architecture: str) -> None:
    target = {**TARGET, "hidden_size": 256, "vocab_size": 1024, "head_dim": 64}
    cfg = DrafterConfig(
        num_layers=2,
        block_size=16,
        num_anchors=64,
        anchor_ref_len=512,
        loss_chunk=512,
        architecture=architecture,
    )
    max_tokens = 1024
    torch.manual_seed(0)
    model = build_drafter(drafter_spec_from_target(target, cfg, TAPS)).cuda()
    head = FrozenHead.random(1024, 256, "cuda", torch.bfloat16)
    optim_cfg = paper_optim(warmup_fraction=0.0)
    optimizer, scheduler = build_optimizer(model, optim_cfg, total_steps=20)
    generator = torch.Generator("cuda").manual_seed(0)
    layouts = [[512, 512], [1000], [100, 200, 300, 400], [7, 900], [64] * 16]

    def train_then_evaluate(lengths: list[int], seed: int) -> tuple[EvalSums, PackedBatch]:
        batch = random_packed_batch(lengths, 3 * 256, 1024, "cuda", torch.bfloat16, seed)
        sums = block_objective(model, head, batch, generator, cfg, max_tokens)
        (sums.loss_sum / sums.weight_sum).backward()
        optimizer_step(model, optimizer, scheduler, optim_cfg)
        return evaluate_batch(model, head, batch, cfg, max_tokens), batch

    train_then_evaluate(layouts[0], 0)
    train_then_evaluate(layouts[1], 1)
    before = compiled_graph_count()
    for i, lengths in enumerate(layouts * 2):
        sums, batch = train_then_evaluate(lengths, 2 + i)
        mask, bounds = batch.loss_mask.tolist(), batch.cu_seqlens.tolist()
        anchors = sum(r - q for q, r in spans_of(mask, bounds))
        assert int(sums.blocks.block_count) == anchors
        assert torch.isfinite(sums.as_vector()).all()
        metrics = EvalSums.summarise(sums.as_vector(), type(sums.blocks), cfg.block_size)
        assert 1.0 <= metrics["tau_sim"] <= cfg.block_size
    assert compiled_graph_count() == before
