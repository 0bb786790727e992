"""One round of synthesis: a batch of user turns written by the target, filtered and deduplicated.

Each row of a round is steered by one ``Steering`` (the list is cycled over rows and
rounds): its system message, which goes into the conversation written, and its topic,
which only steers: a hint added to the system message the model writes under. The
model continues the template's prefix up to a user turn's content (``synth_template``),
sampled (temperature, top-p) from a generator seeded by the seed and the round; the
turns the filters drop and the first turns near a kept one are counted by reason.

With two turns, each kept first turn is answered greedily by the target (the answer
``regenerate`` would give under the same token limit), then the follow-up user turn is
written the same way after that answer. A round reports its generated tokens as they
come (``on_tokens``), so progress shows while it decodes.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ringtrain.data import synth_filters
from ringtrain.data.near_duplicates import NearDuplicateIndex
from ringtrain.data.synth_filters import FilterSettings, rejection
from ringtrain.data.synth_output import SYNTHESIS_KEY
from ringtrain.data.synth_steering import Steering
from ringtrain.data.synth_template import encode_prefix, user_turn_prefix
from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.local_model import LocalModel
from ringtrain.generate.sampling import TokenSampler


def round_seed(seed: int, number: int) -> int:
    """The sampling seed of round ``number``: fixed by the run's seed, new every round."""
    return random.Random(f"{seed}/{number}").getrandbits(63)


@dataclass(frozen=True)
class RoundSettings:
    """How a round samples and filters (the options that decide its records)."""

    turns: int
    temperature: float
    top_p: float
    seed: int
    max_tokens: int  # per written user turn
    answer_tokens: int  # per greedy answer before a follow-up turn
    topic_hint: str
    template_kwargs: dict[str, Any]


@dataclass
class RoundResult:
    """A round's kept conversations and what it generated and dropped."""

    records: list[dict[str, Any]]
    candidates: int
    tokens: int
    rejected: Counter


class Synthesizer:
    """Writes rounds of conversations with a loaded model."""

    def __init__(
        self,
        model: LocalModel,
        settings: RoundSettings,
        steering: list[Steering],
        filters: FilterSettings,
        index: NearDuplicateIndex,
    ) -> None:
        self.model = model
        self.tokenizer = model.tokenizer
        self.settings = settings
        self.steering = steering
        self.filters = filters
        self.index = index
        self.renderer = ChatRenderer(self.tokenizer, settings.template_kwargs)
        self.special_ids = set(self.tokenizer.all_special_ids)
        self._first_prefixes = [
            self._prefix(s.writing_history(settings.topic_hint)) for s in steering
        ]

    def _prefix(self, history: list[dict[str, str]]) -> list[int]:
        text = user_turn_prefix(self.tokenizer, history, self.settings.template_kwargs)
        return encode_prefix(self.tokenizer, text)

    def _write_turns(
        self,
        prompts: list[list[int]],
        sampler: TokenSampler,
        result: RoundResult,
        on_tokens: Callable[[int], None] | None,
    ) -> list[str | None]:
        """The user turns the model writes after ``prompts``; None for each one dropped."""
        answers, stats = self.model.answer(
            prompts, self.settings.max_tokens, sampler=sampler, on_tokens=on_tokens
        )
        result.tokens += stats.new_tokens
        turns: list[str | None] = []
        for answer in answers:
            body = answer.tokens if answer.truncated else answer.tokens[:-1]
            text = self.tokenizer.decode(body, skip_special_tokens=True).strip()
            special = any(token in self.special_ids for token in body)
            reason = rejection(text, answer.truncated, special, self.filters)
            if reason is not None:
                result.rejected[reason] += 1
            turns.append(None if reason else text)
        return turns

    def run(
        self, number: int, rows: int, on_tokens: Callable[[int], None] | None = None
    ) -> RoundResult:
        """Round ``number``: ``rows`` first turns written, filtered, deduplicated (and with
        two turns answered and followed up); ``on_tokens`` hears of generated tokens as
        they come (every few decode steps)."""
        settings = self.settings
        first_row = number * rows
        row_steering = [self.steering[(first_row + j) % len(self.steering)] for j in range(rows)]
        prompts = [self._first_prefixes[(first_row + j) % len(self.steering)] for j in range(rows)]
        sampler = TokenSampler.seeded(
            settings.temperature, settings.top_p, round_seed(settings.seed, number), self._device
        )
        result = RoundResult([], rows, 0, Counter())
        firsts = self._write_turns(prompts, sampler, result, on_tokens)
        kept = [(s, text) for s, text in zip(row_steering, firsts, strict=True) if text]
        fresh = self.index.keep([text for _, text in kept])
        result.rejected[synth_filters.NEAR_DUPLICATE] += fresh.count(False)
        conversations = [
            (s, [*s.kept_history(), {"role": "user", "content": text}])
            for (s, text), new in zip(kept, fresh, strict=True)
            if new
        ]
        if settings.turns == 2:
            conversations = self._follow_up(conversations, sampler, result, on_tokens)
        for steer, messages in conversations:
            synthesis: dict[str, Any] = {"round": number}
            if steer.topic is not None:
                synthesis["topic"] = steer.topic
            result.records.append({"messages": messages, SYNTHESIS_KEY: synthesis})
        return result

    @property
    def _device(self) -> Any:
        return next(self.model.model.parameters()).device

    def _follow_up(
        self,
        conversations: list[tuple[Steering, list[dict[str, str]]]],
        sampler: TokenSampler,
        result: RoundResult,
        on_tokens: Callable[[int], None] | None,
    ) -> list[tuple[Steering, list[dict[str, str]]]]:
        """Each conversation answered greedily and given a written follow-up user turn;
        those whose follow-up is dropped are dropped."""
        if not conversations:
            return []
        prompts = [
            self.renderer.render(messages, "a written user turn") for _, messages in conversations
        ]
        answers, stats = self.model.answer(
            prompts, self.settings.answer_tokens, on_tokens=on_tokens
        )
        result.tokens += stats.new_tokens
        answered, follow_prompts = [], []
        for (steer, messages), answer in zip(conversations, answers, strict=True):
            reply = {"role": "assistant", "content": self.renderer.answer_text(answer.tokens)}
            answered.append((steer, [*messages, reply]))
            history = [*steer.writing_history(self.settings.topic_hint), *messages[-1:], reply]
            follow_prompts.append(self._prefix(history))
        follow_ups = self._write_turns(follow_prompts, sampler, result, on_tokens)
        return [
            (steer, [*messages, {"role": "user", "content": text}])
            for (steer, messages), text in zip(answered, follow_ups, strict=True)
            if text
        ]
