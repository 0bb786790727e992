"""Continuous batching for decoding (greedy, or drawn by a ``TokenSampler``): a slot takes the next
prompt as soon as its answer ends.

A batch decoded to its end hands back no answer before its longest one ends, and on a
CPU, where a step costs in proportion to the rows it runs, it keeps paying for rows
that stopped long ago. ``SlotDecoder`` instead keeps up to ``slots`` answers in
progress. Each decode step runs the model once on the active slots; each slot writes its
key and value at its own position of ``SlotCache`` (so slots of different lengths share
a step), and attention reads the positions up to the longest slot only. An answer that
reaches a stop token (kept) or its token limit is returned by the step that ends it, and
its slot is freed: the last active slot moves into the gap, so the active slots are
always the first rows and a step never runs an idle row. New prompts are admitted
between steps, their prompt forwards batched (left-padded, their keys and values then
copied into their slots' rows).

Eager steps (no CUDA graphs), for models whose layers are all full attention
(``supports_cache_rollback``), as ``batch_decode``. The cache starts long enough for
``max_new_tokens`` after a prompt of ``INITIAL_PROMPT`` tokens and grows by
``LENGTH_STEP`` positions when a longer prompt comes, as far as the memory budget
allows (``DecodeFootprint``); a prompt that needs more is refused with ``TooLong``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ringtrain.generate.batch_decode import (
    BATCH_DECODE,
    DecodeCache,
    attention_for_decoding,
    prompt_mask,
)
from ringtrain.generate.greedy import Answer, left_padded
from ringtrain.generate.memory import DecodeFootprint, format_size
from ringtrain.generate.sampling import TokenSampler, next_tokens

INITIAL_PROMPT = 512
SHORTEST_PROMPT = 64
LENGTH_STEP = 256


class TooLong(Exception):
    """A prompt whose answer needs more memory than the budget allows."""

    @classmethod
    def of(cls, prompt: int, new_tokens: int, need: int, budget: int, answers: int) -> TooLong:
        """The refusal of a ``prompt``-token prompt whose ``new_tokens`` answer needs
        ``need`` bytes at ``answers`` answers at once."""
        return cls(
            f"a prompt of {prompt} tokens with {new_tokens} new ones needs {format_size(need)} "
            f"at {answers} answers at once and generation may use {format_size(budget)}: "
            "rerun with a smaller --batch-size or --max-tokens (or a higher --memory-limit)"
        )


class DoesNotFit(Exception):
    """Not even one answer fits the memory budget; the message says what to change."""


@dataclass
class Request:
    """One prompt to answer; ``key`` is the caller's, handed back with the answer."""

    key: object
    prompt: list[int]
    max_new_tokens: int


@dataclass
class _Slot:
    """An answer in progress: its request, its tokens so far, and the cache position the
    next step writes its last token at."""

    request: Request
    tokens: list[int] = field(default_factory=list)
    position: int = 0


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def _step_bytes(footprint: DecodeFootprint, rows: int) -> int:
    """One decode step's activations and logits beside the cache."""
    return footprint.prompt_forward(rows, 1)


def _prefill_bytes(footprint: DecodeFootprint, rows: int, width: int) -> int:
    """A prompt forward of ``rows`` prompts padded to ``width``, with its own cache."""
    return footprint.prompt_forward(rows, width) + footprint.cache(rows, width)


def plan_slots(
    footprint: DecodeFootprint, budget: int, slots: int, max_new_tokens: int
) -> tuple[int, int]:
    """(slots, cache length) that fit ``budget`` bytes: at most ``slots``, each long
    enough for ``max_new_tokens`` after an ``INITIAL_PROMPT``-token prompt, or after a
    ``SHORTEST_PROMPT``-token one when not even one slot of that length fits. Raises
    DoesNotFit when none does."""
    need = 0
    for prompt in (INITIAL_PROMPT, SHORTEST_PROMPT):
        length = _round_up(prompt + max_new_tokens, SHORTEST_PROMPT)
        per_slot = footprint.cache(1, length) + _step_bytes(footprint, 1)
        need = _prefill_bytes(footprint, 1, prompt) + per_slot
        if need <= budget:
            return min(slots, 1 + (budget - need) // per_slot), length
    raise DoesNotFit(
        f"one answer of {max_new_tokens} tokens needs {format_size(need)} (its KV cache and "
        f"the prompt's forward) and generation may use {format_size(budget)}: lower "
        "--max-tokens, or free memory (or raise --memory-limit)"
    )


class SlotCache:
    """Every layer's keys and values [slots, Hkv, length, D]; a step writes each active
    slot's one position and attends the first ``horizon`` positions."""

    def __init__(self, model: PreTrainedModel, slots: int, length: int) -> None:
        config = model.config.get_text_config()
        heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        parameter = next(model.parameters())
        self.dtype, self.device = parameter.dtype, parameter.device
        layers = int(config.num_hidden_layers)
        self.keys = [self._zeros(slots, length) for _ in range(layers)]
        self.values = [self._zeros(slots, length) for _ in range(layers)]
        self.kernel = "sdpa"
        self.rows = torch.arange(slots, device=self.device)
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self.horizon = 0

    def _zeros(self, slots: int, length: int) -> torch.Tensor:
        shape = (slots, self.kv_heads, length, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    @property
    def length(self) -> int:
        """Positions each slot holds."""
        return int(self.keys[0].shape[2])

    def grow(self, length: int) -> None:
        """Make every slot ``length`` positions long, keeping what they hold."""
        for buffers in (self.keys, self.values):
            for layer, old in enumerate(buffers):
                buffers[layer] = self._zeros(old.shape[0], length)
                buffers[layer][:, :, : old.shape[2]] = old

    def place(self, slot: int, prefill: DecodeCache, row: int, length: int) -> None:
        """Copy the last ``length`` positions of ``row`` of a prompt forward's cache to
        the first positions of ``slot``."""
        width = prefill.length
        for mine, theirs in ((self.keys, prefill.keys), (self.values, prefill.values)):
            for layer, buffer in enumerate(mine):
                buffer[slot, :, :length] = theirs[layer][row, :, width - length :]

    def move(self, source: int, target: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``source`` to slot ``target``."""
        for buffer in (*self.keys, *self.values):
            buffer[target, :, :length] = buffer[source, :, :length]

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention function's hook: store one position per active slot at the
        slot's own position; return the active slots' first ``horizon`` positions."""
        active = key.shape[0]
        rows = self.rows[:active]
        self.keys[layer][rows, :, self.positions] = key[:, :, 0]
        self.values[layer][rows, :, self.positions] = value[:, :, 0]
        return (
            self.keys[layer][:active, :, : self.horizon],
            self.values[layer][:active, :, : self.horizon],
        )


class SlotDecoder:
    """Answers by continuous batching (see the module's docstring): greedy, or drawn by
    ``sampler``. Run ``admit`` and ``step`` within ``decoding()``."""

    def __init__(
        self,
        model: PreTrainedModel,
        slots: int,
        max_new_tokens: int,
        stop_ids: list[int],
        pad_id: int,
        budget: int,
        sampler: TokenSampler | None = None,
    ) -> None:
        self.model = model
        self.sampler = sampler
        self.footprint = DecodeFootprint.of(model.config, next(model.parameters()).dtype)
        self.budget = budget
        self.slots, length = plan_slots(self.footprint, budget, slots, max_new_tokens)
        self.cache = SlotCache(model, self.slots, length)
        self.keep = self._keep(length)
        self.active: list[_Slot] = []
        self.stops = set(stop_ids)
        self.pad_id = pad_id

    def _keep(self, length: int) -> torch.Tensor:
        """Which cache positions each slot attends [slots, 1, 1, length]."""
        return torch.zeros(self.slots, 1, 1, length, dtype=torch.bool, device=self.cache.device)

    @property
    def free(self) -> int:
        """Slots without an answer in progress."""
        return self.slots - len(self.active)

    def decoding(self) -> AbstractContextManager[None]:
        """The model's attention set to the one ``SlotCache`` hooks into."""
        return attention_for_decoding(self.model, BATCH_DECODE)

    @torch.inference_mode()
    def admit(self, requests: list[Request]) -> list[tuple[Request, Answer | TooLong]]:
        """Start answering ``requests`` (at most ``free``). Returns those settled at
        once: refused (``TooLong``), or answered by the prompt forward alone."""
        if len(requests) > self.free:
            raise ValueError(f"{len(requests)} requests for {self.free} free slots")
        settled: list[tuple[Request, Answer | TooLong]] = []
        accepted = []
        for request in sorted(requests, key=lambda r: len(r.prompt)):
            try:
                self._make_room(request)
            except TooLong as error:
                settled.append((request, error))
            else:
                accepted.append(request)
        for group in self._prefill_groups(accepted):
            settled += self._prefill(group)
        return settled

    def _spare(self) -> int:
        """Bytes of the budget left beside the cache and a full decode step."""
        used = self.footprint.cache(self.slots, self.cache.length)
        return self.budget - used - _step_bytes(self.footprint, self.slots)

    def _make_room(self, request: Request) -> None:
        """Grow the cache for ``request`` if needed; raises TooLong when it cannot fit."""
        prompt = len(request.prompt)
        needed = prompt + request.max_new_tokens
        length = max(self.cache.length, _round_up(needed, LENGTH_STEP))
        grown = self.footprint.cache(self.slots, length - self.cache.length)
        if _prefill_bytes(self.footprint, 1, prompt) + grown > self._spare():
            total = self.footprint.cache(self.slots, length) + _prefill_bytes(
                self.footprint, 1, prompt
            )
            raise TooLong.of(prompt, request.max_new_tokens, total, self.budget, self.slots)
        if length > self.cache.length:
            self.cache.grow(length)
            keep = self._keep(length)
            keep[..., : self.keep.shape[-1]] = self.keep
            self.keep = keep

    def _prefill_groups(self, requests: list[Request]) -> list[list[Request]]:
        """``requests`` (sorted by length) cut into prompt forwards that fit the budget."""
        groups: list[list[Request]] = []
        for request in requests:
            width = len(request.prompt)
            if (
                groups
                and _prefill_bytes(self.footprint, len(groups[-1]) + 1, width) <= self._spare()
            ):
                groups[-1].append(request)
            else:
                groups.append([request])
        return groups

    def _prefill(self, group: list[Request]) -> list[tuple[Request, Answer | TooLong]]:
        """Run the prompts of ``group`` and put each into a free slot."""
        device = self.cache.device
        ids, mask = left_padded([r.prompt for r in group], self.pad_id, bucket=1)
        ids, valid = ids.to(device), mask.to(device).bool()
        prefill = DecodeCache(self.model, len(group), ids.shape[1], "sdpa", device)
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=ids,
            attention_mask=prompt_mask(valid),
            position_ids=positions,
            use_cache=False,
            logits_to_keep=1,
            decode_cache=prefill,
        ).logits[:, -1]
        settled: list[tuple[Request, Answer | TooLong]] = []
        picked = next_tokens(logits, self.sampler).tolist()
        for row, (request, token) in enumerate(zip(group, picked, strict=True)):
            index, length = len(self.active), len(request.prompt)
            self.cache.place(index, prefill, row, length)
            self.keep[index] = False
            self.keep[index, ..., :length] = True
            slot = _Slot(request, [token], position=length)
            answer = self._ended(slot)
            if answer is None:
                self.active.append(slot)
            else:
                settled.append((request, answer))
        return settled

    def _ended(self, slot: _Slot) -> Answer | None:
        """The slot's answer once it has ended, else None."""
        if slot.tokens[-1] in self.stops:
            return Answer(slot.tokens, truncated=False)
        if len(slot.tokens) >= slot.request.max_new_tokens:
            return Answer(slot.tokens, truncated=True)
        return None

    @torch.inference_mode()
    def step(self) -> list[tuple[Request, Answer]]:
        """One token for every active slot; returns the answers that ended."""
        active = self.active
        if not active:
            return []
        device = self.cache.device
        positions = torch.tensor([slot.position for slot in active], device=device)
        tokens = torch.tensor([[slot.tokens[-1]] for slot in active], device=device)
        self.cache.positions = positions
        self.cache.horizon = max(slot.position for slot in active) + 1
        self.keep[self.cache.rows[: len(active)], 0, 0, positions] = True
        logits = self.model(
            input_ids=tokens,
            attention_mask=self.keep[: len(active), ..., : self.cache.horizon],
            position_ids=positions[:, None],
            use_cache=False,
            logits_to_keep=1,
            decode_cache=self.cache,
        ).logits[:, -1]
        chosen = next_tokens(logits, self.sampler).tolist()
        ended = []
        for index in reversed(range(len(active))):
            slot = active[index]
            slot.tokens.append(chosen[index])
            slot.position += 1
            answer = self._ended(slot)
            if answer is not None:
                ended.append((slot.request, answer))
                self._free(index)
        return ended[::-1]

    def _free(self, index: int) -> None:
        """Drop the answer of slot ``index``; the last active slot moves into its place."""
        last = len(self.active) - 1
        if index != last:
            moving = self.active[last]
            self.cache.move(last, index, moving.position)
            self.keep[index] = self.keep[last]
            self.active[index] = moving
        self.active.pop()
