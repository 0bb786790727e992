"""Greedy decoding of one batch of left-padded prompts with a key/value cache of our own.

transformers' ``generate`` spends most of a decode step's time outside the model at
large batches (mask building, logits processors, a host sync per step) and its caches
change between releases. Here the model runs with ``use_cache=False`` and an attention
function of this module (registered with transformers' attention interface) keeps every
layer's keys and values in preallocated buffers [B, Hkv, L, D], writing each step's one
position at a device-side index. Masks are given to the model ready-made (a 4-D boolean
mask is used as it is), so a decode step has no host sync and no shape change: on CUDA it
is captured once per batch as a CUDA graph and replayed.

The one-token attention reads each key/value head once for the query heads that share
it (grouped-query attention), either as two batched matmuls or through SDPA with the
query heads of a group folded into its query length (``KERNELS``).

Only for targets whose layers are all full attention (``supports_cache_rollback``):
sliding-window and linear-attention layers keep state this cache does not model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ringtrain.generate.sampling import TokenSampler, next_tokens

KERNELS = ("matmul", "sdpa")
BATCH_DECODE = "ringtrain_batch_decode"
# Decode steps between two checks whether every row has stopped (each check syncs).
STOP_CHECK_EVERY = 16

log = logging.getLogger(__name__)


def one_token_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    keep: torch.Tensor | None,
    scale: float,
    kernel: str,
) -> torch.Tensor:
    """Attention of one query position: ``query`` [B, Hq, 1, D] over ``key``/``value``
    [B, Hkv, L, D]; ``keep`` a boolean [B, 1, 1, L] (True: attend) or None. Returns
    [B, 1, Hq, D]."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    if kernel == "sdpa":
        out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=keep, scale=scale)
    else:
        scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1).to(value.dtype), value)
    # SDPA's float32 kernels may return another memory layout than bf16's: reshape, not view.
    return out.reshape(batch, heads, 1, dim).transpose(1, 2)


class DecodeCache:
    """Every layer's keys and values [B, Hkv, L, D], the next position to write (a device
    tensor, so a CUDA graph replays it) and the one-token kernel."""

    def __init__(
        self, model: PreTrainedModel, batch: int, length: int, kernel: str, device: torch.device
    ) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"decode kernel {kernel!r} is not one of {', '.join(KERNELS)}")
        config = model.config
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        dtype = next(model.parameters()).dtype
        shape = (batch, kv_heads, length, dim)
        layers = int(config.num_hidden_layers)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.offsets = torch.arange(length, device=device)
        self.kernel = kernel

    @property
    def length(self) -> int:
        """Positions the cache holds."""
        return int(self.offsets.shape[0])

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this forward's q positions of keys/values from ``position`` on (the caller
        advances ``position``); return the layer's whole buffers."""
        index = self.position + self.offsets[: key.shape[2]]
        self.keys[layer].index_copy_(2, index, key)
        self.values[layer].index_copy_(2, index, value)
        return self.keys[layer], self.values[layer]


def batch_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    decode_cache: DecodeCache | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface. With a ``decode_cache`` keys/values go through it
    and a longer query (a prompt, a verified block) sees its first ``mask.shape[-1]``
    positions; without one (transformers' own cache) they are the cache's. A one-token
    query runs ``one_token_attention`` (the cache's kernel, else matmul), a longer one SDPA."""
    if decode_cache is not None:
        key, value = decode_cache.write(module.layer_idx, key, value)
        if query.shape[2] != 1:
            key, value = (
                key[:, :, : attention_mask.shape[-1]],
                value[:, :, : attention_mask.shape[-1]],
            )
    if query.shape[2] != 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    keep = None if attention_mask is None else attention_mask[:, :, -1:, : key.shape[2]]
    kernel = decode_cache.kernel if decode_cache is not None else "matmul"
    return one_token_attention(query, key, value, keep, scale, kernel), None


def batch_decode_mask(*args: object, **kwargs: object) -> torch.Tensor | None:
    """SDPA's boolean mask, never skipped, for forwards with transformers' cache: a static
    cache's unwritten slots must be masked (with a decode_cache the mask is given whole)."""
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


AttentionInterface.register(BATCH_DECODE, batch_decode_attention)
AttentionMaskInterface.register(BATCH_DECODE, batch_decode_mask)


@contextmanager
def attention_for_decoding(model: PreTrainedModel, implementation: str | None) -> Iterator[None]:
    """Within the block, ``model`` uses the named attention implementation (None: its own)."""
    if implementation is None:
        yield
        return
    previous = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@dataclass
class StepState:
    """The device tensors one decode step reads and advances (a CUDA graph's inputs)."""

    token: torch.Tensor  # [B, 1] the last token of every row
    positions: torch.Tensor  # [B, 1] its position id
    keep: torch.Tensor  # [B, 1, 1, L] cache positions a query may attend
    out: torch.Tensor  # [B, N] new tokens (pad after a row's stop)
    column: torch.Tensor  # [1] the next column of ``out``
    done: torch.Tensor  # [B] rows that produced a stop token
    stops: torch.Tensor  # stop ids
    pad_id: int
    sampler: TokenSampler | None = None  # None: greedy


def prompt_mask(valid: torch.Tensor) -> torch.Tensor:
    """The prompt forward's boolean mask [B, 1, W, W]: causal, padding never attended;
    a padding query attends itself (a row with nothing to attend would give NaN)."""
    width = valid.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=valid.device).tril()
    itself = torch.eye(width, dtype=torch.bool, device=valid.device)
    return (causal[None] & (valid[:, None, :] | itself[None]))[:, None]


def _record(state: StepState, logits: torch.Tensor) -> None:
    """Take the greedy (or the sampler's) token of ``logits`` [B, V] as every row's next
    token."""
    chosen = torch.where(state.done, state.pad_id, next_tokens(logits, state.sampler))
    state.out.index_copy_(1, state.column, chosen[:, None])
    state.done |= torch.isin(chosen, state.stops)
    state.token.copy_(chosen[:, None])
    state.column += 1


def _step(model: PreTrainedModel, cache: DecodeCache, state: StepState) -> None:
    """One decode step: the last tokens in, their successors recorded."""
    state.keep.index_fill_(-1, cache.position, True)
    logits = model(
        input_ids=state.token,
        attention_mask=state.keep,
        position_ids=state.positions,
        use_cache=False,
        logits_to_keep=1,
        decode_cache=cache,
    ).logits[:, -1]
    _record(state, logits)
    cache.position += 1
    state.positions += 1


def captured(
    step: Callable[[], None], generator: torch.Generator | None = None
) -> torch.cuda.CUDAGraph | None:
    """``step`` captured (not run) as a CUDA graph, after a first run on a side stream
    (allocator and kernel choices settle there); None, with a warning, when capture fails.
    The first run is real: ``step`` must be one the caller wanted run anyway. A
    ``generator`` the step draws from is registered, so each replay draws anew."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    try:
        with torch.cuda.graph(graph):
            step()
    except RuntimeError as error:
        log.warning("step not captured as a CUDA graph (%s); running it eagerly", error)
        return None
    return graph


def decode_batch(
    model: PreTrainedModel,
    ids: torch.Tensor,
    valid: torch.Tensor,
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
    kernel: str = "sdpa",
    graph: bool = True,
    sampler: TokenSampler | None = None,
    on_check: Callable[[StepState], None] | None = None,
) -> torch.Tensor:
    """The greedy new tokens [B, max_new_tokens] of left-padded ``ids`` [B, W] (``valid``
    marks real tokens); after a row's stop token the row holds ``pad_id``.

    ``graph``: on CUDA, replay the decode step as a CUDA graph. ``sampler``: draw the
    tokens from it instead of taking the greedy ones. ``on_check`` is called with the
    step state whenever the loop checks for stopped rows (progress; it may raise to stop).
    """
    device = ids.device
    batch, width = ids.shape
    cache = DecodeCache(model, batch, width + max_new_tokens, kernel, device)
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    keep = torch.zeros(batch, 1, 1, width + max_new_tokens, dtype=torch.bool, device=device)
    keep[:, 0, 0, :width] = valid
    state = StepState(
        token=torch.zeros(batch, 1, dtype=torch.long, device=device),
        positions=positions[:, -1:] + 1,
        keep=keep,
        out=torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device),
        column=torch.zeros(1, dtype=torch.long, device=device),
        done=torch.zeros(batch, dtype=torch.bool, device=device),
        stops=torch.tensor(stop_ids or [-1], dtype=torch.long, device=device),
        pad_id=pad_id,
        sampler=sampler,
    )
    with torch.inference_mode():
        logits = model(
            input_ids=ids,
            attention_mask=prompt_mask(valid),
            position_ids=positions,
            use_cache=False,
            logits_to_keep=1,
            decode_cache=cache,
        ).logits[:, -1]
        _record(state, logits)
        cache.position.fill_(width)
        _decode_steps(
            model, cache, state, max_new_tokens - 1, graph and device.type == "cuda", on_check
        )
    return state.out


def _decode_steps(
    model: PreTrainedModel,
    cache: DecodeCache,
    state: StepState,
    steps: int,
    graph: bool,
    on_check: Callable[[StepState], None] | None = None,
) -> None:
    """Run ``steps`` decode steps (captured once and replayed when ``graph``), stopping
    early once every row has stopped; ``on_check`` sees the state at each check."""
    replayed = None
    if graph and steps > 1:
        generator = state.sampler.generator if state.sampler is not None else None
        replayed = captured(lambda: _step(model, cache, state), generator)
        steps -= 1
    for done in range(steps):
        if done % STOP_CHECK_EVERY == 0:
            if on_check is not None:
                on_check(state)
            if bool(state.done.all()):
                return
        if replayed is not None:
            replayed.replay()
        else:
            _step(model, cache, state)
