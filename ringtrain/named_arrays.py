"""Records of arrays keyed by field name, read as attributes (`item.input_ids`).

The ring and the data pipeline carry the arrays of a batch without spelling its fields
out (those are declared once, in batch.py): each keeps them in a dict, and this base
class lets readers write `item.input_ids` for `item.arrays["input_ids"]`.
"""

from __future__ import annotations

from typing import Any


class NamedArrays:
    """Arrays read by field name as attributes; a subclass keeps them in `self.arrays`."""

    arrays: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no array {name!r}") from None
