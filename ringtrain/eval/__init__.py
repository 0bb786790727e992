"""Speculative decoding with a trained DFlash drafter, and its metrics (ringtrain-eval).

Prompts, chat rendering, model loading and plain batched generation live in
``ringtrain.generate``; this package adds the verifying target, the drafter's proposals,
the decoding loops and what they measure.
"""

from ringtrain.eval.metrics import EvalReport, PromptOutcome, summarize
from ringtrain.eval.speculative import (
    BlockDrafter,
    Generation,
    GreedyReference,
    greedy_generate,
    speculative_generate,
)
from ringtrain.eval.target import VerifyingTarget, load_verifying_target
from ringtrain.eval.ties import Divergence, TieJudge

__all__ = [
    "BlockDrafter",
    "Divergence",
    "EvalReport",
    "Generation",
    "GreedyReference",
    "PromptOutcome",
    "TieJudge",
    "VerifyingTarget",
    "greedy_generate",
    "load_verifying_target",
    "speculative_generate",
    "summarize",
]
