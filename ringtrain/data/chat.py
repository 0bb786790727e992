"""Turn one chat conversation into token ids and an assistant-token loss mask.

The conversation is rendered with the tokenizer's own chat template, exactly as the
target sees it at inference. The supervised span of assistant turn i runs from the end
of the template's generation prompt (`messages[:i]` rendered with
`add_generation_prompt=True`, which must be a prefix of the full rendering) to the end
of the template's end-of-turn marker (e.g. `<|im_end|>` for Qwen), found after that
start. So the mask covers what the model generates for the turn: its content (with any
reasoning block the template renders) and the end-of-turn token, not the role header
nor the newline after the marker. Tokens are mapped to the spans through the fast
tokenizer's character offsets.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from ringtrain.data.errors import DatasetError

ROLE_NAMES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "tool": "tool",
}
_SENTINEL = "RINGTRAIN-SENTINEL-7f3a"


def decode_record(line: bytes, where: str) -> Any:
    """One JSONL line decoded; `where` (file:line) names it in the error."""
    try:
        return msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise DatasetError(f"{where}: not valid JSON ({exc})") from None


def conversation_messages(record: Any, where: str) -> list[dict[str, str]]:
    """The messages of one JSONL record: `messages` or `conversations`, with role/content
    or ShareGPT-style from/value keys; roles normalised (human -> user, gpt -> assistant).
    A text `reasoning_content` is kept: chat templates of reasoning models render it."""
    turns = (
        record.get("messages", record.get("conversations")) if isinstance(record, dict) else None
    )
    if not isinstance(turns, list) or not turns:
        raise DatasetError(
            f"{where}: expected an object with a non-empty 'messages' or 'conversations' list"
        )
    messages = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DatasetError(f"{where}: message {index} is not an object")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role not in ROLE_NAMES:
            raise DatasetError(
                f"{where}: message {index} has role {role!r}; use one of {', '.join(ROLE_NAMES)}"
            )
        if not isinstance(content, str):
            raise DatasetError(f"{where}: message {index} has no text 'content' (or 'value')")
        message = {"role": ROLE_NAMES[role], "content": content}
        if isinstance(turn.get("reasoning_content"), str):
            message["reasoning_content"] = turn["reasoning_content"]
        messages.append(message)
    return messages


def _render(
    tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool, where: str
) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
    except Exception as exc:  # template errors come in many types (jinja, ValueError, ...)
        raise DatasetError(
            f"{where}: the chat template cannot render the first {len(messages)} message(s): {exc}"
        ) from None


def end_of_turn_marker(tokenizer: Any) -> str:
    """The text the chat template puts after an assistant message (trailing space cut)."""
    probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
    rendered = _render(tokenizer, probe, generation_prompt=False, where="template probe")
    marker = rendered[rendered.rfind(_SENTINEL) + len(_SENTINEL) :].rstrip()
    if _SENTINEL not in rendered or not marker:
        raise DatasetError(
            "the tokenizer's chat template has no end-of-turn marker after an assistant "
            "message; use the target's own tokenizer directory (with its chat template)"
        )
    return marker


class ConversationEncoder:
    """Encodes conversations with one tokenizer: ids int32 and loss mask uint8."""

    def __init__(self, tokenizer: Any, max_len: int | None = None) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise DatasetError(
                "the tokenizer is not a fast tokenizer (no character offsets); "
                "use a tokenizer directory with a tokenizer.json"
            )
        if not getattr(tokenizer, "chat_template", None):
            raise DatasetError(
                "the tokenizer has no chat template; use the target's own tokenizer directory"
            )
        self.tokenizer = tokenizer
        self.max_len = max_len
        self.end_of_turn = end_of_turn_marker(tokenizer)

    def assistant_spans(self, messages: list[dict[str, str]], text: str, where: str) -> np.ndarray:
        """Character spans [start, end) of the assistant turns in the rendered `text`."""
        spans = []
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = _render(self.tokenizer, messages[:index], generation_prompt=True, where=where)
            if not text.startswith(prompt):
                raise DatasetError(
                    f"{where}: the chat template renders the conversation before assistant "
                    f"message {index} differently on its own; cannot locate that turn"
                )
            end = text.find(self.end_of_turn, len(prompt))
            if end < 0:
                raise DatasetError(
                    f"{where}: no end-of-turn marker {self.end_of_turn!r} after assistant "
                    f"message {index} in the rendered conversation"
                )
            spans.append((len(prompt), end + len(self.end_of_turn)))
        return np.array(spans, dtype=np.int64).reshape(-1, 2)

    def encode(
        self, messages: list[dict[str, str]], where: str
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """(input_ids, loss_mask, truncated) of one conversation; the mask marks tokens
        that overlap an assistant span; rows are cut to `max_len` tokens if set."""
        text = _render(self.tokenizer, messages, generation_prompt=False, where=where)
        spans = self.assistant_spans(messages, text, where)
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(encoding["input_ids"], dtype=np.int32)
        offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        mask = np.zeros(len(ids), dtype=np.uint8)
        if len(spans):
            # The last span starting before each token's end; overlap if the token also
            # starts before that span ends (zero-width tokens never count).
            span = np.searchsorted(spans[:, 0], offsets[:, 1], side="left") - 1
            span_end = spans[np.maximum(span, 0), 1]
            mask[:] = (span >= 0) & (offsets[:, 0] < span_end) & (offsets[:, 1] > offsets[:, 0])
        truncated = self.max_len is not None and len(ids) > self.max_len
        if truncated:
            ids, mask = ids[: self.max_len], mask[: self.max_len]
        return ids, mask, truncated
