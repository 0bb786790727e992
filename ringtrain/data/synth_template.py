"""The chat template's text up to where a user turn's content goes, and its role markers.

Synthesis lets the target write user turns itself (the Magpie method): the model is
given the rendered conversation so far followed by the header of a new user turn (for
ChatML: ``<|im_start|>user\\n``) and continues it. That prefix is found by rendering the
conversation with a sentinel as the user's content and cutting the text before the
sentinel, so every template works, with its default system message and options.

The same renderings give the template's markers (special tokens and role headers), which
a written user turn must not contain: text that does has leaked out of the template.
"""

from __future__ import annotations

from typing import Any

from ringtrain.data.errors import DatasetError

SENTINEL = "RINGTRAIN-USER-TURN-5d1c"
ANSWER_SENTINEL = "RINGTRAIN-ASSISTANT-TURN-9b2e"
# Marker pieces shorter than this are too common in ordinary text to mean a leak.
MIN_MARKER_CHARS = 3


def require_chat_template(tokenizer: Any, target: str) -> None:
    """Raise DatasetError naming ``target`` when its tokenizer has no chat template."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        missing = "no tokenizer" if tokenizer is None else "no chat template"
        raise DatasetError(
            f"--target {target}: the model has {missing}; synthesize writes user turns from "
            "the chat template's user-turn header: use the instruct (chat) checkpoint, whose "
            "tokenizer_config.json (or chat_template.jinja) holds the template"
        )


def _render(tokenizer: Any, messages: list[dict[str, str]], template_kwargs: dict) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=False, **template_kwargs
        )
    except Exception as exc:  # jinja2's TemplateError and the template's raise_exception
        roles = "/".join(m["role"] for m in messages)
        raise DatasetError(
            f"the chat template refused a {roles} conversation ({exc}); if it rejects the "
            "system role, leave out --system and --topic"
        ) from None


def user_turn_prefix(
    tokenizer: Any, history: list[dict[str, str]], template_kwargs: dict | None = None
) -> str:
    """The rendered text of ``history`` followed by a new user turn, up to its content."""
    messages = [*history, {"role": "user", "content": SENTINEL}]
    text = _render(tokenizer, messages, dict(template_kwargs or {}))
    if text.count(SENTINEL) != 1:
        raise DatasetError(
            "the chat template does not render the user's content once as given (found "
            f"{text.count(SENTINEL)} times); synthesize cannot find where a user turn starts"
        )
    return text[: text.index(SENTINEL)]


def encode_prefix(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered prefix (its special tokens are in the text already)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def template_markers(tokenizer: Any, template_kwargs: dict | None = None) -> list[str]:
    """Texts that mark the template's structure: the tokenizer's special tokens and the
    lines the template writes between a user's content and the assistant's."""
    kwargs = dict(template_kwargs or {})
    messages = [
        {"role": "user", "content": SENTINEL},
        {"role": "assistant", "content": ANSWER_SENTINEL},
    ]
    text = _render(tokenizer, messages, kwargs)
    between = text.split(SENTINEL, 1)[-1].split(ANSWER_SENTINEL, 1)[0]
    pieces = {line.strip() for line in between.splitlines()}
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted(p for p in pieces | specials if len(p) >= MIN_MARKER_CHARS)
