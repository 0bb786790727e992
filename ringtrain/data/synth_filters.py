"""Which written user turns to keep: the filters of synthesis, each with a named reason.

A user turn the target writes from its template is dropped when it is empty, was cut
at the token limit (an unfinished request), is shorter or longer than the word limits,
leaks the template (special tokens or role headers inside the text: the model wrote
past its turn), reads as the assistant's voice (a refusal, "how can I help you"), or is
not text (broken bytes, control characters, mostly symbols, one word repeated).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

EMPTY = "empty"
CUT = "cut at --max-tokens"
TOO_SHORT = "too short"
TOO_LONG = "too long"
LEAK = "template leak"
REFUSAL = "assistant voice"
NOT_TEXT = "not text"
NEAR_DUPLICATE = "near duplicate"
REASONS = (EMPTY, CUT, TOO_SHORT, TOO_LONG, LEAK, REFUSAL, NOT_TEXT, NEAR_DUPLICATE)

# The assistant's voice at the start of a turn: refusals, apologies, offers of help.
ASSISTANT_VOICE = re.compile(
    r"^\W*(i'?m sorry|i am sorry|sorry, (but )?i|i apologi[sz]e|i can'?not|i can'?t (help|"
    r"assist|provide|do)|i'?m (not able|unable)|i am (not able|unable)|as an ai|as a "
    r"language model|i'?m an ai|i am an ai|hello!? how can i|hi!? how can i|how can i "
    r"(help|assist) you)",
    re.IGNORECASE,
)
WORD = re.compile(r"\w+")
# A text is not text when fewer of its non-space characters than this are letters or digits.
MIN_ALNUM_FRACTION = 0.4
# ... or when it has at least REPEAT_MIN_WORDS words and so few distinct ones.
REPEAT_MIN_WORDS = 12
MIN_DISTINCT_FRACTION = 0.3


@dataclass(frozen=True)
class FilterSettings:
    """Word limits of a kept user turn and the template's markers (see synth_template)."""

    min_words: int = 3
    max_words: int = 400
    markers: tuple[str, ...] = ()


def words(text: str) -> list[str]:
    """The lower-cased words of ``text``."""
    return WORD.findall(text.lower())


def _not_text(text: str, text_words: list[str]) -> bool:
    if "\ufffd" in text:  # bytes that did not decode
        return True
    if any(unicodedata.category(c) == "Cc" and c not in "\n\t\r" for c in text):
        return True
    visible = [c for c in text if not c.isspace()]
    if sum(c.isalnum() for c in visible) < MIN_ALNUM_FRACTION * len(visible):
        return True
    return len(text_words) >= REPEAT_MIN_WORDS and len(
        set(text_words)
    ) < MIN_DISTINCT_FRACTION * len(text_words)


def rejection(
    text: str, truncated: bool, special_tokens: bool, settings: FilterSettings
) -> str | None:
    """Why a written user turn is dropped (one of REASONS), or None to keep it.

    ``special_tokens``: the turn's tokens hold a special token before its stop token."""
    stripped = text.strip()
    if not stripped:
        return EMPTY
    if truncated:
        return CUT
    if special_tokens or any(marker in stripped for marker in settings.markers):
        return LEAK
    text_words = words(stripped)
    if len(text_words) < settings.min_words:
        return TOO_SHORT
    if len(text_words) > settings.max_words:
        return TOO_LONG
    if ASSISTANT_VOICE.search(stripped):
        return REFUSAL
    if _not_text(stripped, text_words):
        return NOT_TEXT
    return None


def count_line(counts: dict[str, int], order: Iterable[str] = REASONS) -> str:
    """'reason N, reason N' for the reasons counted, in ``order``."""
    return ", ".join(f"{reason} {counts[reason]}" for reason in order if counts.get(reason))
