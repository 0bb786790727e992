"""Speculative sampling keeps the target's distribution; a wrong acceptance rule is caught.

Each test compares empirical token distributions with exact ones by total variation
(TV) distance, against the bound a correct sampler stays under with probability
1 - DELTA: E[TV] <= 0.5 * sum_i sqrt(p_i / n) for n draws of distribution p, and TV moves
by at most 1/n per draw, so (McDiarmid) it exceeds its mean by sqrt(ln(1/DELTA) / 2n)
with probability at most DELTA. Draws are seeded, so each test is deterministic.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from ringtrain.drafter import FrozenHead, build_drafter, drafter_spec_from_target
from ringtrain.eval.graphed_drafts import FixedShapeProposals
from ringtrain.eval.sampled import sampled_generate, sampled_speculative_generate
from ringtrain.eval.sampling import speculative_acceptance
from ringtrain.eval.target import VerifyingTarget, load_verifying_target
from ringtrain.generate.sampling import TokenSampler, draw
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.tiny_drafter import TAPS, TARGET, make_cfg

DELTA = 1e-4
PROMPT = [5, 17, 99, 3, 250, 41]
# A sharp setting of the tiny target below: a few likely tokens at each position.
TEMPERATURE, TOP_P = 0.4, 0.7

pytestmark = pytest.mark.usefixtures("one_thread")


def tv_bound(exact: dict, n: int) -> float:
    """The TV distance n correct draws of ``exact`` stay under (module docstring)."""
    mean = 0.5 * sum(math.sqrt(p / n) for p in exact.values())
    return mean + math.sqrt(math.log(1 / DELTA) / (2 * n))


def tv(exact: dict, drawn: list) -> float:
    """TV distance between ``exact`` ({outcome: probability}) and the draws' frequencies."""
    counts = Counter(drawn)
    outcomes = set(exact) | set(counts)
    return 0.5 * sum(abs(exact.get(o, 0.0) - counts[o] / len(drawn)) for o in outcomes)


def accept_always(p, q, drafts, generator):
    """A wrong rule: every draft kept, the bonus drawn from p."""
    accepted = torch.full(drafts.shape[:-1], drafts.shape[-1], dtype=torch.long)
    return accepted, draw(p[..., -1, :], generator)


def resample_from_p(p, q, drafts, generator):
    """A wrong rule: the right acceptance, but a rejected draft redrawn from p (not from
    the residual max(0, p - q))."""
    drafted = drafts.unsqueeze(-1)
    ratio = p[..., :-1, :].gather(-1, drafted) / q.gather(-1, drafted)
    kept = torch.rand(ratio.shape[:-1], generator=generator) < ratio.squeeze(-1)
    accepted = kept.long().cumprod(dim=-1).sum(dim=-1)
    at = accepted[..., None, None].expand(*accepted.shape, 1, p.shape[-1])
    return accepted, draw(p.gather(-2, at).squeeze(-2), generator)


# ---- the rule alone, on many synthetic blocks at once --------------------------------


def _synthetic_blocks(n: int, block: int, vocab: int) -> tuple:
    """(p [B, V], q [B-1, V], drafts [n, B-1] drawn from q): fixed distributions, q near
    enough to p that every position is reached often, far enough that drafts are often
    rejected."""
    gen = _generator(0)
    logits = 2 * torch.randn(block, vocab, generator=gen)
    p = torch.softmax(logits, dim=-1)
    q = torch.softmax(logits[:-1] + 1.5 * torch.randn(block - 1, vocab, generator=gen), dim=-1)
    return p, q, draw(q.expand(n, -1, -1), gen)


def _committed_by_position(p, q, drafts, rule) -> list[list[int]]:
    """The tokens the blocks commit at each position 0..B-1 (a block that ended earlier
    commits none there): a kept draft, or the token drawn after the kept ones."""
    n, block = drafts.shape[0], p.shape[0]
    accepted, token = rule(p.expand(n, -1, -1), q.expand(n, -1, -1), drafts, _generator(1))
    padded = torch.cat((drafts, token[:, None]), dim=1)  # a column for the bonus
    positions = []
    for k in range(block):
        chosen = torch.where(accepted > k, padded[:, k], token)
        positions.append(chosen[accepted >= k].tolist())
    return positions


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_each_committed_position_is_drawn_from_the_targets_distribution() -> None:
    p, q, drafts = _synthetic_blocks(n=100_000, block=4, vocab=6)
    for k, tokens in enumerate(_committed_by_position(p, q, drafts, speculative_acceptance)):
        exact = dict(enumerate(p[k].tolist()))
        assert len(tokens) > 10_000, f"position {k} is reached too rarely to be tested"
        assert tv(exact, tokens) <= tv_bound(exact, len(tokens)), f"position {k}"


@pytest.mark.parametrize("rule", [accept_always, resample_from_p])
def test_a_wrong_rule_fails_the_same_check(rule) -> None:
    p, q, drafts = _synthetic_blocks(n=100_000, block=4, vocab=6)
    positions = _committed_by_position(p, q, drafts, rule)
    exact = [dict(enumerate(row.tolist())) for row in p]
    distances = [
        tv(e, tokens) / tv_bound(e, len(tokens)) for e, tokens in zip(exact, positions, strict=True)
    ]
    assert max(distances) > 1.0, f"{rule.__name__} passed: TV / bound by position {distances}"


def test_drafts_drawn_from_the_targets_own_distribution_are_all_kept() -> None:
    p, _, _ = _synthetic_blocks(n=1, block=4, vocab=6)
    drafts = draw(p[:-1].expand(1000, -1, -1), _generator(2))
    blocks = p.expand(1000, -1, -1)
    accepted, _ = speculative_acceptance(blocks, blocks[:, :-1], drafts, _generator(3))
    assert (accepted == 3).all()


# ---- end to end: the decoding loop on a tiny target ----------------------------------


class FixedDrafter:
    """Draws every block from fixed distributions ``q`` [B-1, V], whatever the context."""

    def __init__(self, q: torch.Tensor, mask_token_id: int) -> None:
        self.q = q
        self.block_size = q.shape[0] + 1
        self.mask_token_id = mask_token_id

    def propose_sampled(self, context, block, start, sampler) -> tuple:
        return draw(self.q, sampler.generator), self.q


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> VerifyingTarget:
    directory = tmp_path_factory.mktemp("target")
    tiny = build_tiny_target(
        directory, seed=3, hybrid=False, num_layers=2, hidden_size=32, vocab_size=300
    )
    return load_verifying_target(tiny, [0])


def _next_distributions(target: VerifyingTarget, sequences: list[list[int]]) -> torch.Tensor:
    """The target's sampling distribution [S, V] after each sequence (one batch forward)."""
    sampler = TokenSampler.seeded(TEMPERATURE, TOP_P, 0, "cpu")
    with torch.inference_mode():
        logits = target.model(input_ids=torch.tensor(sequences)).logits[:, -1]
    return sampler.probabilities(logits)


def _exact_first_tokens(target: VerifyingTarget) -> tuple[dict, dict, list[torch.Tensor]]:
    """({(t0, t1): probability}, {t2: probability}, the rows of p after 1 and 2 tokens)."""
    p0 = _next_distributions(target, [PROMPT])[0]
    firsts = p0.nonzero().flatten().tolist()
    p1 = _next_distributions(target, [[*PROMPT, a] for a in firsts])
    pairs = {
        (a, b): float(p0[a] * p1[i, b])
        for i, a in enumerate(firsts)
        for b in p1[i].nonzero().flatten().tolist()
    }
    p2 = _next_distributions(target, [[*PROMPT, a, b] for a, b in pairs])
    thirds: dict[int, float] = Counter()
    for probability, row in zip(pairs.values(), p2, strict=True):
        for c in row.nonzero().flatten().tolist():
            thirds[c] += probability * float(row[c])
    return pairs, dict(thirds), [p1, p2]


def _fixed_proposals(rows: list[torch.Tensor]) -> torch.Tensor:
    """q [2, V]: per draft slot, half the mean of the target's rows there, half uniform over
    their support: often right (drafts are kept), often wrong (the residual is drawn)."""
    slots = []
    for p in rows:
        mean = p.mean(dim=0)
        support = (mean > 0).float()
        slots.append(0.5 * mean + 0.5 * support / support.sum())
    return torch.stack(slots)


def test_speculative_sampling_draws_as_the_target_samples(target: VerifyingTarget) -> None:
    pairs, thirds, rows = _exact_first_tokens(target)
    drafter = FixedDrafter(_fixed_proposals(rows), mask_token_id=target.vocab_size - 1)
    prompt = torch.tensor(PROMPT)

    def first_tokens(rule, draws: int) -> list[list[int]]:
        sampler = TokenSampler.seeded(TEMPERATURE, TOP_P, 7, "cpu")
        return [
            sampled_speculative_generate(
                target, drafter, prompt, 3, sampler, acceptance=rule
            ).tokens
            for _ in range(draws)
        ]

    right = first_tokens(speculative_acceptance, 600)
    assert tv(pairs, [tuple(t[:2]) for t in right]) <= tv_bound(pairs, 600)
    assert tv(thirds, [t[2] for t in right]) <= tv_bound(thirds, 600)
    # Keeping every draft is far off already in fewer draws.
    wrong = first_tokens(accept_always, 200)
    assert tv(pairs, [tuple(t[:2]) for t in wrong]) > tv_bound(pairs, 200)


def test_the_target_sampling_alone_draws_from_the_same_distribution(
    target: VerifyingTarget,
) -> None:
    pairs, _, _ = _exact_first_tokens(target)
    firsts: dict[int, float] = Counter()
    for (first, _), probability in pairs.items():
        firsts[first] += probability
    sampler = TokenSampler.seeded(TEMPERATURE, TOP_P, 8, "cpu")
    alone = [
        sampled_generate(target, torch.tensor(PROMPT), 1, sampler).tokens[0] for _ in range(200)
    ]
    assert tv(dict(firsts), alone) <= tv_bound(dict(firsts), 200)


@pytest.mark.parametrize("mode", ["own", "cache"])
def test_the_target_sampling_alone_draws_every_token_it_makes(
    target: VerifyingTarget, mode: str
) -> None:
    """Past the prompt's own forward too: the first two tokens drawn one forward at a time
    follow the target's joint distribution, on its own stepper and on transformers' cache."""
    pairs, _, _ = _exact_first_tokens(target)
    plain = load_verifying_target(Path(target.model.name_or_path), [0], mode=mode)
    assert plain.mode == mode
    sampler = TokenSampler.seeded(TEMPERATURE, TOP_P, 9, "cpu")
    drawn = [
        tuple(sampled_generate(plain, torch.tensor(PROMPT), 2, sampler).tokens) for _ in range(300)
    ]
    assert tv(pairs, drawn) <= tv_bound(pairs, 300)


class RecordingDrafter(FixedDrafter):
    """A FixedDrafter that keeps every (start, context, block) it is given."""

    def __init__(self, q: torch.Tensor, mask_token_id: int) -> None:
        super().__init__(q, mask_token_id)
        self.calls: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def propose_sampled(self, context, block, start, sampler) -> tuple:
        self.calls.append((start, context.clone(), block.clone()))
        return super().propose_sampled(context, block, start, sampler)


def test_sampled_drafts_see_the_targets_tapped_features_of_every_committed_token(
    target: VerifyingTarget,
) -> None:
    """Each block is drafted after the taps of exactly the committed tokens, as a full
    forward of the committed sequence gives them, with [anchor, MASK...] as its block."""
    _, _, rows = _exact_first_tokens(target)
    mask = target.vocab_size - 1
    drafter = RecordingDrafter(_fixed_proposals(rows), mask_token_id=mask)
    sampler = TokenSampler.seeded(TEMPERATURE, TOP_P, 4, "cpu")
    out = sampled_speculative_generate(target, drafter, torch.tensor(PROMPT), 16, sampler)
    sequence = PROMPT + out.tokens
    assert len(drafter.calls) == len(out.accepted) > 2
    for start, context, block in drafter.calls:
        assert context.shape == (start, target.tap_width)
        assert block.tolist() == [sequence[start]] + [mask] * (drafter.block_size - 1)
    start, context, _ = drafter.calls[-1]
    with torch.inference_mode():
        hidden = target.model(input_ids=torch.tensor([sequence[:start]]), output_hidden_states=True)
    taps = torch.cat([hidden.hidden_states[layer + 1][0] for layer in target.tap_layers], dim=-1)
    torch.testing.assert_close(context, taps, rtol=1e-4, atol=1e-4)


# ---- a trained drafter's drawn proposals ---------------------------------------------


def _drafter(architecture: str) -> tuple:
    """A tiny fp32 drafter of ``architecture`` far from its initialisation, and its head."""
    extra = {"architecture": "dflash2", "selector_rank": 8, "selector_top_k": 4}
    cfg = make_cfg(sliding_windows=[0, 0], **(extra if architecture == "dflash2" else {}))
    torch.manual_seed(0)
    model = build_drafter(drafter_spec_from_target(TARGET, cfg, TAPS)).eval().requires_grad_(False)
    for parameter in model.parameters():
        parameter.normal_(std=0.3)
    embed, lm_head = torch.randn(2, 64, 32, generator=_generator(1)) * 0.5
    return model, FrozenHead(embed, lm_head)


@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
def test_drafts_are_drawn_from_the_distributions_the_drafter_reports(architecture: str) -> None:
    model, head = _drafter(architecture)
    proposals = FixedShapeProposals(model, head, 128, 96, torch.float32, graphed=False)
    length, block_size = 70, model.spec.block_size
    context = torch.randn(length, 96, generator=_generator(2))
    block = torch.full((block_size,), 63)
    block[0] = 5
    positions = torch.arange(length + block_size)
    hidden = model.draft_hidden(head, context, positions[:length], block, positions[length:])
    logits = model.head_logits(head, hidden[1:])
    sampler = TokenSampler.seeded(0.7, 0.9, 0, "cpu")
    drafts, q = proposals.propose_sampled(context, block, length, sampler)
    if architecture == "dflash":
        expected = sampler.probabilities(logits)
    else:  # the selector's walk: each slot's top-k scored after the token drawn before it
        selector = model.candidate_selector
        unary, candidates = logits.topk(selector.top_k, dim=-1)
        before = torch.cat((block[:1], drafts[:-1]))
        scores = selector.scores(hidden[1:], unary, candidates, before)
        local = sampler.probabilities(scores)
        expected = torch.zeros_like(q).scatter(-1, candidates, local)
    torch.testing.assert_close(q, expected, rtol=1e-4, atol=1e-6)
    assert (q.gather(-1, drafts[:, None]) > 0).all()
    # The first slot's q is fixed by the context: its draws follow it.
    firsts = [
        proposals.propose_sampled(context, block, length, sampler)[0][0].item() for _ in range(300)
    ]
    exact = dict(enumerate(q[0].tolist()))
    assert tv(exact, firsts) <= tv_bound(exact, 300)


def _block_logits(target: VerifyingTarget, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the logits after the prompt, the logits of one block after it) by ``target``."""
    sequence = torch.tensor([*PROMPT, 7, 8, 9], device=device)
    features = torch.empty(len(sequence), target.tap_width, dtype=target.dtype, device=device)
    target.reserve(len(sequence) + 1)
    first = target.prefill_logits(sequence[: len(PROMPT)], features[: len(PROMPT)])
    block = target.verify_logits(sequence, len(PROMPT), 3, features[len(PROMPT) :])
    return first, block


def test_every_verification_mode_gives_the_same_logits(target: VerifyingTarget) -> None:
    directory = Path(target.model.name_or_path)
    own, first = target, _block_logits(target, "cpu")
    assert own.mode == "own"
    for mode in ("cache", "recompute"):
        other = _block_logits(load_verifying_target(directory, [0], mode=mode), "cpu")
        torch.testing.assert_close(other, first, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_verification_logits_and_sampled_decoding_on_cuda(
    target: VerifyingTarget,
) -> None:
    directory = Path(target.model.name_or_path)
    own = load_verifying_target(directory, [0], device="cuda", dtype="float32")
    cached = load_verifying_target(directory, [0], device="cuda", dtype="float32", mode="cache")
    for _ in range(2):  # the second verification replays the captured graph
        torch.testing.assert_close(
            _block_logits(own, "cuda"), _block_logits(cached, "cuda"), rtol=1e-4, atol=1e-4
        )
    assert own._own.graph is not None
    _, _, rows = _exact_first_tokens(target)
    drafter = FixedDrafter(_fixed_proposals(rows).cuda(), mask_token_id=own.vocab_size - 1)
    sampler = TokenSampler.seeded(TEMPERATURE, TOP_P, 0, "cuda")
    out = sampled_speculative_generate(own, drafter, torch.tensor(PROMPT), 40, sampler)
    assert len(out.tokens) == 40 and len(out.accepted) <= 39
