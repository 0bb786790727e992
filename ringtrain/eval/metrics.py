"""Acceptance metrics of a speculative-decoding evaluation, and the lossless check.

tau_real is the mean number of tokens gained per target verification forward: the
accepted drafts plus the bonus token. It is what the training-time tau (1 + mean
correct prefix of block positions 1..B-1) simulates. Acceptance at block position k is
the fraction of verification forwards that accepted the drafts of positions 1..k.

The lossless check: every speculative output must equal the greedy output token for
token. In bf16/fp16, a divergence whose float32 margin is within the tie tolerance is a
numerical tie (ringtrain.eval.ties): counted and reported, not a failure, and decoding
went on from the greedy token. Any other divergence is a mismatch and fails.

Each outcome is one assistant turn of one prompt of a named set (a benchmark or a
prompts file); the report has the headline figures of every set beside the overall ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringtrain.eval.speculative import Generation


@dataclass
class PromptOutcome:
    """One assistant turn of one prompt: the speculative and the greedy continuation."""

    index: int  # the prompt's index within its set
    prompt_len: int
    speculative: Generation
    greedy: Generation
    benchmark: str = ""  # the name of the prompt's set
    turn: int = 1  # the assistant turn of a multi-turn prompt, from 1

    @property
    def label(self) -> str:
        """The prompt as error messages name it: set, index and turn."""
        name = f"{self.benchmark} " if self.benchmark else ""
        turn = f" turn {self.turn}" if self.turn > 1 else ""
        return f"{name}prompt {self.index}{turn}"

    @property
    def first_mismatch(self) -> int | None:
        """Index of the first differing token (or the shorter length), None when equal."""
        spec, ref = self.speculative.tokens, self.greedy.tokens
        if spec == ref:
            return None
        for i, (a, b) in enumerate(zip(spec, ref, strict=False)):
            if a != b:
                return i
        return min(len(spec), len(ref))


@dataclass
class EvalReport:
    """Aggregated metrics over all prompts."""

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
    # The report of each set of prompts, by name (empty within a set's own report).
    benchmarks: dict[str, EvalReport] = field(default_factory=dict)

    @property
    def lossless(self) -> bool:
        """Whether every speculative output equals the greedy output (numerical ties aside)."""
        return not self.mismatches

    def headline(self) -> dict:
        """The headline figures: counts, tau_real, acceptance, both speeds, losslessness."""
        return {
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

    def as_dict(self) -> dict:
        """A JSON-ready dict of every metric, overall and per set of prompts."""
        return {
            "block_size": self.block_size,
            **self.headline(),
            "mismatches": self.mismatches,
            "ties": self.numerical_ties,
            "tie_rule": self.tie_rule,
            "benchmarks": {name: report.headline() for name, report in self.benchmarks.items()},
        }

    def table(self) -> str:
        """A short human-readable summary."""
        lines = [
            f"prompts            {self.prompts}",
            f"generated tokens   {self.generated_tokens}",
            f"verify forwards    {self.verify_forwards}",
            f"tau_real           {self.tau_real:.3f}  (block size {self.block_size})",
            f"tokens/s           {self.speculative_tokens_per_s:.1f} speculative, "
            f"{self.greedy_tokens_per_s:.1f} greedy ({self.speedup:.2f}x)",
            "acceptance by pos  "
            + " ".join(f"{k + 1}:{rate:.2f}" for k, rate in enumerate(self.acceptance)),
            "lossless           " + self._verdict(),
            "divergence rule    " + self.tie_rule,
        ]
        lines += [
            f"  {name:<16} {r.prompts:>4} prompts  tau_real {r.tau_real:.3f}  tokens/s "
            f"{r.speculative_tokens_per_s:.1f} vs {r.greedy_tokens_per_s:.1f} ({r.speedup:.2f}x)"
            for name, r in self.benchmarks.items()
            if len(self.benchmarks) > 1
        ]
        return "\n".join(lines)

    def _verdict(self) -> str:
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
        "greedy": outcome.greedy.tokens[at : at + 8],
        "margin": judged[0].margin if judged else None,
    }


def summarize(
    outcomes: list[PromptOutcome], block_size: int, tie_rule: str = "exact"
) -> EvalReport:
    """Aggregate per-turn outcomes into tau_real, per-position acceptance and speed, overall
    and for each set of prompts (in the order the sets first appear)."""
    report = _aggregate(outcomes, block_size, tie_rule)
    for name in dict.fromkeys(o.benchmark for o in outcomes):
        group = [o for o in outcomes if o.benchmark == name]
        report.benchmarks[name] = _aggregate(group, block_size, tie_rule)
    return report


def _aggregate(outcomes: list[PromptOutcome], block_size: int, tie_rule: str) -> EvalReport:
    """The report of ``outcomes`` taken together."""
    accepted = [count for o in outcomes for count in o.speculative.accepted]
    forwards = len(accepted)
    reached = [sum(count >= k for count in accepted) for k in range(1, block_size)]
    spec_tokens = sum(len(o.speculative.tokens) for o in outcomes)
    greedy_tokens = sum(len(o.greedy.tokens) for o in outcomes)
    spec_seconds = sum(o.speculative.seconds for o in outcomes)
    greedy_seconds = sum(o.greedy.seconds for o in outcomes)
    speculative_tokens_per_s = spec_tokens / spec_seconds if spec_seconds > 0 else 0.0
    greedy_tokens_per_s = greedy_tokens / greedy_seconds if greedy_seconds > 0 else 0.0
    mismatches = [m for o in outcomes if (m := _mismatch(o)) is not None]
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
        greedy_tokens_per_s=greedy_tokens_per_s,
        speedup=speculative_tokens_per_s / greedy_tokens_per_s if greedy_tokens_per_s > 0 else 0.0,
        mismatches=mismatches,
        numerical_ties=ties,
        tie_rule=tie_rule,
    )
