"""Decoding the prompt sets of an evaluation, one assistant turn at a time.

Every turn is decoded twice: by the target alone (the reference and the baseline of
speed) and speculatively. Greedy (temperature 0), the two are checked against each
other token for token. At a temperature both are drawn (ringtrain.eval.sampled), each
from a seed made of the evaluation's seed and the turn's prompt, so figures do not
depend on how many processes share the prompts. In a multi-turn conversation the answer
(greedy: the reference, equal to the speculative one when decoding is lossless; at a
temperature: the speculative one, a draw of the target's distribution) is appended as
the assistant message before the next user turn, and the conversation is rendered again
with the chat template, as a chat client would send it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ringtrain.eval.dflash import DFlashBlockDrafter
from ringtrain.eval.metrics import PromptOutcome
from ringtrain.eval.sampled import sampled_generate, sampled_speculative_generate
from ringtrain.eval.settings import SamplingSettings
from ringtrain.eval.speculative import (
    Generation,
    GreedyReference,
    greedy_generate,
    speculative_generate,
)
from ringtrain.eval.target import VerifyingTarget
from ringtrain.eval.ties import TieJudge
from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.prompt_sets import Conversation, PromptSet
from ringtrain.generate.prompts import check_prompt_ids
from ringtrain.generate.sampling import TokenSampler

WARMUP_TOKENS = 8


@dataclass
class TurnDecoder:
    """Plain and speculative decoding of one prompt with fixed settings: greedy, or drawn
    at the ``sampling`` settings."""

    target: VerifyingTarget
    drafter: DFlashBlockDrafter
    judge: TieJudge
    stop_ids: list[int]
    max_new_tokens: int
    sampling: SamplingSettings | None = None

    def warm_up(self, prompt: list[int]) -> None:
        """A few tokens of both decoders, so the first timed turn pays no one-off costs."""
        decoder = TurnDecoder(
            self.target, self.drafter, self.judge, self.stop_ids, WARMUP_TOKENS, self.sampling
        )
        decoder.decode(prompt, checked=False)

    def decode(self, prompt: list[int], checked: bool = True) -> tuple[Generation, Generation]:
        """(plain, speculative) continuations of ``prompt``; greedy, the speculative one is
        checked against the plain one as it goes (``checked``)."""
        ids = torch.tensor(prompt, dtype=torch.long)
        new, stops = self.max_new_tokens, self.stop_ids
        if self.sampling is not None:
            plain = sampled_generate(self.target, ids, new, self._sampler(prompt, "plain"), stops)
            speculative = sampled_speculative_generate(
                self.target, self.drafter, ids, new, self._sampler(prompt, "speculative"), stops
            )
            return plain, speculative
        greedy = greedy_generate(self.target, ids, new, stops)
        reference = GreedyReference(greedy.tokens, self.judge) if checked else None
        return greedy, speculative_generate(self.target, self.drafter, ids, new, stops, reference)

    def answer(self, plain: Generation, speculative: Generation) -> list[int]:
        """The tokens of the assistant turn a conversation goes on from (module docstring)."""
        return plain.tokens if self.sampling is None else speculative.tokens

    def _sampler(self, prompt: list[int], stream: str) -> TokenSampler:
        settings = self.sampling
        seed = settings.turn_seed(prompt, stream)
        return TokenSampler.seeded(settings.temperature, settings.top_p, seed, self.target.device)


def decode_conversation(
    conversation: Conversation,
    decoder: TurnDecoder,
    renderer: ChatRenderer,
    vocab_size: int,
) -> Iterator[tuple[int, list[int], Generation, Generation]]:
    """(turn, prompt ids, plain, speculative) of each assistant turn, in order."""
    if conversation.input_ids is not None:
        yield 1, conversation.input_ids, *decoder.decode(conversation.input_ids)
        return
    history: list[dict[str, str]] = []
    turn = 0
    for message in conversation.messages:
        history.append(message)
        if message["role"] != "user":
            continue
        turn += 1
        where = f"{conversation.where} turn {turn}"
        prompt = check_prompt_ids(renderer.render(history, where), vocab_size, where)
        plain, speculative = decoder.decode(prompt)
        yield turn, prompt, plain, speculative
        answer = decoder.answer(plain, speculative)
        history.append({"role": "assistant", "content": renderer.answer_text(answer)})


def conversation_tasks(sets: list[PromptSet]) -> list[tuple[int, int]]:
    """(set, conversation) index pairs of every conversation, those of more turns first:
    handed out in this order, the long ones do not come last to a single worker."""
    pairs = [
        (s, i) for s, prompt_set in enumerate(sets) for i in range(len(prompt_set.conversations))
    ]
    return sorted(pairs, key=lambda pair: -sets[pair[0]].conversations[pair[1]].turns)


def decode_tasks(
    sets: list[PromptSet],
    decoder: TurnDecoder,
    renderer: ChatRenderer,
    vocab_size: int,
    pull: Callable[[list[PromptOutcome] | None], tuple[int, int] | None],
) -> None:
    """Decode the conversations ``pull`` hands out ((set, conversation) index pairs of
    ``conversation_tasks``), each one's outcomes reported with the next pull."""
    report = None
    while (task := pull(report)) is not None:
        set_index, index = task
        prompt_set = sets[set_index]
        conversation = prompt_set.conversations[index]
        report = [
            PromptOutcome(
                index, len(prompt), speculative, plain, prompt_set.name, turn,
                conversation.category,
            )
            for turn, prompt, plain, speculative in decode_conversation(
                conversation, decoder, renderer, vocab_size
            )
        ]  # fmt: skip


class TurnProgress:
    """The outcomes of an evaluation as they are reported, with a progress bar of every
    turn on stderr (its running tau_real beside it), shown from the first report on (after
    the models loaded and the evaluation's first line)."""

    def __init__(self, sets: list[PromptSet]) -> None:
        self.outcomes: list[PromptOutcome] = []
        self.turns = sum(s.turns for s in sets)
        self.bar: tqdm | None = None
        self.forwards = self.gained = 0

    def __enter__(self) -> TurnProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()

    def report(self, outcomes: list[PromptOutcome]) -> None:
        """One conversation's outcomes."""
        if self.bar is None:
            self.bar = tqdm(total=self.turns, unit="turn", file=sys.stderr)
        self.outcomes += outcomes
        for outcome in outcomes:
            accepted = outcome.speculative.accepted
            self.forwards += len(accepted)
            self.gained += len(accepted) + sum(accepted)
        if outcomes:
            self.bar.set_description(outcomes[0].benchmark, refresh=False)
        tau = self.gained / max(self.forwards, 1)
        self.bar.set_postfix(tau_real=f"{tau:.2f}", refresh=False)
        self.bar.update(len(outcomes))
