"""The batch ledger: which batches of each target's stream have been trained.

Each target rank produces a deterministic stream of batches (local sequence numbers
0, 1, 2, ...). Drafters take ready slots in any order, so at a checkpoint a target's
trained batches are a prefix [0, start) plus a few later ones (taken by a faster
drafter). Saving `start` and those later sequence numbers per target lets a resumed
target regenerate exactly the batches that were produced but never trained: none is
trained twice and none is skipped.
"""

from __future__ import annotations

from ringtrain.checkpoint import StreamCursor


class BatchLedger:
    """Trained sequence numbers per target rank, kept compact as prefix + exceptions."""

    def __init__(self, cursors: dict[int, StreamCursor] | None = None) -> None:
        self._start: dict[int, int] = {}
        self._above: dict[int, set[int]] = {}
        for target, cursor in (cursors or {}).items():
            self._start[target] = cursor.start
            self._above[target] = set(cursor.skip)

    def record(self, target: int, seq: int) -> None:
        """Mark batch `seq` of `target`'s stream as trained."""
        start = self._start.get(target, 0)
        above = self._above.setdefault(target, set())
        if seq < start or seq in above:
            raise RuntimeError(f"batch {seq} of target {target} was trained twice")
        above.add(seq)
        while start in above:
            above.remove(start)
            start += 1
        self._start[target] = start

    def cursor(self, target: int) -> StreamCursor:
        """Where `target` resumes: first untrained sequence number, and later trained ones."""
        return StreamCursor(self._start.get(target, 0), tuple(sorted(self._above.get(target, ()))))

    def cursors(self) -> dict[int, StreamCursor]:
        """The cursors of every target seen so far, by target index."""
        return {t: self.cursor(t) for t in sorted(self._start.keys() | self._above.keys())}
