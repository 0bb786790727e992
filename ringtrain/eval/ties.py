"""Numerical ties: telling a rounding flip from a real divergence of speculative decoding.

Greedy speculative decoding is lossless in exact arithmetic: every committed token is
the target's argmax. In bf16 or fp16 the verification forward (a block of B tokens, or
the whole sequence) and the one-token greedy forward take different kernels, tilings and
accumulation orders, so where the target's two best logits nearly tie, the two paths can
pick different tokens. The judge decides each divergence from greedy by recomputing the
target's logits at that position in float32 (the same weights, upcast):

- ``margin``: how far below the float32 maximum the lower of the two tokens' logits lies
  (for the usual flip between the top two tokens, the top-1/top-2 margin).
- A divergence is a ``numerical_tie`` when the evaluation runs in bf16 or fp16 and
  ``margin`` is at most ``tie_ulps`` units in the last place of the evaluation dtype at
  the magnitude of the top logit. Default 4: the logits themselves are rounded to one
  ulp (two tokens one ulp apart are indistinguishable in the output), and each of the
  two paths carries a rounding error of the last hidden state of the order of one or
  two ulps of the logit; a bug (wrong position, stale cache, wrong features) moves a
  logit by far more. bf16 has 8 significant bits: at a top logit of 20 one ulp is
  0.125, so the default tolerance is 0.5. In float32 every divergence is a failure.
- A divergence where speculative decoding committed the float32 argmax (``exact``) is a
  numerical tie whatever its margin: there greedy's own rounding moved its token off the
  exact one, and speculative decoding kept the target's true choice; a bug does not
  land on the exact argmax where rounding already split the two paths. The margin then
  says how far greedy's token lies below it.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel

from ringtrain.eval.settings import DEFAULT_TIE_ULPS

# Significant bits (the implicit one included) of the dtypes whose divergences can be ties.
SIGNIFICANT_BITS = {torch.bfloat16: 8, torch.float16: 11}


@dataclass(frozen=True)
class Divergence:
    """One position where speculative decoding committed another token than greedy."""

    position: int  # index in the generated continuation (0: first new token)
    speculative: int
    greedy: int
    margin: float  # float32 shortfall of the lower of the two tokens below the top logit
    tolerance: float  # the largest margin counted as a tie (0 where no tie is allowed)
    exact: int  # the float32 argmax at the position
    tie: bool  # a numerical tie (bf16/fp16, margin <= tolerance or speculative == exact)

    def as_dict(self, prompt: int) -> dict:
        """A JSON-ready record naming the prompt."""
        return {"prompt": prompt, **asdict(self)}


def ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` numbers at ``value``; 0 for dtypes without ties (float32)."""
    bits = SIGNIFICANT_BITS.get(dtype)
    if bits is None:
        return 0.0
    exponent = math.frexp(max(abs(value), 1.0))[1] - 1  # value in [2^e, 2^(e+1))
    return math.ldexp(1.0, exponent - (bits - 1))


class TieJudge:
    """Judges divergences of one target against its float32 recomputation (made on first use)."""

    def __init__(self, model: PreTrainedModel, tie_ulps: float = DEFAULT_TIE_ULPS) -> None:
        if tie_ulps < 0:
            raise ValueError(f"tie tolerance must be at least 0 ulps, got {tie_ulps}")
        self.model = model
        self.dtype = next(model.parameters()).dtype
        self.tie_ulps = tie_ulps
        self.seconds = 0.0  # spent judging (decoding speed figures leave it out)
        self._reference: PreTrainedModel | None = None

    @property
    def allows_ties(self) -> bool:
        """Whether divergences can be ties at all (bf16 or fp16 evaluation)."""
        return self.dtype in SIGNIFICANT_BITS and self.tie_ulps > 0

    def describe(self) -> str:
        """The rule in words, for reports."""
        if not self.allows_ties:
            return f"exact ({self.dtype_name}: every divergence from greedy fails)"
        return (
            f"{self.dtype_name}: a divergence whose float32 margin is within "
            f"{self.tie_ulps:g} ulps of the top logit, or where speculative decoding kept "
            "the float32 argmax, is a numerical tie"
        )

    @property
    def dtype_name(self) -> str:
        """The evaluation dtype without the ``torch.`` prefix."""
        return str(self.dtype).removeprefix("torch.")

    def float32_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """float32 logits [V] for the token after ``tokens`` [n] (no cache, one forward)."""
        if self._reference is None:
            self._reference = copy.deepcopy(self.model).float()
        with torch.inference_mode():
            out = self._reference(input_ids=tokens.unsqueeze(0), use_cache=False, logits_to_keep=1)
        return out.logits[0, -1].float()

    def judge(
        self, tokens: torch.Tensor, position: int, speculative: int, greedy: int
    ) -> Divergence:
        """The verdict on committing ``speculative`` where greedy committed ``greedy``.

        ``tokens`` [n]: the prompt and the agreed continuation before the divergence;
        ``position``: the divergence's index in the continuation.
        """
        started = time.perf_counter()
        logits = self.float32_logits(tokens)
        top = float(logits.max())
        exact = int(logits.argmax())
        margin = top - min(float(logits[speculative]), float(logits[greedy]))
        tolerance = self.tie_ulps * ulp(top, self.dtype) if self.allows_ties else 0.0
        tie = self.allows_ties and (margin <= tolerance or speculative == exact)
        self.seconds += time.perf_counter() - started
        return Divergence(position, speculative, greedy, margin, tolerance, exact, tie)
