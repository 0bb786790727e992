"""The one exception type of the data pipeline."""

from __future__ import annotations


class DatasetError(ValueError):
    """A dataset that cannot be used; the message names the file (and row) and the fix."""
