"""Speculative decoding with a trained DFlash drafter, and its metrics (ringtrain-eval)."""

from ringtrain.eval.benchmarks import load_prompt_sets, load_prompts
from ringtrain.eval.chat import ChatRenderer
from ringtrain.eval.metrics import EvalReport, PromptOutcome, summarize
from ringtrain.eval.prompts import PromptFileError, read_prompt_records
from ringtrain.eval.speculative import (
    BlockDrafter,
    Generation,
    GreedyReference,
    greedy_generate,
    speculative_generate,
)
from ringtrain.eval.target import (
    VerifyingTarget,
    load_causal_lm,
    load_verifying_target,
    stop_token_ids,
)
from ringtrain.eval.ties import Divergence, TieJudge

__all__ = [
    "BlockDrafter",
    "ChatRenderer",
    "Divergence",
    "EvalReport",
    "Generation",
    "GreedyReference",
    "PromptFileError",
    "PromptOutcome",
    "TieJudge",
    "VerifyingTarget",
    "greedy_generate",
    "load_causal_lm",
    "load_prompt_sets",
    "load_prompts",
    "load_verifying_target",
    "read_prompt_records",
    "speculative_generate",
    "stop_token_ids",
    "summarize",
]
