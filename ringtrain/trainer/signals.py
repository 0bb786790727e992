"""SIGTERM/SIGINT handling: ask the loops to stop at a safe point instead of dying mid-step."""

from __future__ import annotations

import signal
import threading
from types import FrameType


class StopRequest:
    """Set when SIGTERM or SIGINT arrives; the loops poll it between steps."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, name: str) -> None:
        self.signal_name = self.signal_name or name
        self._event.set()

    def install(self) -> None:
        """Route SIGTERM and SIGINT to this request (main thread only)."""

        def handler(signum: int, _frame: FrameType | None) -> None:
            self.request(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
