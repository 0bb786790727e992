"""Settings of an evaluation that its command line checks before any model library loads.

``ringtrain-eval --help`` and its argument checks import this module alone (stdlib only),
so they answer at once; the modules that use the values import them from here.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

# Verification modes of ringtrain.eval.target (auto: own where it applies, else recompute).
VERIFY_MODES = ("auto", "own", "cache", "recompute")
# The largest float32 margin, in units in the last place of the top logit, for which a
# divergence from greedy is a numerical tie (ringtrain.eval.ties explains the figure).
DEFAULT_TIE_ULPS = 4.0


@dataclass(frozen=True)
class SamplingSettings:
    """Decoding at a temperature: softmax(logits / temperature) restricted to the top
    ``top_p`` of the probability mass, for the target and the drafter alike. ``seed``
    seeds every assistant turn's draws together with the turn's prompt, so a turn draws
    the same numbers however many processes share the prompts."""

    temperature: float
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(
                f"--temperature {self.temperature} must be a finite number above 0 to sample "
                "(0: greedy decoding)"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p {self.top_p} must be above 0 and at most 1")

    def describe(self) -> str:
        """The settings in words, for reports."""
        top_p = f", top-p {self.top_p:g}" if self.top_p < 1 else ""
        return f"sampling at temperature {self.temperature:g}{top_p}, seed {self.seed}"

    def turn_seed(self, prompt: list[int], stream: str) -> int:
        """The seed of one decoding of ``prompt`` (``stream`` tells the decodings of one
        turn apart): a hash of the seed, the stream and the prompt's tokens."""
        digest = hashlib.blake2b(digest_size=8)
        digest.update(f"{self.seed}:{stream}:".encode())
        digest.update(",".join(map(str, prompt)).encode())
        return int.from_bytes(digest.digest(), "little") >> 2
