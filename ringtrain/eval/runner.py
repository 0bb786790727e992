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
from collections.abc import Iterator
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


def decode_sets(
    sets: list[PromptSet],
    decoder: TurnDecoder,
    renderer: ChatRenderer,
    vocab_size: int,
    shard: tuple[int, int] = (0, 1),
) -> list[PromptOutcome]:
    """Every assistant turn of every set, with a progress bar on stderr.

    ``shard`` (k, n): only the conversations whose index in their set is k modulo n
    (one of n processes decoding a share each); the bar is shown by shard 0 alone.
    """
    outcomes: list[PromptOutcome] = []
    forwards = gained = 0
    mine, shards = shard
    total = sum(c.turns for s in sets for c in s.conversations[mine::shards])
    with tqdm(total=total, unit="turn", file=sys.stderr, disable=mine != 0) as bar:
        for prompt_set in sets:
            bar.set_description(prompt_set.name)
            for index, conversation in enumerate(prompt_set.conversations):
                if index % shards != mine:
                    continue
                turns = decode_conversation(conversation, decoder, renderer, vocab_size)
                for turn, prompt, plain, speculative in turns:
                    outcomes.append(
                        PromptOutcome(
                            index,
                            len(prompt),
                            speculative,
                            plain,
                            prompt_set.name,
                            turn,
                            conversation.category,
                        )
                    )
                    forwards += len(speculative.accepted)
                    gained += len(speculative.accepted) + sum(speculative.accepted)
                    bar.set_postfix(tau_real=f"{gained / max(forwards, 1):.2f}", refresh=False)
                    bar.update()
    return outcomes
