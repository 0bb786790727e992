"""Which turns of a chat record to regenerate, and the regenerated record.

Input records are the `messages` / ShareGPT `conversations` JSONL lines that
`ringtrain-data prepare` reads (parsed by `ringtrain.data.chat`). Every assistant turn
is replaced by the target's answer to the conversation before it, in which the earlier
assistant turns are already the regenerated ones; a conversation that ends with a user
turn gets one more assistant turn, so a file of prompts works too.

The output record keeps the input's other top-level fields and holds `messages`
(role/content; `reasoning_content` on a regenerated turn when the engine returned
reasoning, which the chat templates of reasoning models render) and `regeneration`:
the input line, the model, and per regenerated turn the finish reason and token counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ringtrain.data.chat import conversation_messages, decode_record
from ringtrain.data.errors import DatasetError
from ringtrain.data.regen_client import ChatClient

TURN_KEYS = ("messages", "conversations")
REGENERATION_KEY = "regeneration"


@dataclass(frozen=True)
class InputRecord:
    """One conversation of the input file."""

    line: int  # 1-based line number in the input file
    fields: dict[str, Any]  # top-level fields other than the turns
    messages: list[dict[str, str]]


def turns_to_generate(messages: list[dict[str, str]]) -> list[int]:
    """Indices of the assistant turns to regenerate; `len(messages)` stands for the new
    turn answering a final user message."""
    turns = [index for index, message in enumerate(messages) if message["role"] == "assistant"]
    if messages[-1]["role"] == "user":
        turns.append(len(messages))
    return turns


def parse_record(line: bytes, number: int, source: str) -> InputRecord:
    """The conversation on input line `number`; raises DatasetError naming file and line."""
    where = f"{source}:{number}"
    record = decode_record(line, where)
    messages = conversation_messages(record, where)
    if not turns_to_generate(messages):
        raise DatasetError(
            f"{where}: nothing to regenerate: no assistant turn, and the conversation does "
            "not end with a user turn"
        )
    fields = {k: v for k, v in record.items() if k not in (*TURN_KEYS, REGENERATION_KEY)}
    return InputRecord(number, fields, messages)


async def regenerate_record(client: ChatClient, record: InputRecord) -> tuple[dict[str, Any], int]:
    """The regenerated record and the number of tokens generated for it."""
    messages = list(record.messages)
    turns = []
    generated = 0
    for index in turns_to_generate(messages):
        completion = await client.complete(messages[:index])
        answer = {"role": "assistant", "content": completion.content}
        if completion.reasoning_content is not None:
            answer["reasoning_content"] = completion.reasoning_content
        messages[index : index + 1] = [answer]
        generated += completion.completion_tokens
        turns.append(
            {
                "finish_reason": completion.finish_reason,
                "prompt_tokens": completion.prompt_tokens,
                "completion_tokens": completion.completion_tokens,
            }
        )
    regeneration = {"input_line": record.line, "model": client.sampling.model, "turns": turns}
    return {**record.fields, "messages": messages, REGENERATION_KEY: regeneration}, generated
