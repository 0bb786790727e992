"""The mutants of the drafter's automatic mask token, chosen from the target's tokenizer (ringtrain/drafter/mask_token.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

TESTS = ("tests/test_mask_token.py", "tests/test_mask_token_choice.py")

GROUPS = (
    Group("mask token", "ringtrain/drafter/mask_token.py", TESTS, (
        Mutant("the tokenizer's mask token taken past the model's vocabulary",
               "if mask_id is not None and 0 <= mask_id < vocab_size:",
               "if mask_id is not None and 0 <= mask_id:"),
        Mutant("a special token past the model's vocabulary taken",
               "if token.special and token_id < vocab_size", "if token.special"),
        Mutant("an added token that is not special taken as a mask or reserved token",
               "if token.special and token_id < vocab_size", "if token_id < vocab_size"),
        Mutant("a token that only begins as a mask taken as one (<|mask_start|>)",
               r'MASK_NAME = re.compile(r"^[<\[]\|?mask\|?[>\]]$", re.IGNORECASE)',
               r'MASK_NAME = re.compile(r"^[<\[]\|?mask", re.IGNORECASE)'),
        Mutant("a mask named in capitals ([MASK]) not recognised",
               r'MASK_NAME = re.compile(r"^[<\[]\|?mask\|?[>\]]$", re.IGNORECASE)',
               r'MASK_NAME = re.compile(r"^[<\[]\|?mask\|?[>\]]$")'),
        Mutant("a reserved token recognised only where its name begins with the word",
               "if RESERVED_NAME.search(text):", "if RESERVED_NAME.match(text):"),
        Mutant("the last reserved token taken, not the first",
               "for token_id, token in sorted(tokenizer.added_tokens_decoder.items())",
               "for token_id, token in sorted(tokenizer.added_tokens_decoder.items(), reverse=True)"),
        Mutant("an id past the tokenizer preferred to a special token named as a mask",
               "        if MASK_NAME.match(text):\n",
               "        if MASK_NAME.match(text) and len(tokenizer) >= vocab_size:\n"),
        Mutant("a reserved token preferred to an id past the tokenizer",
               "    if len(tokenizer) < vocab_size:\n",
               "    if len(tokenizer) < vocab_size and not any(map(RESERVED_NAME.search, special.values()))"
               ":\n"),
        Mutant("the id past the tokenizer taken when the vocabulary is no larger",
               "if len(tokenizer) < vocab_size:", "if len(tokenizer) <= vocab_size:"),
        Mutant("the tokenizer's last token taken as the first id past it",
               '            len(tokenizer), "", f"the first of',
               '            len(tokenizer) - 1, "", f"the first of'),
        Mutant("an ordinary last id chosen without a warning",
               '"the tokenizer has no mask or reserved token", ordinary=True)',
               '"the tokenizer has no mask or reserved token")'),
        Mutant("a target without a tokenizer given its last id without a warning",
               '"the target has no tokenizer to choose from", ordinary=True)',
               '"the target has no tokenizer to choose from")'),
    )),
)  # fmt: skip
