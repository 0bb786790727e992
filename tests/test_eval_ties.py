"""The lossless check in bf16: a deliberate near-tie is a numerical tie, a real mismatch fails.

The target is a tiny real Qwen3 model whose LM-head row ``b`` is a copy of row ``a`` (a
token its greedy continuation emits): logits a and b are equal, greedy picks a (the
lower id wins an exact tie). The verification path is nudged the way a block forward
that rounds differently would be: it adds a small amount to logit b, so speculative
decoding commits b where greedy committed a.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from ringtrain.cli.eval import main, mismatch_error
from ringtrain.eval import (
    GreedyReference,
    PromptOutcome,
    TieJudge,
    VerifyingTarget,
    greedy_generate,
    speculative_generate,
    summarize,
)
from ringtrain.eval.ties import ulp
from ringtrain.generate.model import load_causal_lm
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.eval_drafters import BLOCK, TAPS, ScriptedDrafter, write_drafter

NEW_TOKENS = 40

pytestmark = pytest.mark.usefixtures("one_thread")


class NudgedTarget(VerifyingTarget):
    """Verification forwards (keep > 1) add ``nudge`` to the float logit of ``token``
    (transformers' cache: the nudge is added where its forward returns the logits)."""

    def __init__(self, model, token: int, nudge: float) -> None:
        super().__init__(model, TAPS, mode="cache")
        self.token, self.nudge = token, nudge

    def _forward(self, tokens: torch.Tensor, features: torch.Tensor, keep: int) -> torch.Tensor:
        logits = super()._forward(tokens, features, keep).float()
        if keep == 1:
            return logits
        bump = torch.zeros(logits.shape[-1])
        bump[self.token] = self.nudge
        return logits + bump


def _prompt() -> torch.Tensor:
    return torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(4))


@pytest.fixture(scope="module")
def tied_target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """A target directory whose LM-head row b copies row a, a the commonest greedy token."""
    directory = build_tiny_target(tmp_path_factory.mktemp("tied"), seed=3, hybrid=False)
    model = AutoModelForCausalLM.from_pretrained(directory)
    greedy = greedy_generate(VerifyingTarget(model, TAPS), _prompt(), NEW_TOKENS).tokens
    a = Counter(greedy).most_common(1)[0][0]
    b = model.config.vocab_size - 2
    assert a < b
    with torch.no_grad():
        model.lm_head.weight[b] = model.lm_head.weight[a]
    model.save_pretrained(directory)
    return directory, a, b


def _decode(
    target: VerifyingTarget, judge: TieJudge, stop_ids: Sequence[int] = ()
) -> PromptOutcome:
    prompt = _prompt()
    greedy = greedy_generate(target, prompt, NEW_TOKENS, stop_ids)
    drafter = ScriptedDrafter(prompt.tolist() + greedy.tokens, BLOCK - 1, target.vocab_size)
    reference = GreedyReference(greedy.tokens, judge)
    spec = speculative_generate(target, drafter, prompt, NEW_TOKENS, stop_ids, reference)
    return PromptOutcome(0, len(prompt), spec, greedy)


def test_near_tie_in_bf16_is_a_numerical_tie_and_decoding_goes_on(tied_target) -> None:
    directory, a, b = tied_target
    model = load_causal_lm(directory, dtype="bfloat16")
    judge = TieJudge(model)
    outcome = _decode(NudgedTarget(model, b, 0.01), judge)
    ties = outcome.speculative.divergences
    assert ties, "the nudge must flip some token"
    assert all(d.tie and (d.speculative, d.greedy) == (b, a) for d in ties)
    assert all(d.margin == 0.0 < d.tolerance for d in ties)
    assert outcome.speculative.tokens == outcome.plain.tokens
    assert len(outcome.speculative.tokens) == NEW_TOKENS
    report = summarize([outcome], BLOCK, judge.describe())
    assert report.lossless and report.mismatches == []
    assert len(report.numerical_ties) == len(ties)
    assert report.as_dict()["numerical_ties"] == len(ties)
    assert "numerical ties" in report.table()


def test_a_tie_on_a_stop_token_goes_on_from_greedys_token(tied_target) -> None:
    """Speculative decoding commits b (a stop token) where greedy took a: at the tie
    decoding continues from a, so b does not end the answer."""
    directory, a, b = tied_target
    model = load_causal_lm(directory, dtype="bfloat16")
    outcome = _decode(NudgedTarget(model, b, 0.01), TieJudge(model), stop_ids=[b])
    assert len(outcome.plain.tokens) == NEW_TOKENS and b not in outcome.plain.tokens
    ties = outcome.speculative.divergences
    assert ties and all(d.tie and (d.speculative, d.greedy) == (b, a) for d in ties)
    assert outcome.speculative.tokens == outcome.plain.tokens


def test_time_spent_judging_is_left_out_of_the_decoding_time(tied_target) -> None:
    """The judge's float32 recomputation is timed on its own; the decoding time reported
    excludes it, so it and the judging fit in the wall time of the call."""
    directory, _, b = tied_target
    model = load_causal_lm(directory, dtype="bfloat16")
    target, judge, prompt = NudgedTarget(model, b, 0.01), TieJudge(model), _prompt()
    greedy = greedy_generate(target, prompt, NEW_TOKENS)
    drafter = ScriptedDrafter(prompt.tolist() + greedy.tokens, BLOCK - 1, target.vocab_size)
    reference = GreedyReference(greedy.tokens, judge)
    started = time.perf_counter()
    spec = speculative_generate(target, drafter, prompt, NEW_TOKENS, reference=reference)
    wall = time.perf_counter() - started
    assert spec.divergences and judge.seconds > 0
    assert 0 < spec.seconds <= wall - judge.seconds


def test_the_judge_recomputes_in_float32_on_a_copy(tied_target) -> None:
    """The judge's logits come from an upcast copy of the bf16 target (not rounded to bf16),
    and the target it judges stays in bf16."""
    directory, _, _ = tied_target
    model = load_causal_lm(directory, dtype="bfloat16")
    logits = TieJudge(model).float32_logits(_prompt())
    assert next(model.parameters()).dtype == torch.bfloat16
    upcast = load_causal_lm(directory, dtype="bfloat16").float()
    with torch.inference_mode():
        expected = upcast(input_ids=_prompt()[None]).logits[0, -1]
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    assert not torch.equal(logits, logits.bfloat16().float())


def test_a_negative_tie_tolerance_is_refused(tied_target) -> None:
    model = load_causal_lm(tied_target[0], dtype="bfloat16")
    with pytest.raises(ValueError, match="at least 0 ulps"):
        TieJudge(model, tie_ulps=-1.0)


def test_the_same_divergence_in_float32_fails(tied_target) -> None:
    directory, a, b = tied_target
    model = load_causal_lm(directory, dtype="float32")
    outcome = _decode(NudgedTarget(model, b, 0.01), TieJudge(model))
    (divergence,) = outcome.speculative.divergences
    assert (divergence.speculative, divergence.greedy) == (b, a)
    assert not divergence.tie and divergence.tolerance == 0.0
    report = summarize([outcome], BLOCK)
    assert not report.lossless
    assert report.mismatches[0]["position"] == divergence.position
    assert report.mismatches[0]["margin"] == divergence.margin


def test_real_mismatch_in_bf16_fails_naming_prompt_position_and_margin(tied_target) -> None:
    directory, a, _ = tied_target
    model = load_causal_lm(directory, dtype="bfloat16")
    wrong = (a + 1) % 256
    judge = TieJudge(model)
    outcome = _decode(NudgedTarget(model, wrong, 1e4), judge)
    (divergence,) = outcome.speculative.divergences
    assert not divergence.tie and divergence.speculative == wrong
    assert divergence.margin > divergence.tolerance > 0
    assert len(outcome.speculative.tokens) == divergence.position + 1, "decoding stops there"
    report = summarize([outcome], BLOCK, judge.describe())
    assert not report.lossless and report.numerical_ties == []
    error = mismatch_error(report)
    assert f"prompt 0, position {divergence.position}" in error
    assert f"margin {divergence.margin:.4g}" in error


def test_ulp_follows_the_dtype() -> None:
    assert ulp(20.0, torch.bfloat16) == 0.125
    assert ulp(1.5, torch.bfloat16) == 2**-7
    assert ulp(20.0, torch.float16) == 2**-6
    assert ulp(20.0, torch.float32) == 0.0
    # By magnitude: a negative top logit has the ulp of its absolute value.
    assert ulp(-20.0, torch.bfloat16) == 0.125
    # Below 1 the tolerance stays at the ulp of 1.
    assert ulp(0.3, torch.bfloat16) == ulp(-0.3, torch.bfloat16) == 2**-7


class FixedLogits(torch.nn.Module):
    """A stand-in model in ``dtype`` whose next-token logits are always ``logits``."""

    def __init__(self, logits: list[float], dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, dtype=dtype))
        self.logits = torch.tensor([[logits]])

    def forward(self, input_ids: torch.Tensor, **_kwargs: object) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits)


@pytest.mark.parametrize(
    ("dtype", "ulp_at_20"), [(torch.bfloat16, 0.125), (torch.float16, 2**-6)], ids=["bf16", "fp16"]
)
@pytest.mark.parametrize("ulps", [0.0, 1.0, 4.0, 4.5, 5.0, 40.0])
def test_the_default_rule_ties_a_margin_of_at_most_four_ulps(
    dtype: torch.dtype, ulp_at_20: float, ulps: float
) -> None:
    """Top logit 20 (greedy's token 0), the speculative token 1 below it by `ulps` ulps."""
    judge = TieJudge(FixedLogits([20.0, 20.0 - ulps * ulp_at_20, 3.0], dtype))
    verdict = judge.judge(torch.tensor([5, 6]), 7, speculative=1, greedy=0)
    assert verdict.margin == ulps * ulp_at_20
    assert verdict.tolerance == 4 * ulp_at_20
    assert verdict.tie == (ulps <= 4.0)
    loose = TieJudge(FixedLogits([20.0, 20.0 - ulps * ulp_at_20, 3.0], dtype), tie_ulps=4.5)
    assert loose.judge(torch.tensor([5, 6]), 7, 1, 0).tie == (ulps <= 4.5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "float32"])
def test_keeping_the_float32_argmax_is_a_tie_in_bf16_however_far_greedy_strayed(
    dtype: torch.dtype,
) -> None:
    """Token 1 is the float32 argmax, far above greedy's token 0: speculative decoding that
    committed 1 kept the target's true choice (a tie in bf16, where rounding can move
    greedy); committing 0 where greedy took 1 is a real mismatch at the same margin."""
    judge = TieJudge(FixedLogits([17.0, 20.0, 3.0], dtype))
    kept = judge.judge(torch.tensor([5]), 0, speculative=1, greedy=0)
    assert (kept.margin, kept.exact) == (3.0, 1)
    assert kept.margin > kept.tolerance
    assert kept.tie == (dtype == torch.bfloat16)
    strayed = judge.judge(torch.tensor([5]), 0, speculative=0, greedy=1)
    assert (strayed.margin, strayed.exact, strayed.tie) == (3.0, 1, False)


def test_tie_ulps_0_allows_no_tie_not_even_an_exact_one() -> None:
    judge = TieJudge(FixedLogits([20.0, 20.0, 3.0], torch.bfloat16), tie_ulps=0.0)
    verdict = judge.judge(torch.tensor([5]), 0, speculative=1, greedy=0)
    assert (verdict.margin, verdict.tolerance, verdict.tie) == (0.0, 0.0, False)
    assert judge.describe() == "exact (bfloat16: every divergence from greedy fails)"


def test_float32_has_no_ties_whatever_the_tolerance() -> None:
    judge = TieJudge(FixedLogits([20.0, 20.0, 3.0], torch.float32), tie_ulps=1000.0)
    verdict = judge.judge(torch.tensor([5]), 0, speculative=1, greedy=0)
    assert (verdict.margin, verdict.tolerance, verdict.tie) == (0.0, 0.0, False)


# Row b of the trailing target's LM head is this times row a: where a tops the logits, b
# trails it by a few percent of a's logit, a few bf16 ulps.
TRAILING_SCALE = 0.97
NUDGE = 0.2  # what the nudged verification adds to logit b: more than b trails by


@pytest.fixture(scope="module")
def trailing_target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, int]:
    """(target, drafter, prompts file, token b) where the target's LM-head row b is a
    shrunk copy of row a, the commonest token of the prompt's greedy continuation."""
    root = tmp_path_factory.mktemp("trailing")
    directory = build_tiny_target(root / "target", seed=3, hybrid=False)
    model = AutoModelForCausalLM.from_pretrained(directory)
    greedy = greedy_generate(VerifyingTarget(model, TAPS), _prompt(), NEW_TOKENS).tokens
    a = Counter(greedy).most_common(1)[0][0]
    b = model.config.vocab_size - 2
    with torch.no_grad():
        model.lm_head.weight[b] = TRAILING_SCALE * model.lm_head.weight[a]
    model.save_pretrained(directory)
    prompts = root / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": _prompt().tolist()}) + "\n")
    return directory, write_drafter(root / "drafter", directory), prompts, b


def _eval_nudged(
    trailing_target: tuple[Path, Path, Path, int],
    tie_ulps: float,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, dict]:
    """ringtrain-eval in bf16 with --tie-ulps `tie_ulps`, its verification forwards nudged
    towards token b; (exit status, the JSON report)."""
    directory, drafter, prompts, b = trailing_target
    verify = VerifyingTarget._forward

    def nudged(self, tokens: torch.Tensor, features: torch.Tensor, keep: int) -> torch.Tensor:
        logits = verify(self, tokens, features, keep).float()
        if keep > 1:
            logits[:, b] += NUDGE
        return logits

    monkeypatch.setattr(VerifyingTarget, "_forward", nudged)
    code = main(
        [
            "--target", str(directory), "--drafter", str(drafter), "--prompts", str(prompts),
            "--max-new-tokens", str(NEW_TOKENS), "--device", "cpu", "--dtype", "bfloat16",
            "--mode", "cache", "--tie-ulps", repr(tie_ulps), "--json",
        ]
    )  # fmt: skip
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_tie_ulps_sets_the_boundary_of_a_tie_through_the_cli(
    trailing_target, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first divergence is a tie under a huge tolerance; at --tie-ulps equal to its
    margin in ulps it still is (the boundary belongs to the tie), and just below that it
    is a mismatch that stops decoding there and fails the run."""
    code, wide = _eval_nudged(trailing_target, 1e6, monkeypatch, capsys)
    assert code == 0 and wide["lossless"] and wide["ties"], wide
    first = wide["ties"][0]
    ulps = first["margin"] / (first["tolerance"] / 1e6)  # exact: an ulp is a power of two
    assert 0 < ulps < 100, first
    _, at = _eval_nudged(trailing_target, ulps, monkeypatch, capsys)
    assert at["ties"][0] == {**first, "tolerance": first["margin"]}
    assert f"within {ulps:g} ulps" in at["tie_rule"]
    code, below = _eval_nudged(trailing_target, ulps * (1 - 1e-6), monkeypatch, capsys)
    assert code == 1 and below["lossless"] is False and below["ties"] == []
    assert [(m["position"], m["margin"]) for m in below["mismatches"]] == [
        (first["position"], first["margin"])
    ]
