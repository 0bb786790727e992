"""Decoding the prompt sets of an evaluation, one assistant turn at a time.

Every turn is decoded twice, plain greedy (the reference) then speculatively, checked
against each other token for token. In a multi-turn conversation the greedy answer
(equal to the speculative one when decoding is lossless) is appended as the assistant
message before the next user turn, and the conversation is rendered again with the chat
template, as a chat client would send it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ringtrain.eval.metrics import PromptOutcome
from ringtrain.eval.speculative import (
    BlockDrafter,
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

WARMUP_TOKENS = 8


@dataclass
class TurnDecoder:
    """Greedy and speculative decoding of one prompt with fixed settings."""

    target: VerifyingTarget
    drafter: BlockDrafter
    judge: TieJudge
    stop_ids: list[int]
    max_new_tokens: int

    def warm_up(self, prompt: list[int]) -> None:
        """A few tokens of both decoders, so the first timed turn pays no one-off costs."""
        ids = torch.tensor(prompt, dtype=torch.long)
        speculative_generate(self.target, self.drafter, ids, WARMUP_TOKENS, self.stop_ids)
        greedy_generate(self.target, ids, WARMUP_TOKENS, self.stop_ids)

    def decode(self, prompt: list[int]) -> tuple[Generation, Generation]:
        """(greedy, speculative) continuations of ``prompt``, the latter checked as it goes."""
        ids = torch.tensor(prompt, dtype=torch.long)
        greedy = greedy_generate(self.target, ids, self.max_new_tokens, self.stop_ids)
        reference = GreedyReference(greedy.tokens, self.judge)
        speculative = speculative_generate(
            self.target, self.drafter, ids, self.max_new_tokens, self.stop_ids, reference
        )
        return greedy, speculative


def decode_conversation(
    conversation: Conversation,
    decoder: TurnDecoder,
    renderer: ChatRenderer,
    vocab_size: int,
) -> Iterator[tuple[int, list[int], Generation, Generation]]:
    """(turn, prompt ids, greedy, speculative) of each assistant turn, in order."""
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
        greedy, speculative = decoder.decode(prompt)
        yield turn, prompt, greedy, speculative
        history.append({"role": "assistant", "content": renderer.answer_text(greedy.tokens)})


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
                for turn, prompt_len, greedy, speculative in turns:
                    outcomes.append(
                        PromptOutcome(index, prompt_len, speculative, greedy, prompt_set.name, turn)
                    )
                    forwards += len(speculative.accepted)
                    gained += len(speculative.accepted) + sum(speculative.accepted)
                    bar.set_postfix(tau_real=f"{gained / max(forwards, 1):.2f}", refresh=False)
                    bar.update()
    return outcomes
