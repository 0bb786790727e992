"""The figures of an evaluation report, worked out by hand from outcomes of known counts and
times: tau_real, acceptance per block position, both token rates and the speedup, overall,
per set of prompts and per category, and as the JSON and the table show them."""

from __future__ import annotations

import pytest

from ringtrain.eval import Generation, PromptOutcome, summarize
from ringtrain.eval.evaluation import NOT_COMPARED, reports_of
from ringtrain.eval.settings import SamplingSettings
from ringtrain.eval.ties import Divergence
from ringtrain.generate.prompt_sets import PromptSet

BLOCK = 6


def outcome(
    index: int, tokens: int, accepted: list[int], seconds: float, plain_seconds: float, **where
) -> PromptOutcome:
    """A lossless turn: `tokens` tokens in `seconds` speculatively, in `plain_seconds` alone."""
    ids = list(range(tokens))
    return PromptOutcome(
        index, 4, Generation(ids, accepted, seconds), Generation(ids, [], plain_seconds), **where
    )


OUTCOMES = [
    outcome(0, 13, [2, 0, 5, 1], 0.5, 2.0, benchmark="code", category="easy"),
    outcome(1, 7, [3, 1], 0.25, 1.0, benchmark="code", category="hard"),
    outcome(0, 4, [0, 0, 0], 0.25, 0.5, benchmark="chat"),
]


def test_overall_figures_are_the_counts_over_all_forwards() -> None:
    report = summarize(OUTCOMES, BLOCK)
    # accepted drafts 2+0+5+1 + 3+1 + 0+0+0 = 12 over 9 forwards, plus one bonus each
    assert (report.prompts, report.verify_forwards, report.generated_tokens) == (3, 9, 24)
    assert report.tau_real == pytest.approx(21 / 9)
    # forwards that accepted at least k drafts: k=1: 2,5,1,3,1; k=2: 2,5,3; k=3: 5,3; 4, 5: 5
    assert report.acceptance == pytest.approx([5 / 9, 3 / 9, 2 / 9, 1 / 9, 1 / 9])
    assert report.speculative_tokens_per_s == pytest.approx(24 / 1.0)
    assert report.greedy_tokens_per_s == pytest.approx(24 / 3.5)
    assert report.speedup == pytest.approx(3.5)
    assert report.tau_real == pytest.approx(1 + sum(report.acceptance))


def test_each_set_and_category_has_its_own_figures() -> None:
    report = summarize(OUTCOMES, BLOCK)
    assert list(report.benchmarks) == ["code", "chat"]
    code, chat = report.benchmarks["code"], report.benchmarks["chat"]
    assert (code.prompts, code.verify_forwards, code.generated_tokens) == (2, 6, 20)
    assert code.tau_real == pytest.approx(18 / 6)
    assert code.acceptance == pytest.approx([5 / 6, 3 / 6, 2 / 6, 1 / 6, 1 / 6])
    assert code.speedup == pytest.approx((20 / 0.75) / (20 / 3.0))
    assert (chat.tau_real, chat.acceptance) == (1.0, [0.0] * 5)
    assert chat.speedup == pytest.approx((4 / 0.25) / (4 / 0.5))
    assert list(code.categories) == ["easy", "hard"]
    hard = code.categories["hard"]
    assert (hard.verify_forwards, hard.tau_real) == (2, pytest.approx(3.0))
    assert hard.acceptance == pytest.approx([1.0, 0.5, 0.5, 0.0, 0.0])


def test_the_json_and_the_table_show_the_same_figures() -> None:
    report = summarize(OUTCOMES, BLOCK)
    figures = report.as_dict()
    assert figures["tau_real"] == report.tau_real
    assert figures["acceptance"] == report.acceptance
    assert figures["speedup"] == report.speedup
    assert figures["lossless"] is True and figures["numerical_ties"] == 0
    assert figures["benchmarks"]["code"]["tau_real"] == pytest.approx(3.0)
    assert figures["benchmarks"]["code"]["categories"]["hard"]["verify_forwards"] == 2
    table = report.table()
    assert "tau_real           2.333  (block size 6)" in table
    assert "24.0 speculative, 6.9 greedy (3.50x)" in table
    assert "acceptance by pos  1:0.56 2:0.33 3:0.22 4:0.11 5:0.11" in table


def _lines(table: str) -> list[str]:
    """The table's lines with runs of spaces made one (the columns' padding aside)."""
    return [" ".join(line.split()) for line in table.splitlines()]


def test_the_table_has_a_line_per_set_and_per_category_with_its_own_figures() -> None:
    lines = _lines(summarize(OUTCOMES, BLOCK).table())
    rows = lines[lines.index("divergence rule exact") + 1 :]
    assert rows == [
        "code 2 turns tau_real 3.000 tokens/s 26.7 vs 6.7 (4.00x) acceptance 1:0.83 2:0.50 3:0.33",
        "easy 1 turns tau_real 3.000 tokens/s 26.0 vs 6.5 (4.00x) acceptance 1:0.75 2:0.50 3:0.25",
        "hard 1 turns tau_real 3.000 tokens/s 28.0 vs 7.0 (4.00x) acceptance 1:1.00 2:0.50 3:0.50",
        "chat 1 turns tau_real 1.000 tokens/s 16.0 vs 8.0 (2.00x) acceptance 1:0.00 2:0.00 3:0.00",
    ]
    # One set without categories: its line would repeat the overall figures.
    alone = _lines(summarize(OUTCOMES[2:], BLOCK).table())
    assert alone[-1] == "divergence rule exact"


def test_the_table_names_the_decoding_and_its_verdict() -> None:
    greedy = _lines(summarize(OUTCOMES, BLOCK).table())
    assert greedy[0] == "decoding greedy"
    assert "lossless yes: every output equals greedy" in greedy
    sampled = _lines(summarize(OUTCOMES, BLOCK, sampling=SamplingSettings(0.7, 0.9, 3)).table())
    assert sampled[0] == "decoding sampling at temperature 0.7, top-p 0.9, seed 3"
    assert not any(line.startswith("divergence rule") for line in sampled)
    assert "lossless not compared at a temperature" in " ".join(sampled)


def test_the_table_counts_mismatched_prompts_and_names_the_first() -> None:
    differs = PromptOutcome(
        0, 4, Generation([1, 2, 9], [1, 0], 0.5), Generation([1, 2, 3], [], 1.0), benchmark="chat"
    )
    lines = _lines(summarize([*OUTCOMES, differs], BLOCK).table())
    assert (
        "lossless NO: 1 of 4 prompts differ from greedy (first: chat prompt 0, position 2, "
        "float32 margin unmeasured)"
    ) in lines


def test_the_table_names_numerical_ties() -> None:
    tie = Divergence(1, speculative=5, greedy=1, margin=0.001, tolerance=0.01, exact=1, tie=True)
    tied = PromptOutcome(0, 4, Generation([1, 2], [1], 0.5, [tie]), Generation([1, 2], [], 1.0))
    lines = _lines(summarize([tied], BLOCK).table())
    assert "lossless yes, with 1 numerical ties (near-equal top logits; see ties)" in lines


def test_the_table_says_when_speculative_decoding_was_slower_and_what_helps() -> None:
    assert "slower" not in summarize(OUTCOMES, BLOCK).table()  # 3.50x
    slow = [outcome(0, 8, [0, 1, 0], 1.0, 0.8, benchmark="chat")]
    greedy = summarize(slow, BLOCK).table()
    assert "slower             than greedy decoding without the drafter (0.80x)" in greedy
    sampled = summarize(slow, BLOCK, sampling=SamplingSettings(1.0, 1.0, 0)).table()
    assert "slower             than sampling without the drafter (0.80x)" in sampled
    assert "regenerate --temperature" in sampled


def test_no_forwards_give_zero_figures_not_an_error() -> None:
    report = summarize([outcome(0, 1, [], 0.0, 0.0)], BLOCK)
    assert (report.tau_real, report.speedup, report.acceptance) == (0.0, 0.0, [0.0] * 5)


def test_each_rate_counts_its_own_decodings_tokens() -> None:
    """Where the two decodings differ in length (a real mismatch stopped the speculative
    one), each rate is its own tokens over its own time."""
    speculative = Generation([1, 2, 9], [1, 0], 0.5)
    plain = Generation([1, 2, 3, 4, 5, 6], [], 2.0)
    report = summarize([PromptOutcome(0, 4, speculative, plain)], BLOCK)
    assert (report.generated_tokens, report.verify_forwards) == (3, 2)
    assert report.speculative_tokens_per_s == 3 / 0.5
    assert report.greedy_tokens_per_s == 6 / 2.0
    assert report.speedup == pytest.approx(2.0)
    assert report.lossless is False and report.mismatches[0]["position"] == 2


def test_reports_take_turns_in_the_sets_prompts_and_turns_order_whatever_order_they_came() -> None:
    """Workers finish conversations in any order: the report lists sets in their order, and
    a set's categories and numerical ties by prompt, then turn."""
    tie = Divergence(1, speculative=5, greedy=1, margin=0.001, tolerance=0.01, exact=1, tie=True)

    def turn(set_name: str, index: int, turn: int, category: str) -> PromptOutcome:
        speculative = Generation([1, 2], [1], 0.5, [tie])
        return PromptOutcome(
            index, 4, speculative, Generation([1, 2], [], 1.0), set_name, turn, category
        )

    came = [turn("chat", 0, 1, "b"), turn("code", 1, 2, "y"), turn("code", 1, 1, "y")]
    came += [turn("code", 0, 2, "x"), turn("code", 0, 1, "x"), turn("chat", 1, 1, "a")]
    sets = [PromptSet("code", []), PromptSet("chat", [])]
    sampled = SamplingSettings(1.0, 1.0, 0)
    greedy, drawn = reports_of(sets, [None, sampled], [came, came[::-1]], "exact (float32)", BLOCK)
    for report in (greedy, drawn):
        assert list(report.benchmarks) == ["code", "chat"]
        assert list(report.benchmarks["code"].categories) == ["x", "y"]
        assert list(report.benchmarks["chat"].categories) == ["b", "a"]
        ties = [(t["benchmark"], t["prompt"], t["turn"]) for t in report.numerical_ties]
        assert ties == [
            ("code", 0, 1),
            ("code", 0, 2),  # a prompt's second turn before the next prompt's first
            ("code", 1, 1),
            ("code", 1, 2),
            ("chat", 0, 1),
            ("chat", 1, 1),
        ]
    assert (greedy.tie_rule, drawn.tie_rule) == ("exact (float32)", NOT_COMPARED)
