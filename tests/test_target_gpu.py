"""Target side on CUDA: bf16 taps match the float32 CPU run; host and device outputs agree;
compiled layers match eager ones without recompiling on new shapes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from ringtrain.target.loader import load_target
from ringtrain.target.runner import TargetRunner
from ringtrain.target.tiny import build_tiny_target

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class Padded:
    """Right-padded rows of random documents."""

    def __init__(self, lengths: tuple[int, ...], width: int, vocab_size: int) -> None:
        rng = np.random.default_rng(0)
        self.input_ids = np.zeros((len(lengths), width), dtype=np.int64)
        self.attention_mask = np.zeros((len(lengths), width), dtype=np.int64)
        for row, n in enumerate(lengths):
            self.input_ids[row, :n] = rng.integers(0, vocab_size, size=n)
            self.attention_mask[row, :n] = 1


def taps(runner: TargetRunner, batch: Padded, out_device: str) -> torch.Tensor:
    rows = runner.prefetch(batch)
    width = len(runner.tap_layers) * runner.hidden_size
    out = torch.empty(rows, width, dtype=torch.bfloat16, device=out_device)
    if out.device.type == "cpu":
        out = out.pin_memory()
    runner.forward_into(out)
    torch.cuda.synchronize()
    return out.float().cpu()


@pytest.mark.parametrize("hybrid", [True, False])
def test_cuda_bf16_matches_cpu_and_host_out(tmp_path: Path, hybrid: bool) -> None:
    path = build_tiny_target(tmp_path, seed=4, hybrid=hybrid)
    batch = Padded((200, 77, 256, 5), width=256, vocab_size=512)
    # With flash-linear-attention installed a hybrid target refuses the CPU (Triton has no
    # CPU driver), so the float32 reference then runs on the GPU.
    on_cpu = not hybrid or importlib.util.find_spec("fla") is None
    reference_device = "cpu" if on_cpu else "cuda"
    reference_target = load_target(path, num_taps=3, device=reference_device, dtype="float32")
    reference = taps(TargetRunner(reference_target), batch, reference_device)
    runner = TargetRunner(load_target(path, num_taps=3, device="cuda"))
    on_device = taps(runner, batch, "cuda")
    on_host = taps(runner, batch, "cpu")
    torch.testing.assert_close(on_host, on_device, atol=0, rtol=0)
    scale = reference.abs().max().item()
    torch.testing.assert_close(on_device, reference, atol=0.03 * scale, rtol=0.03)


@pytest.mark.parametrize("hybrid", [True, False])
def test_cuda_compiled_layers_match_eager(tmp_path: Path, hybrid: bool) -> None:
    path = build_tiny_target(tmp_path, seed=5, hybrid=hybrid)
    torch._dynamo.reset()
    batches = [
        Padded(lengths, width, vocab_size=512)
        for lengths, width in [
            ((200, 77, 256, 5), 256),
            ((100, 31), 128),
            ((300,), 300),
            ((150, 20, 90), 160),
        ]
    ]
    # The eager taps come first: compiling a hybrid target also switches, process-wide, how
    # its Gated DeltaNet layers prepare queries and keys (compiled, not FLA's own kernels).
    eager = TargetRunner(load_target(path, num_taps=3, device="cuda", compile="off"))
    references = [taps(eager, batch, "cuda") for batch in batches]
    compiled_target = load_target(path, num_taps=3, device="cuda")
    assert compiled_target.compiled_units, "target.compile 'auto' compiles on CUDA"
    compiled = TargetRunner(compiled_target)

    def assert_matches(index: int) -> None:
        reference = references[index]
        scale = reference.abs().max().item()
        on_compiled = taps(compiled, batches[index], "cuda")
        torch.testing.assert_close(on_compiled, reference, atol=0.03 * scale, rtol=0.03)

    for index in range(3):
        assert_matches(index)
    graphs = counters["stats"]["unique_graphs"]
    assert_matches(3)
    assert counters["stats"]["unique_graphs"] == graphs, "a new shape recompiled the layers"
