"""The resumable output of synthesis: a chat JSONL file appended one whole record at a time.

Each synthesized conversation is one line written by a single append (as regenerate's
journal writes, ``regen_journal.append_whole``), so after a crash the file holds whole
records and at most a torn last line without its newline. Opening the output again
reads the records written (a rerun must not write their prompts again, and continues
after their last round), cuts off such a torn line, and refuses a file whose complete
lines are not synthesized records.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from ringtrain.data.errors import DatasetError
from ringtrain.data.regen_journal import append_whole

SYNTHESIS_KEY = "synthesis"


class _Synthesis(msgspec.Struct):
    round: int


class _Message(msgspec.Struct):
    role: str
    content: str


class SynthesizedRecord(msgspec.Struct):
    """What a rerun reads back of a written record."""

    messages: list[_Message]
    synthesis: _Synthesis

    @property
    def first_user_turn(self) -> str:
        """The content of the conversation's first user message."""
        return next(m.content for m in self.messages if m.role == "user")


def _not_synthesized(path: Path, number: int, why: str) -> DatasetError:
    return DatasetError(
        f"{path}:{number}: not a synthesized record ({why}); the file was changed by something "
        "else: fix or remove that line, or choose a new --output"
    )


def _read(path: Path) -> tuple[list[SynthesizedRecord], int]:
    """The records of ``path`` and the byte length of its complete lines."""
    decoder = msgspec.json.Decoder(SynthesizedRecord)
    records, length = [], 0
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.endswith(b"\n"):
                break  # torn by a crash during its write: cut off
            try:
                record = decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise _not_synthesized(path, number, str(exc)) from None
            if not any(message.role == "user" for message in record.messages):
                raise _not_synthesized(path, number, "no user turn")
            records.append(record)
            length += len(line)
    return records, length


class SynthesisOutput:
    """The output JSONL opened for appending, with the records it held when opened."""

    def __init__(self, output: Path) -> None:
        self.path = output
        self.records: list[SynthesizedRecord] = []
        self.cut_bytes = 0
        if output.exists():
            self.records, length = _read(output)
            self.cut_bytes = output.stat().st_size - length
            if self.cut_bytes:
                os.truncate(output, length)
        self._fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._encoder = msgspec.json.Encoder()

    @property
    def next_round(self) -> int:
        """The first round no written record came from."""
        return max((r.synthesis.round for r in self.records), default=-1) + 1

    def write(self, record: dict[str, Any]) -> None:
        """Append one conversation (it carries its ``synthesis.round``)."""
        append_whole(self._fd, self._encoder.encode(record) + b"\n")

    def close(self) -> None:
        """Flush the file to disk and close it."""
        os.fsync(self._fd)
        os.close(self._fd)
