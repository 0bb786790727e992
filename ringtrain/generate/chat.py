"""Chat prompts rendered with the target's chat template, as a server renders them.

A served chat model sees ``apply_chat_template(messages, add_generation_prompt=True)``
with the server's template options (``enable_thinking`` and the like) and, often, a
default system message. A drafter's acceptance means something only on prompts made
the same way, so evaluation renders its chat prompts exactly so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jinja2 import TemplateError

from ringtrain.generate.prompts import PromptFileError

if TYPE_CHECKING:  # imported for type hints only: prompt handling loads without it
    from transformers import PreTrainedTokenizerBase

NO_TEMPLATE_FIX = (
    "evaluate chat prompts with the target's instruct (chat) checkpoint, or give "
    '"prompt" text with --raw-prompts, or "input_ids"'
)


def check_messages(messages: object, where: str) -> list[dict[str, str]]:
    """The system and user messages of an OpenAI-style chat, checked.

    Assistant messages are left out: each user turn is answered by the target itself
    during evaluation, as it would be when served.
    """
    if not isinstance(messages, list) or not messages:
        raise PromptFileError(
            f'{where}: "messages" must be a non-empty list of {{"role", "content"}} objects'
        )
    kept = []
    for number, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise PromptFileError(
                f"{where}: message {number} must be an object with a text "
                f'"role" and "content", got {json_preview(message)}'
            )
        if message["role"] != "assistant":
            kept.append({"role": message["role"], "content": message["content"]})
    if not any(m["role"] == "user" for m in kept):
        raise PromptFileError(f'{where}: the conversation has no "user" message to answer')
    return kept


def json_preview(value: object, limit: int = 80) -> str:
    """A short repr of ``value`` for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ChatRenderer:
    """Renders conversations to prompt token ids with the target tokenizer's chat template."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None,
        template_kwargs: dict[str, object] | None = None,
        system: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.system = system

    @property
    def has_template(self) -> bool:
        """Whether the target directory has a tokenizer with a chat template."""
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def require_template(self, where: str) -> None:
        """Raise PromptFileError naming ``where`` when there is no chat template."""
        if not self.has_template:
            raise PromptFileError(
                f"{where}: the target directory has no chat template; {NO_TEMPLATE_FIX}"
            )

    def render(self, messages: list[dict[str, str]], where: str) -> list[int]:
        """Token ids of ``messages`` followed by the assistant generation prompt."""
        self.require_template(where)
        if self.system is not None and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.system}, *messages]
        try:
            ids = self.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **self.template_kwargs,
            )
        except TemplateError as exc:
            raise PromptFileError(
                f"{where}: the chat template refused the messages: {exc}"
            ) from None
        return list(ids)

    def answer_text(self, tokens: list[int]) -> str:
        """An assistant turn's text, as a server returns it (special tokens left out)."""
        return self.tokenizer.decode(tokens, skip_special_tokens=True)
