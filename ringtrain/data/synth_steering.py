"""What each synthesized conversation is written under: a system message and a topic.

A run's system messages and topics are crossed into a list of ``Steering`` that rows of
every round cycle through. The system message goes into the conversation written (the
target answers under it later too); the topic only steers: a hint about the request to
come, added to the system message the model writes its user turn under.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TOPIC_HINT = "The user's next message is a request about {topic}."


@dataclass(frozen=True)
class Steering:
    """What one row is written under: a system message (kept) and a topic (a hint only)."""

    system: str | None = None
    topic: str | None = None

    def kept_history(self) -> list[dict[str, str]]:
        """The conversation's start as written to the output."""
        return [] if self.system is None else [{"role": "system", "content": self.system}]

    def writing_history(self, hint: str) -> list[dict[str, str]]:
        """The conversation's start the model writes user turns under."""
        parts = [self.system, hint.replace("{topic}", self.topic) if self.topic else None]
        system = "\n\n".join(p for p in parts if p)
        return [{"role": "system", "content": system}] if system else []


def steerings(systems: list[str], topics: list[str]) -> list[Steering]:
    """Every system message with every topic (none of either: the template's default)."""
    return [Steering(s, t) for s in (systems or [None]) for t in (topics or [None])]
