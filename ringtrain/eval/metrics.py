"""Acceptance metrics of a speculative-decoding evaluation, and the lossless check.

tau_real is the mean number of tokens gained per target verification forward: the
accepted drafts plus the bonus token. It is what the training-time tau (1 + mean
correct prefix of block positions 1..B-1) simulates. Acceptance at block position k is
the fraction of verification forwards that accepted the drafts of positions 1..k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringtrain.eval.speculative import Generation


@dataclass
class PromptOutcome:
    """One prompt: the speculative and the greedy continuation."""

    index: int
    prompt_len: int
    speculative: Generation
    greedy: Generation

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
    tokens_per_s: float
    greedy_tokens_per_s: float
    speedup: float
    mismatches: list[dict] = field(default_factory=list)

    @property
    def lossless(self) -> bool:
        """Whether every speculative output equals the greedy output."""
        return not self.mismatches

    def as_dict(self) -> dict:
        """A JSON-ready dict of every metric."""
        return {
            "block_size": self.block_size,
            "prompts": self.prompts,
            "verify_forwards": self.verify_forwards,
            "generated_tokens": self.generated_tokens,
            "tau_real": self.tau_real,
            "acceptance": self.acceptance,
            "tokens_per_s": self.tokens_per_s,
            "greedy_tokens_per_s": self.greedy_tokens_per_s,
            "speedup": self.speedup,
            "lossless": self.lossless,
            "mismatches": self.mismatches,
        }

    def table(self) -> str:
        """A short human-readable summary."""
        lines = [
            f"prompts            {self.prompts}",
            f"generated tokens   {self.generated_tokens}",
            f"verify forwards    {self.verify_forwards}",
            f"tau_real           {self.tau_real:.3f}  (block size {self.block_size})",
            f"tokens/s           {self.tokens_per_s:.1f} speculative, "
            f"{self.greedy_tokens_per_s:.1f} greedy ({self.speedup:.2f}x)",
            "acceptance by pos  "
            + " ".join(f"{k + 1}:{rate:.2f}" for k, rate in enumerate(self.acceptance)),
            "lossless           " + ("yes: every output equals greedy" if self.lossless else "NO"),
        ]
        return "\n".join(lines)


def summarize(outcomes: list[PromptOutcome], block_size: int) -> EvalReport:
    """Aggregate per-prompt outcomes into tau_real, per-position acceptance and speed."""
    accepted = [count for o in outcomes for count in o.speculative.accepted]
    forwards = len(accepted)
    reached = [sum(count >= k for count in accepted) for k in range(1, block_size)]
    spec_tokens = sum(len(o.speculative.tokens) for o in outcomes)
    greedy_tokens = sum(len(o.greedy.tokens) for o in outcomes)
    spec_seconds = sum(o.speculative.seconds for o in outcomes)
    greedy_seconds = sum(o.greedy.seconds for o in outcomes)
    tokens_per_s = spec_tokens / spec_seconds if spec_seconds > 0 else 0.0
    greedy_tokens_per_s = greedy_tokens / greedy_seconds if greedy_seconds > 0 else 0.0
    mismatches = []
    for o in outcomes:
        at = o.first_mismatch
        if at is None:
            continue
        mismatches.append(
            {
                "prompt": o.index,
                "position": at,
                "speculative": o.speculative.tokens[at : at + 8],
                "greedy": o.greedy.tokens[at : at + 8],
            }
        )
    return EvalReport(
        block_size=block_size,
        prompts=len(outcomes),
        verify_forwards=forwards,
        generated_tokens=spec_tokens,
        tau_real=(sum(accepted) + forwards) / forwards if forwards else 0.0,
        acceptance=[r / forwards if forwards else 0.0 for r in reached],
        tokens_per_s=tokens_per_s,
        greedy_tokens_per_s=greedy_tokens_per_s,
        speedup=tokens_per_s / greedy_tokens_per_s if greedy_tokens_per_s > 0 else 0.0,
        mismatches=mismatches,
    )
