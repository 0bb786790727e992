"""Speculative decoding against scripted drafters on tiny dense and hybrid targets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ringtrain.eval import (
    PromptOutcome,
    VerifyingTarget,
    greedy_generate,
    load_verifying_target,
    speculative_generate,
    summarize,
)
from ringtrain.generate.model import load_causal_lm
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.eval_drafters import BLOCK, TAPS, ScriptedDrafter
from tests.helpers.sharp_attention import sharpen_saved_model

NEW_TOKENS = 40

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "hybrid"])
def target_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    hybrid = request.param
    return sharpen_saved_model(
        build_tiny_target(tmp_path_factory.mktemp("target"), seed=3, hybrid=hybrid)
    )


def _prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed))


def _tapped_features(target: VerifyingTarget, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        ids = torch.tensor([tokens], device=target.device)
        out = target.model(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[layer + 1][0] for layer in TAPS], dim=-1)


# 30 tokens after the first (which the prompt's own forward gives): a whole number of
# verification forwards at 1, 3 and 6 tokens each, so every figure below is exact.
EXACT_TOKENS = 31


@pytest.mark.parametrize("correct", [0, 2, BLOCK - 1])
def test_a_drafter_right_on_its_first_k_positions_gives_tau_k_plus_one(
    target_dir: Path, correct: int
) -> None:
    target = load_verifying_target(target_dir, TAPS)
    prompt = _prompt(12, seed=correct)
    greedy = greedy_generate(target, prompt, EXACT_TOKENS)
    assert len(greedy.tokens) == EXACT_TOKENS
    drafter = ScriptedDrafter(prompt.tolist() + greedy.tokens, correct, target.vocab_size)
    spec = speculative_generate(target, drafter, prompt, EXACT_TOKENS)
    assert spec.tokens == greedy.tokens
    forwards = (EXACT_TOKENS - 1) // (correct + 1)
    assert spec.accepted == [correct] * forwards
    report = summarize([PromptOutcome(0, len(prompt), spec, greedy)], BLOCK)
    assert report.lossless
    assert (report.prompts, report.generated_tokens) == (1, EXACT_TOKENS)
    assert report.verify_forwards == forwards
    assert report.tau_real == correct + 1
    assert report.acceptance == [1.0] * correct + [0.0] * (BLOCK - 1 - correct)
    assert report.as_dict()["tau_real"] == correct + 1


def test_drafter_sees_the_targets_tapped_features(target_dir: Path) -> None:
    target = load_verifying_target(target_dir, TAPS)
    prompt = _prompt(9, seed=7)
    greedy = greedy_generate(target, prompt, 20)
    sequence = prompt.tolist() + greedy.tokens
    drafter = ScriptedDrafter(sequence, 2, target.vocab_size)
    speculative_generate(target, drafter, prompt, 20)
    last = drafter.contexts[-1]
    expected = _tapped_features(target, sequence[: last.shape[0]])
    torch.testing.assert_close(last, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("correct", [3, BLOCK - 2], ids=["3-right", "one-rejected"])
def test_every_verification_mode_agrees(tmp_path: Path, correct: int) -> None:
    """Own, cache and recompute verification give greedy decoding's tokens and taps, for a
    drafter right on its first `correct` positions (BLOCK - 2: one block position rejected,
    the least a cache is cut by), and serve a second prompt after the first."""
    directory = sharpen_saved_model(build_tiny_target(tmp_path / "dense", seed=5, hybrid=False))
    own = load_verifying_target(directory, TAPS)
    cached = load_verifying_target(directory, TAPS, mode="cache")
    recomputed = load_verifying_target(directory, TAPS, mode="recompute")
    assert (own.mode, cached.mode, recomputed.mode) == ("own", "cache", "recompute")
    prompt = _prompt(10, seed=1)
    greedy = greedy_generate(cached, prompt, 30)
    # The own mode's reference (its cache's one-token step) answers as transformers' does.
    assert greedy_generate(own, prompt, 30).tokens == greedy.tokens
    sequence = prompt.tolist() + greedy.tokens
    runs = []
    for target in (own, cached, recomputed):
        drafter = ScriptedDrafter(sequence, correct, target.vocab_size)
        runs.append(speculative_generate(target, drafter, prompt, 30))
        torch.testing.assert_close(
            drafter.contexts[-1],
            _tapped_features(target, sequence[: drafter.contexts[-1].shape[0]]),
            rtol=1e-4,
            atol=1e-4,
        )
    assert runs[0].tokens == runs[1].tokens == runs[2].tokens == greedy.tokens
    # Each target serves a second prompt: the own cache's position and transformers' cache
    # start again.
    second = _prompt(14, seed=3)
    expected = greedy_generate(recomputed, second, 20).tokens
    for target in (own, cached, recomputed):
        drafter = ScriptedDrafter(second.tolist() + expected, correct, target.vocab_size)
        assert speculative_generate(target, drafter, second, 20).tokens == expected, target.mode


def test_own_mode_leaves_the_models_attention_to_other_users(tmp_path: Path) -> None:
    model = load_causal_lm(build_tiny_target(tmp_path / "dense", seed=5, hybrid=False))
    implementation = model.config._attn_implementation
    own = VerifyingTarget(model, TAPS)
    assert own.mode == "own"
    prompt = _prompt(10, seed=1)
    greedy = greedy_generate(own, prompt, 12)
    assert own.model.config._attn_implementation == implementation
    # A second target on the same model object runs transformers' cache as it would alone.
    shared = VerifyingTarget(own.model, TAPS, mode="cache")
    assert greedy_generate(shared, prompt, 12).tokens == greedy.tokens
    assert own.model.config._attn_implementation == implementation


@pytest.mark.parametrize("mode", ["own", "cache"])
def test_stop_token_ends_both_decodings(tmp_path: Path, mode: str) -> None:
    """The stop token ends the answer, kept, on the own stepper and on transformers' cache."""
    directory = build_tiny_target(tmp_path / "dense", seed=5, hybrid=False)
    target = load_verifying_target(directory, TAPS, mode=mode)
    prompt = _prompt(10, seed=2)
    free = greedy_generate(target, prompt, 30).tokens
    stop = free[7]
    greedy = greedy_generate(target, prompt, 30, stop_ids=[stop])
    assert greedy.tokens == free[: free.index(stop) + 1]
    drafter = ScriptedDrafter(prompt.tolist() + free, BLOCK - 1, target.vocab_size)
    spec = speculative_generate(target, drafter, prompt, 30, stop_ids=[stop])
    assert spec.tokens == greedy.tokens


@pytest.mark.parametrize("mode", ["own", "cache"])
def test_a_stop_token_first_ends_both_decodings_before_any_block(tmp_path: Path, mode: str) -> None:
    """The first token (the prompt's own forward gives it) a stop token: that token is the
    answer, and no block is drafted or verified."""
    directory = build_tiny_target(tmp_path / "dense", seed=5, hybrid=False)
    target = load_verifying_target(directory, TAPS, mode=mode)
    prompt = _prompt(10, seed=2)
    free = greedy_generate(target, prompt, 30).tokens
    stop = free[0]
    assert greedy_generate(target, prompt, 30, stop_ids=[stop]).tokens == [stop]
    drafter = ScriptedDrafter(prompt.tolist() + free, BLOCK - 1, target.vocab_size)
    spec = speculative_generate(target, drafter, prompt, 30, stop_ids=[stop])
    assert (spec.tokens, spec.accepted, drafter.contexts) == ([stop], [], [])


def test_a_stop_token_in_a_block_ends_decoding_after_that_block(tmp_path: Path) -> None:
    """A drafter right on every position commits BLOCK tokens a forward after the first
    token: the stop token at index i of the answer is in forward (i - 1) // BLOCK + 1, the
    last one decoded."""
    directory = build_tiny_target(tmp_path / "dense", seed=5, hybrid=False)
    target = load_verifying_target(directory, TAPS)
    prompt = _prompt(10, seed=2)
    free = greedy_generate(target, prompt, 30).tokens
    stop = free[2 * BLOCK + 1]
    index = free.index(stop)
    assert index >= 1, "the first token is the other test's case"
    drafter = ScriptedDrafter(prompt.tolist() + free, BLOCK - 1, target.vocab_size)
    spec = speculative_generate(target, drafter, prompt, 30, stop_ids=[stop])
    assert spec.tokens == free[: index + 1]
    assert spec.accepted == [BLOCK - 1] * ((index - 1) // BLOCK + 1)


def test_the_answer_is_cut_at_the_limit_inside_a_block(tmp_path: Path) -> None:
    """8 tokens with BLOCK = 6 committed a forward: the first token, one forward (7 tokens),
    a second forward (13): the answer is the first 8, after two forwards."""
    directory = build_tiny_target(tmp_path / "dense", seed=5, hybrid=False)
    target = load_verifying_target(directory, TAPS)
    prompt = _prompt(10, seed=2)
    free = greedy_generate(target, prompt, 30).tokens
    drafter = ScriptedDrafter(prompt.tolist() + free, BLOCK - 1, target.vocab_size)
    spec = speculative_generate(target, drafter, prompt, 8)
    assert spec.tokens == free[:8]
    assert spec.accepted == [BLOCK - 1, BLOCK - 1]
    # One token: the prompt's own forward's, no block.
    one = speculative_generate(target, drafter, prompt, 1)
    assert (one.tokens, one.accepted) == (free[:1], [])
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1, got 0"):
        speculative_generate(target, drafter, prompt, 0)


def test_cache_mode_is_refused_for_hybrid_targets(tmp_path: Path) -> None:
    directory = build_tiny_target(tmp_path / "hybrid", seed=5, hybrid=True)
    for mode in ("own", "cache"):
        with pytest.raises(ValueError, match="recompute"):
            load_verifying_target(directory, TAPS, mode=mode)
    assert load_verifying_target(directory, TAPS).mode == "recompute"


def test_mismatch_is_reported() -> None:
    from ringtrain.eval import Generation

    outcome = PromptOutcome(3, 5, Generation([1, 2, 3], [2], 0.1), Generation([1, 2, 4], [], 0.1))
    report = summarize([outcome], BLOCK)
    assert not report.lossless
    assert report.mismatches[0]["prompt"] == 3
    assert report.mismatches[0]["position"] == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_own_mode_replays_verification_as_a_cuda_graph(tmp_path: Path) -> None:
    directory = build_tiny_target(tmp_path / "dense", seed=5, hybrid=False)
    own = load_verifying_target(directory, TAPS, device="cuda", dtype="float32")
    cached = load_verifying_target(directory, TAPS, device="cuda", dtype="float32", mode="cache")
    for seed in (1, 2):
        prompt = _prompt(10 + seed, seed=seed)
        greedy = greedy_generate(cached, prompt, 30)
        assert greedy_generate(own, prompt, 30).tokens == greedy.tokens
        sequence = prompt.tolist() + greedy.tokens
        runs = []
        for target in (own, cached):
            drafter = ScriptedDrafter(sequence, 3, target.vocab_size)
            runs.append(speculative_generate(target, drafter, prompt, 30))
            torch.testing.assert_close(
                drafter.contexts[-1].cpu(),
                _tapped_features(target, sequence[: drafter.contexts[-1].shape[0]]).cpu(),
                rtol=1e-4,
                atol=1e-4,
            )
        assert runs[0].tokens == runs[1].tokens == greedy.tokens
    # Captured on the first prompt, replayed after: verification and the greedy reference.
    assert own._own.graph is not None
    assert own._stepper.graph is not None
