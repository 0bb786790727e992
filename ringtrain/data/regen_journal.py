"""The resumable output of regeneration: a JSONL file appended one whole record at a time.

Each regenerated record is one line, written by a single append (`O_APPEND`, no Python
buffering), so a record is in the file entirely or, after a crash in the middle of the
write, as a last line without its newline. Opening the journal again reads which input
lines are done (`regeneration.input_line` of every complete line), cuts off such a torn
last line, and refuses a file whose complete lines do not parse or repeat an input
line. So a rerun skips what is done, and no record is written twice or counted done
half-written.

Beside it, `<output>.settings.json` holds the settings that decide the records (input,
model, sampling); a rerun with other settings is refused rather than mixing two
generations in one file (an empty output holds no records: its settings are replaced).
`<output>.errors.jsonl` lists the records that failed in the latest run (input line,
file:line, reason); a rerun retries them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec

from ringtrain.data.errors import DatasetError


class _Regeneration(msgspec.Struct):
    input_line: int


class _Entry(msgspec.Struct):
    regeneration: _Regeneration


def errors_path(output: Path) -> Path:
    """Where the records that failed are listed."""
    return output.with_name(output.name + ".errors.jsonl")


def settings_path(output: Path) -> Path:
    """Where the settings that made the output are kept."""
    return output.with_name(output.name + ".settings.json")


def append_whole(fd: int, data: bytes) -> None:
    """Append `data`; a short write continues (the record is whole once this returns)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _scan(path: Path) -> tuple[set[int], int]:
    """The input lines done in `path` and the byte length of its complete lines."""
    done: set[int] = set()
    decoder = msgspec.json.Decoder(_Entry)
    length = 0
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.endswith(b"\n"):
                break  # torn by a crash during its write: not done, cut off
            try:
                input_line = decoder.decode(line).regeneration.input_line
            except msgspec.DecodeError as exc:
                raise DatasetError(
                    f"{path}:{number}: not a regenerated record ({exc}); the file was changed "
                    "by something else: fix or remove that line, or choose a new --output"
                ) from None
            if input_line in done:
                raise DatasetError(
                    f"{path}:{number}: input line {input_line} is already in the file; "
                    "remove the duplicate line, or choose a new --output"
                )
            done.add(input_line)
            length += len(line)
    return done, length


def check_settings(output: Path, settings: dict[str, Any], resume: bool) -> None:
    """Keep `settings` beside a new output; an existing one must have been made with them."""
    stored = settings_path(output)
    if resume and not output.exists():
        raise DatasetError(f"{output}: nothing to resume (no such file)")
    if output.exists() and output.stat().st_size and stored.is_file():
        previous = json.loads(stored.read_text())
        changed = [key for key in settings if previous.get(key) != settings[key]]
        if changed:
            differences = "; ".join(f"{k}: {previous.get(k)!r} -> {settings[k]!r}" for k in changed)
            raise DatasetError(
                f"{output}: made with other settings ({differences}); rerun with the same "
                "settings to continue it, or choose a new --output"
            )
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = stored.with_name(stored.name + ".partial")
    partial.write_text(json.dumps(settings, indent=1) + "\n")
    partial.replace(stored)


def remove_if_empty(output: Path) -> bool:
    """After a run: when `output` holds no record, remove it and its settings (and the
    errors file unless it lists failures), so nothing blocks a run with other settings.
    Returns whether the output was empty."""
    if output.exists() and output.stat().st_size:
        return False
    output.unlink(missing_ok=True)
    settings_path(output).unlink(missing_ok=True)
    errors = errors_path(output)
    if errors.exists() and not errors.stat().st_size:
        errors.unlink()
    return True


class Journal:
    """The output JSONL opened for appending, and the errors file of this run."""

    def __init__(self, output: Path) -> None:
        self.path = output
        self.done: set[int] = set()
        self.cut_bytes = 0
        if output.exists():
            self.done, length = _scan(output)
            self.cut_bytes = output.stat().st_size - length
            if self.cut_bytes:
                os.truncate(output, length)
        self._fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._errors_fd = os.open(
            errors_path(output), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644
        )
        self._encoder = msgspec.json.Encoder()
        self.errors = 0

    def write(self, record: dict[str, Any]) -> None:
        """Append one regenerated record (it carries its `regeneration.input_line`)."""
        append_whole(self._fd, self._encoder.encode(record) + b"\n")

    def write_error(self, line: int, where: str, reason: str) -> None:
        """List a record that failed, with the reason."""
        entry = {"input_line": line, "where": where, "error": reason}
        append_whole(self._errors_fd, self._encoder.encode(entry) + b"\n")
        self.errors += 1

    def close(self) -> None:
        """Flush both files to disk and close them."""
        for fd in (self._fd, self._errors_fd):
            os.fsync(fd)
            os.close(fd)
