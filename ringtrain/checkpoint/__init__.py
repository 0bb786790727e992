"""Drafter checkpoints: saving, verifying, loading, retention, the resume record and the
checks and state of a resume (layout.py says what a checkpoint directory holds)."""

from ringtrain.checkpoint.layout import CheckpointError
from ringtrain.checkpoint.load import LoadedCheckpoint, load_checkpoint
from ringtrain.checkpoint.resume_record import ResumeRecord, StreamCursor, read_resume_record
from ringtrain.checkpoint.save import save_checkpoint
from ringtrain.checkpoint.verify import checkpoint_spec, latest_checkpoint

__all__ = [
    "CheckpointError",
    "LoadedCheckpoint",
    "ResumeRecord",
    "StreamCursor",
    "checkpoint_spec",
    "latest_checkpoint",
    "load_checkpoint",
    "read_resume_record",
    "save_checkpoint",
]
