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


# A task: (decoding, set, conversation) indexes: the decoder of ``decoders`` (one per
# temperature of the run), the prompt set and its conversation.
Task = tuple[int, int, int]


def conversation_tasks(sets: list[PromptSet], decodings: int) -> list[Task]:
    """The tasks of every conversation at each of ``decodings`` decoders, those of more
    turns first: handed out in this order, the long ones do not come last to a single
    worker."""
    tasks = [
        (d, s, i)
        for s, prompt_set in enumerate(sets)
        for i in range(len(prompt_set.conversations))
        for d in range(decodings)
    ]
    return sorted(tasks, key=lambda task: -sets[task[1]].conversations[task[2]].turns)


def decode_tasks(
    sets: list[PromptSet],
    decoders: list[TurnDecoder],
    renderer: ChatRenderer,
    vocab_size: int,
    pull: Callable[[tuple[int, list[PromptOutcome]] | None], Task | None],
) -> None:
    """Decode the tasks ``pull`` hands out (``conversation_tasks``), each one's outcomes
    reported with the next pull as (decoding, outcomes)."""
    report = None
    while (task := pull(report)) is not None:
        decoding, set_index, index = task
        prompt_set = sets[set_index]
        conversation = prompt_set.conversations[index]
        report = decoding, [
            PromptOutcome(
                index, len(prompt), speculative, plain, prompt_set.name, turn,
                conversation.category,
            )
            for turn, prompt, plain, speculative in decode_conversation(
                conversation, decoders[decoding], renderer, vocab_size
            )
        ]  # fmt: skip


class TurnProgress:
    """The outcomes of an evaluation as they are reported, per decoding (``labels``: one
    short name each, such as "T=0"), with a progress bar of every turn on stderr (the
    running tau_real of each decoding beside it), shown from the first report on (after
    the models loaded and the evaluation's first line)."""

    def __init__(self, sets: list[PromptSet], labels: list[str]) -> None:
        self.labels = labels
        self.outcomes: list[list[PromptOutcome]] = [[] for _ in labels]
        self.turns = sum(s.turns for s in sets) * len(labels)
        self.bar: tqdm | None = None
        # Per decoding: [verify forwards, tokens gained] so far.
        self.counts = [[0, 0] for _ in labels]

    def __enter__(self) -> TurnProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()

    def report(self, report: tuple[int, list[PromptOutcome]]) -> None:
        """One conversation's outcomes at one decoding."""
        decoding, outcomes = report
        if self.bar is None:
            self.bar = tqdm(total=self.turns, unit="turn", file=sys.stderr)
        self.outcomes[decoding] += outcomes
        counts = self.counts[decoding]
        for outcome in outcomes:
            accepted = outcome.speculative.accepted
            counts[0] += len(accepted)
            counts[1] += len(accepted) + sum(accepted)
        if outcomes:
            self.bar.set_description(outcomes[0].benchmark, refresh=False)
        taus = [gained / max(forwards, 1) for forwards, gained in self.counts]
        if len(taus) == 1:
            self.bar.set_postfix(tau_real=f"{taus[0]:.2f}", refresh=False)
        else:
            shown = ", ".join(
                f"{label} {tau:.2f}" for label, tau in zip(self.labels, taus, strict=True)
            )
            self.bar.set_postfix_str(f"tau_real {shown}", refresh=False)
        self.bar.update(len(outcomes))
