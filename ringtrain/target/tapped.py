"""A truncated target model whose tapped layers write straight into a packed buffer.

Forward hooks on the tapped decoder layers gather the rows of real tokens (``token_index``
into the flattened [B*L] batch) of each layer's OUTPUT into the columns
``out[:, k*H:(k+1)*H]`` of the caller's buffer, typically a ring slot's hidden view.

Padding: rows are right-padded and the target runs with a plain causal mask (no
attention mask). That is exact for every real token: with right padding a real token
at position t only sees positions <= t of its own row, all of them real, in causal
attention as in the causal convolution and recurrence of Gated DeltaNet layers; only the
ignored pad positions see padding. It also keeps attention on the fastest causal SDPA
kernels and the linear-attention kernels free of masking work.

Compiled layers (``compile_layers``): the decoder layers, or their safe parts, run
through torch.compile (see ``ringtrain.target.compiled``); the hooks stay eager.
``precompile`` compiles them at once on dummy batches (logged: it takes a while).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from torch import nn
from transformers import PretrainedConfig

from ringtrain.compile_caches import compiled_graph_count, expected_compile_time
from ringtrain.target.compiled import compile_decoder_layers, compiled_forward
from ringtrain.target.linear_attention import normalized_qkv, use_normalized_qk

log = logging.getLogger(__name__)


class TappedTarget:
    """A target truncated after its deepest tapped layer, with taps written by hooks.

    Attributes: ``module`` (the HF text model, layers 0..max(tap_layers), final norm
    replaced by identity unless the last layer is tapped, no LM head), ``config`` (the target's FULL
    HF text config), ``tap_layers``, ``num_layers`` (full layer count), ``hidden_size``,
    ``vocab_size``, ``device``, ``dtype``, ``linear_attention`` (the Gated DeltaNet implementation
    of a hybrid target: "fla" or "torch"; None for other targets), ``compiled_units`` (names of the
    compiled layers or layer parts under ``module.layers``; empty when the target runs eagerly).
    """

    def __init__(
        self,
        module: nn.Module,
        config: PretrainedConfig,
        tap_layers: list[int],
        device: torch.device,
        dtype: torch.dtype,
        linear_attention: str | None = None,
    ) -> None:
        self.module = module
        self.config = config
        self.linear_attention = linear_attention
        self.tap_layers = list(tap_layers)
        self.num_layers = int(config.num_hidden_layers)
        self.hidden_size = int(config.hidden_size)
        self.vocab_size = int(config.vocab_size)
        self.device = device
        self.dtype = dtype
        self._dest: torch.Tensor | None = None
        self._token_index: torch.Tensor | None = None
        self._staging = torch.empty(0, dtype=dtype, device=device)
        for k, layer in enumerate(self.tap_layers):
            # A tap of the last layer is HF's last hidden state: after the final norm.
            last = layer == self.num_layers - 1
            tapped = module.norm if last else module.layers[layer]
            tapped.register_forward_hook(self._tap_hook(k))
        self.compiled_units: list[str] = []

    @property
    def tap_width(self) -> int:
        """Columns of the packed output: K tapped layers of H each."""
        return len(self.tap_layers) * self.hidden_size

    def compile_layers(
        self, backend: str | Callable = "inductor", moe: bool = False, grouped_experts: bool = True
    ) -> None:
        """Compile the decoder layers (or their safe parts) with a torch.compile backend;
        ``moe`` (``target.compile_moe``): mixture-of-experts blocks too, where their experts
        allow it (``ringtrain.target.compiled.compile_units``); ``grouped_experts`` False
        keeps transformers' experts there (benchmarks compare the two).

        Where FLA runs the Gated DeltaNet layers, the preparation of their queries, keys and
        values compiles too (ringtrain.target.linear_attention.use_normalized_qk).
        Compilation happens on the next forward; `precompile()` does it at once, logged.
        Call once.
        """
        if self.compiled_units:
            raise RuntimeError("the target's layers are already compiled; compile them once")
        self.compiled_units = compile_decoder_layers(
            self.module.layers, backend, moe, grouped_experts
        )
        if self.linear_attention == "fla":
            use_normalized_qk(self.module, compiled_forward(normalized_qkv, backend))

    def precompile(self, length: int = 64) -> None:
        """Compile now, on two small dummy batches: the graphs for several rows and for
        one row (Dynamo specialises a size of 1). Without this the one-row graph would
        compile when the first one-row batch (a long document) arrives, mid-run."""
        if not self.compiled_units:
            return
        started, graphs = time.perf_counter(), compiled_graph_count()
        log.info(
            "compiling the target's decoder layers for multi-row and one-row batches "
            "(torch.compile, %d units of %d layers; units of one kind share their graphs): %s",
            len(self.compiled_units),
            len(self.module.layers),
            expected_compile_time(),
        )
        for rows in (2, 1):
            input_ids = torch.zeros((rows, length), dtype=torch.int64, device=self.device)
            out = torch.empty((rows * length, self.tap_width), dtype=self.dtype, device=self.device)
            self.forward_into(input_ids, torch.arange(rows * length, device=self.device), out)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        log.info(
            "target layers compiled in %.1f s: %d graphs",
            time.perf_counter() - started,
            compiled_graph_count() - graphs,
        )

    def forward_into(
        self, input_ids: torch.Tensor, token_index: torch.Tensor, out: torch.Tensor
    ) -> None:
        """Run the target on a right-padded batch; write the real rows' taps into ``out``.

        ``input_ids`` [B, L] (int32 or int64) and ``token_index`` [N] (int64 flat index of
        each real token in B*L, in packed order) live on the target's device; ``out`` is
        [N, K*H], on the target's device or in host memory. Work is enqueued on the
        current stream: on CUDA, record an event on it (or synchronize) before another
        stream or process reads ``out``. A host ``out`` receives one copy at the end
        (asynchronous when it is pinned or registered memory).
        """
        rows = token_index.shape[0]
        if out.dim() != 2 or out.shape[0] != rows or out.shape[1] != self.tap_width:
            raise ValueError(
                f"out has shape {tuple(out.shape)}, expected ({rows}, {self.tap_width}) = "
                f"(real tokens, {len(self.tap_layers)} taps x hidden {self.hidden_size})"
            )
        direct = out.device == self.device
        dest = out if direct else self._staging_rows(rows)
        self._dest, self._token_index = dest, token_index
        try:
            with torch.inference_mode():
                self.module(input_ids=input_ids, use_cache=False)
        finally:
            self._dest = self._token_index = None
        if not direct:
            out.copy_(dest, non_blocking=True)

    def _staging_rows(self, rows: int) -> torch.Tensor:
        """A device buffer of ``rows`` packed rows, grown (stream-ordered) when too small."""
        size = rows * self.tap_width
        if self._staging.numel() < size:
            self._staging = torch.empty(size, dtype=self.dtype, device=self.device)
        return self._staging[:size].view(rows, self.tap_width)

    def _tap_hook(self, k: int) -> Callable[[nn.Module, tuple, object], None]:
        hidden_size = self.hidden_size
        columns = slice(k * hidden_size, (k + 1) * hidden_size)

        def hook(_module: nn.Module, _args: tuple, output: object) -> None:
            if self._dest is None:
                return
            hidden = output[0] if isinstance(output, tuple) else output
            flat = hidden.reshape(-1, hidden_size)
            dest = self._dest[:, columns]
            if dest.dtype == flat.dtype:
                torch.index_select(flat, 0, self._token_index, out=dest)
            else:
                dest.copy_(flat.index_select(0, self._token_index))

        return hook
