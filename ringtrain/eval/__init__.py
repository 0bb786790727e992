"""Speculative decoding with a trained DFlash drafter, and its metrics (ringtrain-eval).

Prompts, chat rendering, model loading and plain batched generation live in
``ringtrain.generate``; this package adds the verifying target, the drafter's proposals,
the decoding loops (greedy, and sampling at a temperature) and what they measure.

The names below are imported on first use, so that a module of the package that needs
no model library (``ringtrain.eval.settings``, read by ``ringtrain-eval --help``) loads
without torch.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "EvalReport": "metrics",
    "PromptOutcome": "metrics",
    "summarize": "metrics",
    "BlockDrafter": "speculative",
    "Generation": "speculative",
    "GreedyReference": "speculative",
    "greedy_generate": "speculative",
    "speculative_generate": "speculative",
    "VerifyingTarget": "target",
    "load_verifying_target": "target",
    "Divergence": "ties",
    "TieJudge": "ties",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
