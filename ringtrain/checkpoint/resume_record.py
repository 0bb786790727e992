"""What a checkpoint records for an exact resume, besides weights and optimiser state.

`ResumeRecord` is written by save_checkpoint as the checkpoint's RESUME_FILE (JSON) and
read back by `read_resume_record` without loading any tensor (a target resuming its
data stream needs nothing else): the step, the run it belongs to, what decided its batch
sequence (`StreamIdentity`), per producer, where its stream resumes (`StreamCursor`), and
the held-out rounds already evaluated (`eval_step`).
The record is versioned: a file of another version (or of the free-form format before
versions) is refused with a message naming the file and the fix.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated

import msgspec

RESUME_FILE = "trainer_state.json"
RECORD_VERSION = 1


class CheckpointFormatError(ValueError):
    """A checkpoint whose resume record this version cannot read; the message says what to do."""


class StreamCursor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where one producer's batch stream resumes: the first sequence number not yet
    trained, and the later ones already trained (taken out of order)."""

    start: int = 0
    skip: tuple[int, ...] = ()


class StreamIdentity(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything that decides the targets' batch sequence (see resume_checks.py). Each
    field names what it records (`recorded_settings`), settings first, so the resume
    check names a changed setting before the rows it changes."""

    data_seed: Annotated[int, msgspec.Meta(description="data.seed")]
    token_budget: Annotated[int, msgspec.Meta(description="data.token_budget")]
    bucket: Annotated[int, msgspec.Meta(description="data.bucket")]
    max_len: Annotated[int, msgspec.Meta(description="data.max_len")]
    truncate: Annotated[bool, msgspec.Meta(description="data.truncate")]
    targets: Annotated[
        int, msgspec.Meta(description="target count (layout.targets_per_node x nodes)")
    ]
    target_tp: Annotated[int, msgspec.Meta(description="layout.target_tp")]
    data_path: Annotated[str, msgspec.Meta(description="data.path")]
    dataset_rows: Annotated[int, msgspec.Meta(description="dataset rows")]
    dataset_tokens: Annotated[int, msgspec.Meta(description="dataset tokens")]
    # blake2b of the dataset's row lengths
    row_lengths_hash: Annotated[str, msgspec.Meta(description="dataset row lengths (hash)")]


def recorded_settings() -> dict[str, str]:
    """What each field of StreamIdentity records, by field name, in field order."""
    hints = typing.get_type_hints(StreamIdentity, include_extras=True)
    return {
        name: hints[name].__metadata__[0].description for name in StreamIdentity.__struct_fields__
    }


class ResumeRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A checkpoint's resume record (see the module docstring)."""

    version: int = RECORD_VERSION
    step: int
    run_id: str | None = None  # latest_checkpoint skips other runs' checkpoints
    stream: StreamIdentity | None = None
    cursors: dict[int, StreamCursor] = msgspec.field(default_factory=dict)  # by producer
    # The step the last completed held-out round was due after (trainer/heldout.py); None
    # in records written before it was recorded, whose rounds up to `step` all ran.
    eval_step: int | None = None

    @property
    def evaluated_step(self) -> int:
        """The step the last held-out round completed before this checkpoint was due after."""
        return self.step if self.eval_step is None else self.eval_step


def encode_resume_record(record: ResumeRecord) -> bytes:
    """The record as the JSON text of RESUME_FILE."""
    return msgspec.json.encode(record) + b"\n"


def read_resume_record(checkpoint: str | Path) -> ResumeRecord:
    """The resume record of one checkpoint directory (no weights or state are loaded).

    Raises CheckpointFormatError naming the file when it is of another format."""
    path = Path(checkpoint) / RESUME_FILE
    data = path.read_bytes()
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise CheckpointFormatError(f"{path} cannot be read (not JSON: {exc})") from None
    version = raw.get("version") if isinstance(raw, dict) else None
    if version != RECORD_VERSION:
        written = "before resume records were versioned" if version is None else f"v{version}"
        raise CheckpointFormatError(
            f"{path}: resume record {written}, this ringtrain reads v{RECORD_VERSION}; resume "
            "this checkpoint with the ringtrain version that wrote it, or start a new run "
            "(another run.run_dir, or --overwrite)"
        )
    try:
        return msgspec.json.decode(data, type=ResumeRecord)
    except msgspec.ValidationError as exc:
        raise CheckpointFormatError(f"{path}: not a valid resume record ({exc})") from None
