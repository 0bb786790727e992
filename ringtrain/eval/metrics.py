"""Acceptance metrics of a speculative-decoding evaluation, and the lossless check.

tau_real is the mean number of tokens gained per target verification forward: the
accepted drafts plus the bonus token. It is what the training-time tau (1 + mean
correct prefix of block positions 1..B-1) simulates. Acceptance at block position k is
the fraction of verification forwards that accepted the drafts of positions 1..k.

The lossless check (greedy decoding): every speculative output must equal the greedy
output token for token. In bf16/fp16, a divergence whose float32 margin is within the
tie tolerance is a numerical tie (ringtrain.eval.ties): counted and reported, not a
failure, and decoding went on from the greedy token. Any other divergence is a mismatch
and fails. At a temperature there is nothing to compare token for token (two draws of
one distribution differ): ``lossless`` is None, and the speed baseline is the target
sampling alone.

Each outcome is one assistant turn of one prompt of a named set (a benchmark or a
prompts file), and of a category where the set has them (MT-Bench's writing, math, ...);
the report has the headline figures of every set, and of every category within it,
beside the overall ones, plus named groups of categories (MT-Bench's math and reasoning
questions together) as sets of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ringtrain.eval.settings import SamplingSettings
from ringtrain.eval.speculative import Generation

# Named groups of categories of each set: {set name: {group name: categories}}.
CategoryGroups = Mapping[str, Mapping[str, tuple[str, ...]]]


@dataclass
class PromptOutcome:
    """One assistant turn of one prompt: the speculative continuation and the target's
    own (greedy, or drawn at the evaluation's temperature)."""

    index: int  # the prompt's index within its set
    prompt_len: int
    speculative: Generation
    plain: Generation
    benchmark: str = ""  # the name of the prompt's set
    turn: int = 1  # the assistant turn of a multi-turn prompt, from 1
    category: str = ""  # the prompt's category within its set, where it has one

    @property
    def label(self) -> str:
        """The prompt as error messages name it: set, index and turn."""
        name = f"{self.benchmark} " if self.benchmark else ""
        turn = f" turn {self.turn}" if self.turn > 1 else ""
        return f"{name}prompt {self.index}{turn}"

    @property
    def first_mismatch(self) -> int | None:
        """Index of the first differing token (or the shorter length), None when equal."""
        spec, ref = self.speculative.tokens, self.plain.tokens
        if spec == ref:
            return None
        for i, (a, b) in enumerate(zip(spec, ref, strict=False)):
            if a != b:
                return i
        return min(len(spec), len(ref))


@dataclass
class EvalReport:
    """Aggregated metrics over all prompts. ``greedy_tokens_per_s``: the target decoding
    alone, one token per forward (greedy, or sampling at the evaluation's temperature)."""

    block_size: int
    prompts: int
    verify_forwards: int
    generated_tokens: int
    tau_real: float
    acceptance: list[float]
    speculative_tokens_per_s: float
    greedy_tokens_per_s: float
    speedup: float
    mismatches: list[dict] = field(default_factory=list)
    numerical_ties: list[dict] = field(default_factory=list)
    tie_rule: str = "exact"
    # None: greedy decoding, checked against greedy; else the temperature it sampled at.
    sampling: SamplingSettings | None = None
    # The report of each set of prompts (and group of categories), by name.
    benchmarks: dict[str, EvalReport] = field(default_factory=dict)
    # The report of each category of a set's prompts, by name (a set's report only).
    categories: dict[str, EvalReport] = field(default_factory=dict)

    @property
    def lossless(self) -> bool | None:
        """Whether every speculative output equals the greedy output (numerical ties
        aside); None at a temperature, where there is nothing to compare."""
        return None if self.sampling is not None else not self.mismatches

    def headline(self) -> dict:
        """The headline figures: counts, tau_real, acceptance, both speeds, losslessness,
        and those of each category."""
        figures = {
            "prompts": self.prompts,
            "verify_forwards": self.verify_forwards,
            "generated_tokens": self.generated_tokens,
            "tau_real": self.tau_real,
            "acceptance": self.acceptance,
            "speculative_tokens_per_s": self.speculative_tokens_per_s,
            "greedy_tokens_per_s": self.greedy_tokens_per_s,
            "speedup": self.speedup,
            "lossless": self.lossless,
            "numerical_ties": len(self.numerical_ties),
        }
        if self.categories:
            figures["categories"] = {name: r.headline() for name, r in self.categories.items()}
        return figures

    def as_dict(self) -> dict:
        """A JSON-ready dict of every metric, overall and per set of prompts."""
        sampling = self.sampling
        return {
            "block_size": self.block_size,
            "temperature": sampling.temperature if sampling else 0.0,
            "top_p": sampling.top_p if sampling else 1.0,
            "seed": sampling.seed if sampling else None,
            **self.headline(),
            "mismatches": self.mismatches,
            "ties": self.numerical_ties,
            "tie_rule": self.tie_rule,
            "benchmarks": {name: report.headline() for name, report in self.benchmarks.items()},
        }

    def table(self) -> str:
        """A short human-readable summary, with a line per set and per category."""
        baseline = "greedy" if self.sampling is None else "sampled"
        lines = [
            "decoding           "
            + ("greedy" if self.sampling is None else self.sampling.describe()),
            f"prompts            {self.prompts}",
            f"generated tokens   {self.generated_tokens}",
            f"verify forwards    {self.verify_forwards}",
            f"tau_real           {self.tau_real:.3f}  (block size {self.block_size})",
            f"tokens/s           {self.speculative_tokens_per_s:.1f} speculative, "
            f"{self.greedy_tokens_per_s:.1f} {baseline} ({self.speedup:.2f}x)",
            "acceptance by pos  " + _rates(self.acceptance),
            "lossless           " + self._verdict(),
        ]
        if self.sampling is None:
            lines.append("divergence rule    " + self.tie_rule)
        if 0 < self.speedup < 1:
            lines.append("slower             " + self._slower())
        for name, report in self.benchmarks.items():
            if len(self.benchmarks) > 1 or report.categories:
                lines.append(_row(f"  {name:<16}", report))
            lines += [_row(f"    {c:<14}", r) for c, r in report.categories.items()]
        return "\n".join(lines)

    def _slower(self) -> str:
        """Why speculative decoding lost to decoding alone, and what raises tau_real."""
        if self.sampling is not None:
            return (
                f"than sampling without the drafter ({self.speedup:.2f}x): at this "
                "temperature it accepts too few tokens to pay for its proposals; a drafter "
                "trained on answers drawn at the served temperature accepts more "
                "(docs/regeneration.md: regenerate --temperature)"
            )
        return (
            f"than greedy decoding without the drafter ({self.speedup:.2f}x): its proposals "
            "cost more than the tokens they save on this device; longer training, or data "
            "like these prompts (docs/general-data.md), raises tau_real"
        )

    def _verdict(self) -> str:
        if self.sampling is not None:
            return (
                "not compared at a temperature (two draws differ token by token); the "
                "acceptance rule keeps the target's distribution"
            )
        ties = len(self.numerical_ties)
        if not self.lossless:
            first = self.mismatches[0]
            margin = "unmeasured" if first["margin"] is None else f"{first['margin']:.4g}"
            return (
                f"NO: {len(self.mismatches)} of {self.prompts} prompts differ from greedy "
                f"(first: {first['where']}, position {first['position']}, float32 "
                f"margin {margin})"
            )
        if ties:
            return f"yes, with {ties} numerical ties (near-equal top logits; see ties)"
        return "yes: every output equals greedy"


def _rates(acceptance: list[float]) -> str:
    return " ".join(f"{k + 1}:{rate:.2f}" for k, rate in enumerate(acceptance))


def _row(label: str, report: EvalReport) -> str:
    """One line of a set or category: prompts, tau_real, speeds, first acceptances."""
    return (
        f"{label} {report.prompts:>4} turns  tau_real {report.tau_real:.3f}  tokens/s "
        f"{report.speculative_tokens_per_s:.1f} vs {report.greedy_tokens_per_s:.1f} "
        f"({report.speedup:.2f}x)  acceptance {_rates(report.acceptance[:3])}"
    )


def _mismatch(outcome: PromptOutcome) -> dict | None:
    """The first real divergence of one prompt (prompt, position, tokens, margin), or None."""
    at = outcome.first_mismatch
    if at is None:
        return None
    judged = [d for d in outcome.speculative.divergences if not d.tie and d.position == at]
    return {
        "benchmark": outcome.benchmark,
        "prompt": outcome.index,
        "turn": outcome.turn,
        "where": outcome.label,
        "position": at,
        "speculative": outcome.speculative.tokens[at : at + 8],
        "greedy": outcome.plain.tokens[at : at + 8],
        "margin": judged[0].margin if judged else None,
        "exact": judged[0].exact if judged else None,
    }


def summarize(
    outcomes: list[PromptOutcome],
    block_size: int,
    tie_rule: str = "exact",
    sampling: SamplingSettings | None = None,
    groups: CategoryGroups | None = None,
) -> EvalReport:
    """Aggregate per-turn outcomes into tau_real, per-position acceptance and speed, overall,
    for each set of prompts (in the order the sets first appear) and each category within
    it, and for each group of a set's categories (``groups``), listed after its set.
    ``sampling``: the temperature the outcomes were drawn at (None: greedy, checked)."""
    report = _aggregate(outcomes, block_size, tie_rule, sampling)
    for name in dict.fromkeys(o.benchmark for o in outcomes):
        members = [o for o in outcomes if o.benchmark == name]
        subset = _aggregate(members, block_size, tie_rule, sampling)
        report.benchmarks[name] = subset
        for category in dict.fromkeys(o.category for o in members if o.category):
            chosen = [o for o in members if o.category == category]
            subset.categories[category] = _aggregate(chosen, block_size, tie_rule, sampling)
        for group, categories in (groups or {}).get(name, {}).items():
            chosen = [o for o in members if o.category in categories]
            if chosen:
                report.benchmarks[group] = _aggregate(chosen, block_size, tie_rule, sampling)
    return report


def _aggregate(
    outcomes: list[PromptOutcome],
    block_size: int,
    tie_rule: str,
    sampling: SamplingSettings | None,
) -> EvalReport:
    """The report of ``outcomes`` taken together."""
    accepted = [count for o in outcomes for count in o.speculative.accepted]
    forwards = len(accepted)
    reached = [sum(count >= k for count in accepted) for k in range(1, block_size)]
    spec_tokens = sum(len(o.speculative.tokens) for o in outcomes)
    plain_tokens = sum(len(o.plain.tokens) for o in outcomes)
    spec_seconds = sum(o.speculative.seconds for o in outcomes)
    plain_seconds = sum(o.plain.seconds for o in outcomes)
    speculative_tokens_per_s = spec_tokens / spec_seconds if spec_seconds > 0 else 0.0
    plain_tokens_per_s = plain_tokens / plain_seconds if plain_seconds > 0 else 0.0
    checked = sampling is None
    mismatches = [m for o in outcomes if checked and (m := _mismatch(o)) is not None]
    ties = [
        {"benchmark": o.benchmark, "turn": o.turn, **d.as_dict(o.index)}
        for o in outcomes
        for d in o.speculative.divergences
        if d.tie
    ]
    return EvalReport(
        block_size=block_size,
        prompts=len(outcomes),
        verify_forwards=forwards,
        generated_tokens=spec_tokens,
        tau_real=(sum(accepted) + forwards) / forwards if forwards else 0.0,
        acceptance=[r / forwards if forwards else 0.0 for r in reached],
        speculative_tokens_per_s=speculative_tokens_per_s,
        greedy_tokens_per_s=plain_tokens_per_s,
        speedup=speculative_tokens_per_s / plain_tokens_per_s if plain_tokens_per_s > 0 else 0.0,
        mismatches=mismatches,
        numerical_ties=ties,
        tie_rule=tie_rule,
        sampling=sampling,
    )
