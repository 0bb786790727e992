"""Answer every user turn of chat conversations with a local target, in batched rounds.

Round k renders the k-th user turn of each conversation that has one, after its earlier
turns and the target's own answers to them (assistant turns given in the input are
replaced), and answers all of them in one batched greedy call. Each assistant turn comes
back as (prompt ids, answer): the training row of that turn. Token-id prompts are one
turn. A `SampledShare` names conversations whose turns are drawn by a sampler instead
(a second batched call per round); the rows keep the input's order either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.greedy import Answer, GenerationStats
from ringtrain.generate.local_model import LocalModel
from ringtrain.generate.prompt_sets import Conversation
from ringtrain.generate.prompts import check_prompt_ids
from ringtrain.generate.sampling import TokenSampler


@dataclass(frozen=True)
class SampledShare:
    """Conversations (indices into the input) whose answers ``sampler`` draws."""

    sampler: TokenSampler
    conversations: frozenset[int]

    @classmethod
    def spread(cls, sampler: TokenSampler, count: int, fraction: float) -> SampledShare:
        """``fraction`` of ``count`` conversations, spread evenly over them (conversation
        i is drawn when the running share passes a whole number at i)."""
        chosen = (i for i in range(count) if int((i + 1) * fraction) > int(i * fraction))
        return cls(sampler, frozenset(chosen))


def user_segments(conversation: Conversation) -> list[list[dict[str, str]]]:
    """The conversation's messages up to and including each user turn, in order, without
    its assistant turns (the target answers each user turn itself)."""
    segments, current = [], []
    for message in conversation.messages:
        if message["role"] == "assistant":
            continue
        current.append(message)
        if message["role"] == "user":
            segments.append(current)
            current = []
    return segments


class AnsweredTurns(NamedTuple):
    """Every assistant turn of the conversations as a training row, round by round."""

    prompts: list[list[int]]  # each row's prompt ids (its history up to the user turn)
    answers: list[Answer]  # each row's answer
    conversations: list[int]  # each row's conversation (its index in the input)
    stats: GenerationStats


def answer_in_rounds(
    local: LocalModel,
    conversations: list[Conversation],
    renderer: ChatRenderer,
    max_new_tokens: int,
    on_batch: Callable[[int], None] | None = None,
    memory_budget: int | None = None,
    sampled: SampledShare | None = None,
) -> AnsweredTurns:
    """Every assistant turn: round k answers the k-th user turn of each conversation
    that has one, after its earlier turns and the target's answers (greedy, or drawn for
    the conversations of ``sampled``); every batch within ``memory_budget`` bytes when
    one is given."""
    segments = [
        user_segments(c) if c.messages is not None else [c.input_ids] for c in conversations
    ]
    histories: list[list[dict[str, str]]] = [[] for _ in conversations]
    prompts: list[list[int]] = []
    answers: list[Answer] = []
    owners: list[int] = []
    totals = GenerationStats(prompts=0, new_tokens=0, seconds=0.0, batches=0)
    for turn in range(max(map(len, segments), default=0)):
        active = [i for i, parts in enumerate(segments) if len(parts) > turn]
        round_prompts = []
        for i in active:
            conversation, part = conversations[i], segments[i][turn]
            if conversation.messages is None:
                round_prompts.append(part)
                continue
            histories[i] += part
            where = f"{conversation.where} turn {turn + 1}"
            ids = renderer.render(histories[i], where)
            round_prompts.append(check_prompt_ids(ids, local.vocab_size, where))
        by_row: dict[int, Answer] = {}
        for sampler, rows in _by_rule(active, sampled):
            if rows:
                rule_answers, stats = local.answer(
                    [round_prompts[row] for row in rows],
                    max_new_tokens,
                    on_batch=on_batch,
                    sampler=sampler,
                    memory_budget=memory_budget,
                )
                by_row.update(zip(rows, rule_answers, strict=True))
                totals += stats
        round_answers = [by_row[row] for row in range(len(active))]
        for i, answer in zip(active, round_answers, strict=True):
            reply = renderer.answer_text(answer.tokens)
            histories[i].append({"role": "assistant", "content": reply})
        prompts += round_prompts
        answers += round_answers
        owners += active
    return AnsweredTurns(prompts, answers, owners, totals)


def _by_rule(
    active: list[int], sampled: SampledShare | None
) -> list[tuple[TokenSampler | None, list[int]]]:
    """A round's rows (positions in ``active``) by how they are answered: (None, the
    greedy ones), then (the sampler, the drawn ones)."""
    if sampled is None:
        return [(None, list(range(len(active))))]
    drawn = [i in sampled.conversations for i in active]
    return [
        (None, [row for row, draws in enumerate(drawn) if not draws]),
        (sampled.sampler, [row for row, draws in enumerate(drawn) if draws]),
    ]
