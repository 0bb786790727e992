"""Chat records for the regenerate tests and what the output should hold for each.

The expected output is worked out here independently of ringtrain's code: the answer of
`ringtrain/testing/chat_server.py` is a function of the whole conversation it is sent, so matching
contents prove that each request carried the right conversation (its earlier assistant
turns being the regenerated ones).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ringtrain.testing.chat_server import answer_for

MODEL = "echo"
ROLES = {"human": "user", "gpt": "assistant"}


def chat(index: int) -> dict[str, Any]:
    """Record `index`: single and multi-turn, messages and ShareGPT, prompt-only, extra fields."""
    kind = index % 4
    if kind == 0:
        turns = [("user", f"question {index}"), ("assistant", "an old answer")]
        return {"id": index, "messages": [{"role": r, "content": c} for r, c in turns]}
    if kind == 1:
        turns = [
            ("system", "you are terse"),
            ("human", f"first {index}"),
            ("gpt", "old one"),
            ("human", f"second {index}"),
            ("gpt", "old two"),
        ]
        return {"id": index, "conversations": [{"from": r, "value": c} for r, c in turns]}
    if kind == 2:
        return {
            "id": index,
            "source": "prompts",
            "messages": [{"role": "user", "content": f"p{index}"}],
        }
    turns = [("system", "be brief"), ("user", f"a{index}"), ("assistant", "old"), ("user", "and?")]
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


def write_chats(path: Path, count: int, bad_lines: dict[int, str] | None = None) -> list[int]:
    """Write `count` good records (and `bad_lines`: line number -> raw text); returns the
    line numbers of the good records."""
    bad_lines = bad_lines or {}
    good, lines = [], []
    index = 0
    while len(good) < count:
        number = len(lines) + 1
        if number in bad_lines:
            lines.append(bad_lines[number])
            continue
        lines.append(json.dumps(chat(index)))
        good.append(number)
        index += 1
    path.write_text("\n".join(lines) + "\n")
    return good


def expected_record(record: dict[str, Any], line: int, **sampling: Any) -> dict[str, Any]:
    """The regenerated record: every assistant turn (and one after a final user turn)
    answered given the regenerated conversation before it."""
    source = record.get("messages", record.get("conversations"))
    messages = [
        {
            "role": ROLES.get(m.get("role", m.get("from")), m.get("role", m.get("from"))),
            "content": m.get("content", m.get("value")),
        }
        for m in source
    ]
    done: list[dict[str, Any]] = []
    turns = []
    for message in [
        *messages,
        *([{"role": "assistant"}] if messages[-1]["role"] == "user" else []),
    ]:
        if message["role"] != "assistant":
            done.append(message)
            continue
        body = {"model": MODEL, "messages": list(done), "temperature": 0.0, "max_tokens": 4096}
        response = answer_for({**body, **sampling})
        choice = response["choices"][0]
        answer = {"role": "assistant", "content": choice["message"]["content"]}
        if "reasoning_content" in choice["message"]:
            answer["reasoning_content"] = choice["message"]["reasoning_content"]
        done.append(answer)
        turns.append(
            {
                "finish_reason": choice["finish_reason"],
                "prompt_tokens": response["usage"]["prompt_tokens"],
                "completion_tokens": response["usage"]["completion_tokens"],
            }
        )
    fields = {k: v for k, v in record.items() if k not in ("messages", "conversations")}
    return {
        **fields,
        "messages": done,
        "regeneration": {"input_line": line, "model": MODEL, "turns": turns},
    }


def read_output(path: Path) -> dict[int, dict[str, Any]]:
    """The output records by input line; fails on a line that appears twice."""
    records: dict[int, dict[str, Any]] = {}
    for text in path.read_text().splitlines():
        record = json.loads(text)
        line = record["regeneration"]["input_line"]
        assert line not in records, f"input line {line} written twice"
        records[line] = record
    return records


def assert_all_regenerated(
    input_path: Path, output: Path, good_lines: list[int], **sampling: Any
) -> None:
    """Every good input line is in the output exactly once, with the right contents."""
    records = read_output(output)
    assert sorted(records) == good_lines
    lines = input_path.read_text().splitlines()
    for number in good_lines:
        expected = expected_record(json.loads(lines[number - 1]), number, **sampling)
        assert records[number] == expected, f"input line {number}"
