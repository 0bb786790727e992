"""Greedy DFlash speculative decoding of one prompt, and the plain greedy reference.

One step: the drafter sees the target's tapped features of every committed token and
the block [anchor, MASK x (B-1)] at positions n..n+B-1 and proposes B-1 tokens; the
target scores the block in one forward; the longest prefix of proposals equal to the
target's own greedy choices is accepted, plus the target's next token (the bonus), which
becomes the next anchor. The output is therefore exactly the target's greedy output.

The loop (``decode_blocks``) takes the way each block is drafted and judged as a
``BlockSteps``: greedy here, sampling at a temperature in ringtrain.eval.sampled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache

from ringtrain.eval.target import VerifyingTarget
from ringtrain.eval.ties import Divergence, TieJudge
from ringtrain.generate.batch_decode import STOP_CHECK_EVERY


class BlockDrafter(Protocol):
    """What speculative decoding needs from a drafter."""

    block_size: int
    mask_token_id: int
    tap_layers: list[int]

    def propose(self, context: torch.Tensor, block: torch.Tensor, start: int) -> torch.Tensor:
        """Draft tokens [B-1] for block positions 1..B-1.

        ``context`` [n, K*H]: the target's tapped features of positions 0..n-1;
        ``block`` [B]: [anchor, MASK x (B-1)] at positions ``start``..``start``+B-1
        (``start`` == n).
        """
        ...


@dataclass
class Generation:
    """One decoded continuation: its tokens, per-block acceptance and wall time."""

    tokens: list[int]
    # Drafted tokens accepted by each verification forward (0..B-1; the bonus not included).
    accepted: list[int]
    seconds: float
    # Divergences from the greedy reference met on the way (speculative decoding only).
    divergences: list[Divergence] = field(default_factory=list)


def _truncate(tokens: list[int], max_new_tokens: int, stop_ids: Sequence[int]) -> list[int]:
    """Cut at ``max_new_tokens`` and after the first stop token (kept, as greedy keeps it)."""
    tokens = tokens[:max_new_tokens]
    stops = set(stop_ids)
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1]
    return tokens


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class GreedyReference:
    """What speculative decoding is checked against while it runs: the greedy continuation
    of the same prompt and the judge of each divergence (ringtrain.eval.ties).

    At a numerical tie decoding continues from the greedy token, so the rest of the
    output is still checked; at a real mismatch it stops there.
    """

    tokens: list[int]
    judge: TieJudge


def _follow(
    reference: GreedyReference,
    sequence: torch.Tensor,
    committed: int,
    new_tokens: list[int],
    prompt_len: int,
    divergences: list[Divergence],
) -> tuple[list[int], bool]:
    """Check the newly committed tokens ``new_tokens`` (sequence[committed + 1 ...]) against
    the reference.

    Returns (the tokens kept: up to and including the first divergence, which at a tie is
    replaced by the greedy token in ``sequence`` too; whether decoding must stop at a real
    mismatch).
    """
    first = committed + 1 - prompt_len  # continuation index of the first new token
    expected = reference.tokens[first : first + len(new_tokens)]
    for j, (token, greedy) in enumerate(zip(new_tokens, expected, strict=False)):
        if token != greedy:
            verdict = reference.judge.judge(sequence[: committed + 1 + j], first + j, token, greedy)
            divergences.append(verdict)
            if not verdict.tie:
                return new_tokens[: j + 1], True
            sequence[committed + 1 + j] = greedy
            return [*new_tokens[:j], greedy], False
    return new_tokens, False


def _draft_and_verify(
    target: VerifyingTarget,
    drafter: BlockDrafter,
    sequence: torch.Tensor,
    features: torch.Tensor,
    block: torch.Tensor,
    committed: int,
) -> list[int]:
    """One step: draft a block after ``committed`` tokens, verify it, write the accepted
    drafts and the bonus token into ``sequence``; returns those new tokens."""
    block_size = drafter.block_size
    block[0] = sequence[committed]
    drafts = drafter.propose(features[:committed], block, committed)
    sequence[committed + 1 : committed + block_size] = drafts
    greedy = target.verify(
        sequence, committed, block_size, features[committed : committed + block_size]
    )
    # The step's only host sync: the drafts and the target's choices, in one transfer.
    host = torch.cat((drafts, greedy)).tolist()
    proposed, chosen = host[: block_size - 1], host[block_size - 1 :]
    count = 0
    while count < block_size - 1 and proposed[count] == chosen[count]:
        count += 1
    sequence[committed + count + 1] = greedy[count]
    return [*proposed[:count], chosen[count]]


class BlockSteps(Protocol):
    """How speculative decoding picks its tokens: the first one after the prompt, then
    one block at a time."""

    block_size: int
    mask_token_id: int

    def first(
        self, target: VerifyingTarget, prompt: torch.Tensor, features: torch.Tensor
    ) -> torch.Tensor:
        """The token after ``prompt`` [n] (a 0-d tensor); its taps into ``features``."""
        ...

    def step(
        self,
        target: VerifyingTarget,
        sequence: torch.Tensor,
        features: torch.Tensor,
        block: torch.Tensor,
        committed: int,
    ) -> list[int]:
        """Draft a block after ``committed`` tokens, verify it, write the kept drafts and
        the target's own next token into ``sequence``; return those new tokens."""
        ...


@dataclass
class GreedySteps:
    """Greedy blocks: the drafter's proposals kept while they equal the target's argmax."""

    drafter: BlockDrafter

    @property
    def block_size(self) -> int:
        return self.drafter.block_size

    @property
    def mask_token_id(self) -> int:
        return self.drafter.mask_token_id

    def first(
        self, target: VerifyingTarget, prompt: torch.Tensor, features: torch.Tensor
    ) -> torch.Tensor:
        return target.prefill(prompt, features)

    def step(
        self,
        target: VerifyingTarget,
        sequence: torch.Tensor,
        features: torch.Tensor,
        block: torch.Tensor,
        committed: int,
    ) -> list[int]:
        return _draft_and_verify(target, self.drafter, sequence, features, block, committed)


def speculative_generate(
    target: VerifyingTarget,
    drafter: BlockDrafter,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    reference: GreedyReference | None = None,
) -> Generation:
    """Decode ``prompt_ids`` [n] greedily with DFlash speculation; lossless by construction.

    With a ``reference``, every committed token is checked against greedy as it is made
    (see GreedyReference); the divergences are in the result.
    """
    steps = GreedySteps(drafter)
    return decode_blocks(target, steps, prompt_ids, max_new_tokens, stop_ids, reference)


def decode_blocks(
    target: VerifyingTarget,
    steps: BlockSteps,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    reference: GreedyReference | None = None,
) -> Generation:
    """Decode ``prompt_ids`` [n] one block at a time by ``steps``, up to ``max_new_tokens``
    or a stop token; ``reference``: see speculative_generate."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    device = target.device
    block_size = steps.block_size
    prompt_len = int(prompt_ids.shape[0])
    capacity = prompt_len + max_new_tokens + block_size
    target.reserve(capacity)
    sequence = torch.empty(capacity, dtype=torch.long, device=device)
    features = torch.empty(capacity, target.tap_width, dtype=target.dtype, device=device)
    block = torch.full((block_size,), steps.mask_token_id, dtype=torch.long, device=device)
    stops = set(stop_ids)
    divergences: list[Divergence] = []
    judging = reference.judge.seconds if reference is not None else 0.0
    _sync(device)
    started = time.perf_counter()
    sequence[:prompt_len] = prompt_ids.to(device)
    sequence[prompt_len] = steps.first(target, sequence[:prompt_len], features[:prompt_len])
    committed = prompt_len  # tokens whose taps are known; sequence[committed] is the anchor
    accepted: list[int] = []
    new_tokens = [int(sequence[prompt_len])]
    stopped = False
    if reference is not None:
        new_tokens, stopped = _follow(
            reference, sequence, committed - 1, new_tokens, prompt_len, divergences
        )
    stopped = stopped or not stops.isdisjoint(new_tokens)
    while not stopped and committed + 1 - prompt_len < max_new_tokens:
        new_tokens = steps.step(target, sequence, features, block, committed)
        if reference is not None:
            new_tokens, stopped = _follow(
                reference, sequence, committed, new_tokens, prompt_len, divergences
            )
        count = len(new_tokens) - 1
        target.rollback(committed + count + 1)
        committed += count + 1
        accepted.append(count)
        stopped = stopped or not stops.isdisjoint(new_tokens)
    _sync(device)
    seconds = time.perf_counter() - started
    if reference is not None:
        seconds -= reference.judge.seconds - judging
    tokens = sequence[prompt_len : committed + 1].tolist()
    return Generation(_truncate(tokens, max_new_tokens, stop_ids), accepted, seconds, divergences)


def greedy_generate(
    target: VerifyingTarget,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
) -> Generation:
    """The reference: plain greedy decoding, one token per forward (see plain_generate)."""
    return plain_generate(target, prompt_ids, max_new_tokens, stop_ids)


# The token a plain decoding takes from a position's logits [V] (a 0-d tensor).
TokenPick = Callable[[torch.Tensor], torch.Tensor]


def plain_generate(
    target: VerifyingTarget,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    pick: TokenPick | None = None,
) -> Generation:
    """The target alone, one token per forward: greedy, or each token by ``pick``
    (a draw at a temperature: the baseline of sampled speculative decoding).

    In ``own`` mode on the target's greedy stepper (the own cache's one-token step, a CUDA
    graph on CUDA: the fair baseline for speed; its equality with transformers' greedy is
    tested). Otherwise with the model's own cache, which only ever grows here, so it is
    exact for every architecture (recurrent states included) and shares nothing with
    the speculative path (``--mode cache`` checks against it).
    """
    if target.mode == "own":
        return _plain_on_stepper(target, prompt_ids, max_new_tokens, stop_ids, pick)
    model = target.model
    device = target.device
    tokens = torch.empty(max_new_tokens, dtype=torch.long, device=device)
    stops = set(stop_ids)
    cache = DynamicCache(config=model.config)
    step_input = prompt_ids.to(device).unsqueeze(0)
    produced = 0
    _sync(device)
    started = time.perf_counter()
    with torch.inference_mode():
        while produced < max_new_tokens:
            logits = model(
                input_ids=step_input,
                use_cache=True,
                logits_to_keep=1,
                **{target.cache_keyword: cache},
            ).logits
            tokens[produced] = logits[0, -1].argmax() if pick is None else pick(logits[0, -1])
            step_input = tokens[produced : produced + 1].unsqueeze(0)
            produced += 1
            if stops and int(tokens[produced - 1]) in stops:
                break
    _sync(device)
    seconds = time.perf_counter() - started
    return Generation(tokens[:produced].tolist(), [], seconds)


def _plain_on_stepper(
    target: VerifyingTarget,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pick: TokenPick | None,
) -> Generation:
    """Plain decoding on the target's own-cache stepper (greedy: the argmax its graph
    takes; else ``pick`` of its logits); stop tokens are looked for every
    ``STOP_CHECK_EVERY`` tokens (one host sync each), the answer cut after the first."""
    device = target.device
    prompt_len = int(prompt_ids.shape[0])
    stepper = target.stepper(prompt_len + max_new_tokens + 1)
    scratch = torch.empty(prompt_len, target.tap_width, dtype=target.dtype, device=device)
    tokens = torch.empty(max_new_tokens, dtype=torch.long, device=device)
    stops = torch.tensor(list(stop_ids) or [-1], dtype=torch.long, device=device)
    choose = (lambda logits: logits.argmax()) if pick is None else pick
    produced = 1
    _sync(device)
    started = time.perf_counter()
    with torch.inference_mode():
        tokens[0] = choose(stepper.prefill(prompt_ids.to(device), scratch)[-1])
        while produced < max_new_tokens:
            if produced % STOP_CHECK_EVERY == 0 and bool(
                torch.isin(tokens[:produced], stops).any()
            ):
                break
            last = tokens[produced - 1 : produced]
            greedy = stepper.verify(last, prompt_len + produced - 1, scratch[:1])[0]
            tokens[produced] = greedy if pick is None else pick(stepper.logits[0])
            produced += 1
    _sync(device)
    seconds = time.perf_counter() - started
    answer = _truncate(tokens[:produced].tolist(), max_new_tokens, stop_ids)
    return Generation(answer, [], seconds)
