"""The drafter's mask token when `drafter.mask_token_id = -1` (auto), from the target's tokenizer.

The mask token fills the block positions the drafter predicts, so it must be a token that
never occurs in text. Auto picks, in this order:

1. the tokenizer's mask token (`tokenizer.mask_token_id`);
2. a special token named as a mask (`<|mask|>`, `<mask>`, `[MASK]`);
3. the first id past the tokenizer's tokens when the model's vocabulary is larger (an
   embedding row no text maps to; Qwen3's 151669 is one);
4. the first special token named as reserved or unused (`<|reserved_special_token_0|>`,
   `<|reserved_200000|>`, `<unused0>`);
5. otherwise the last id of the vocabulary, which may be an ordinary token: the choice
   then says so (`MaskToken.ordinary`) and how to set one (`MaskToken.describe`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MASK_NAME = re.compile(r"^[<\[]\|?mask\|?[>\]]$", re.IGNORECASE)
RESERVED_NAME = re.compile(r"reserved|unused", re.IGNORECASE)


@dataclass(frozen=True)
class MaskToken:
    """The chosen mask token id, its text, and why it was chosen."""

    token_id: int
    text: str  # the token's text; "" for an id past the tokenizer's tokens
    reason: str
    ordinary: bool = False  # True: the fallback, possibly a token of ordinary text

    def describe(self) -> str:
        """One log line: the id, its text and why; for the fallback, how to choose one."""
        chosen = f"drafter.mask_token_id = -1 (auto): using id {self.token_id} {self.text!r}"
        if not self.ordinary:
            return f"{chosen}, {self.reason}"
        return (
            f"{chosen}, the last id of the vocabulary ({self.reason}); it may be an ordinary "
            "token of the text, which the drafter then cannot tell from a masked position: "
            "set drafter.mask_token_id = N to a token that never occurs in the data, e.g. an "
            "unused special token of the target's tokenizer"
        )


def choose_mask_token(tokenizer: Any | None, vocab_size: int) -> MaskToken:
    """The mask token for a model of `vocab_size` ids with `tokenizer` (None: none found)."""
    last = vocab_size - 1
    if tokenizer is None:
        return MaskToken(last, "", "the target has no tokenizer to choose from", ordinary=True)
    mask_id = tokenizer.mask_token_id
    if mask_id is not None and 0 <= mask_id < vocab_size:
        return MaskToken(mask_id, tokenizer.mask_token, "the tokenizer's mask token")
    special = {
        token_id: token.content
        for token_id, token in sorted(tokenizer.added_tokens_decoder.items())
        if token.special and token_id < vocab_size
    }
    for token_id, text in special.items():
        if MASK_NAME.match(text):
            return MaskToken(token_id, text, "a special token named as a mask")
    if len(tokenizer) < vocab_size:
        return MaskToken(
            len(tokenizer), "", f"the first of the ids {len(tokenizer)}..{last} no text maps to"
        )
    for token_id, text in special.items():
        if RESERVED_NAME.search(text):
            return MaskToken(token_id, text, "the first special token named reserved/unused")
    text = tokenizer.convert_ids_to_tokens(last)
    return MaskToken(last, text, "the tokenizer has no mask or reserved token", ordinary=True)
