"""DFlash2 drafters: the checkpoint an engine loads, its computation, its proposals, training.

`EngineDFlash2` is written here from the engines' published structure (docs/dflash2.md),
not from ringtrain's modules: it reads config.json the way the engines do, loads
model.safetensors strictly (no missing, no unexpected tensor), and drafts one block.
"""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from ringtrain.checkpoint import ResumeRecord, load_checkpoint, save_checkpoint
from ringtrain.drafter import (
    FrozenHead,
    ObjectiveSums,
    build_drafter,
    build_optimizer,
    drafter_spec_from_target,
)
from ringtrain.drafter.arch.dflash.model import DFlashDrafter
from ringtrain.drafter.arch.dflash2.codebook import codebook_rows
from ringtrain.drafter.arch.dflash2.model import BlockConv, DFlash2Drafter
from ringtrain.drafter.arch.dflash2.selector import (
    SelectorSums,
    check_selector_weight,
    selector_loss_sum,
)
from ringtrain.drafter.config import DrafterConfig, OptimConfig
from tests.helpers.launcher import (
    RUN_TIMEOUT_S,
    eval_records,
    run_training,
    start_training,
    step_records,
)
from tests.helpers.tiny_drafter import TAPS, TARGET, make_cfg, make_setup, objective, train

pytestmark = pytest.mark.usefixtures("one_thread")

DFLASH2 = {"architecture": "dflash2", "selector_rank": 8, "selector_top_k": 4}


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [heads, N, D] rotated by the neox pairing of the two halves."""
    dim = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.double()[:, None] * inv[None, :]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), -1) * sin


class EngineConv(nn.Module):
    """`prepare` / `finish` of the engines' grouped dynamic convolution."""

    def __init__(self, hidden: int, taps: int, group: int, block: int) -> None:
        super().__init__()
        self.taps, self.group, self.block = taps, group, block
        self.base_kernel = nn.Parameter(torch.empty(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * (hidden // group), bias=False)

    def conv(self, x: torch.Tensor, delta: torch.Tensor, side: int) -> torch.Tensor:
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(self.taps):
                if t % self.block >= j:
                    coef = self.base_kernel[side, j] + delta[t, j].repeat_interleave(self.group)
                    out[t] += coef * x[t - j]
        return out

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        delta = self.kernel_projection(x).view(x.shape[0], 2, self.taps, -1)
        return self.conv(x, delta[:, 0], 0), delta[:, 1]

    def finish(self, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.conv(x, delta, 1)


class EngineLayer(nn.Module):
    def __init__(self, c: dict) -> None:
        super().__init__()
        hidden, heads, kv, dim = (c[k] for k in ("hidden_size", "num_attention_heads",
                                                "num_key_value_heads", "head_dim"))  # fmt: skip
        self.c = c
        self.self_attn = nn.Module()
        for name, rows in (("q_proj", heads * dim), ("k_proj", kv * dim), ("v_proj", kv * dim)):
            setattr(self.self_attn, name, nn.Linear(hidden, rows, bias=False))
        self.self_attn.o_proj = nn.Linear(heads * dim, hidden, bias=False)
        self.self_attn.q_norm = nn.Module()
        self.self_attn.q_norm.weight = nn.Parameter(torch.empty(dim))
        self.self_attn.k_norm = nn.Module()
        self.self_attn.k_norm.weight = nn.Parameter(torch.empty(dim))
        self.mlp = nn.Module()
        for name, shape in (("gate_proj", (hidden, c["intermediate_size"])),
                            ("up_proj", (hidden, c["intermediate_size"])),
                            ("down_proj", (c["intermediate_size"], hidden))):  # fmt: skip
            setattr(self.mlp, name, nn.Linear(*shape, bias=False))
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.empty(hidden))
        self.post_attention_layernorm = nn.Module()
        self.post_attention_layernorm.weight = nn.Parameter(torch.empty(hidden))
        d = c["dflash_config"]
        args = (hidden, d["conv_kernel_size"], d["conv_group_size"], d["block_size"])
        self.attention_conv = EngineConv(*args)
        self.mlp_conv = EngineConv(*args)

    def attend(self, x: torch.Tensor, ctx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Block queries; keys/values of [context ; block]; no mask (non-causal, full)."""
        a, c, eps = self.self_attn, self.c, self.c["rms_norm_eps"]
        heads, kv, dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        theta = c["rope_parameters"]["rope_theta"]
        keys_in = torch.cat((ctx, x))
        q = rms(a.q_proj(x).view(len(x), heads, dim), a.q_norm.weight, eps).transpose(0, 1)
        k = rms(a.k_proj(keys_in).view(len(keys_in), kv, dim), a.k_norm.weight, eps)
        v = a.v_proj(keys_in).view(len(keys_in), kv, dim).transpose(0, 1)
        q = rope(q, positions[len(ctx) :], theta)
        k = rope(k.transpose(0, 1), positions, theta)
        k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
        weights = torch.softmax(q @ k.transpose(1, 2) / dim**0.5, dim=-1)
        return a.o_proj((weights @ v).transpose(0, 1).reshape(len(x), -1))

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        eps = self.c["rms_norm_eps"]
        h, d = self.attention_conv.prepare(rms(x, self.input_layernorm.weight, eps))
        x = x + self.attention_conv.finish(self.attend(h, ctx, positions), d)
        h, d = self.mlp_conv.prepare(rms(x, self.post_attention_layernorm.weight, eps))
        m = self.mlp
        return x + self.mlp_conv.finish(m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h)), d)


class EngineDFlash2(nn.Module):
    """A DFlash2DraftModel as the engines lay it out, built from a config.json dict."""

    def __init__(self, c: dict) -> None:
        super().__init__()
        self.c = c
        d, hidden = c["dflash_config"], c["hidden_size"]
        self.layers = nn.ModuleList(EngineLayer(c) for _ in range(c["num_hidden_layers"]))
        self.fc = nn.Linear(len(d["target_layer_ids"]) * hidden, hidden, bias=False)
        self.hidden_norm = nn.Module()
        self.hidden_norm.weight = nn.Parameter(torch.empty(hidden))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.empty(hidden))
        self.candidate_selector = nn.Module()
        vocab, rank = c["vocab_size"], d["selector_rank"]
        self.candidate_selector.predecessor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.candidate_selector.successor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.candidate_selector.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def hidden(self, taps: torch.Tensor, embeds: torch.Tensor, start: int) -> torch.Tensor:
        eps = self.c["rms_norm_eps"]
        ctx = rms(self.fc(taps), self.hidden_norm.weight, eps)
        positions = torch.arange(start + len(embeds))
        x = embeds
        for layer in self.layers:
            x = layer(x, ctx, positions)
        return rms(x, self.norm.weight, eps)

    def walk(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: int) -> list[int]:
        """The lattice of every candidate pair, then the greedy walk over it (as vLLM)."""
        s, k = self.candidate_selector, self.c["dflash_config"]["selector_top_k"]
        unary, ids = logits.topk(k, dim=-1)
        before = torch.cat((torch.full((1, k), anchor), ids[:-1]))
        gate = s.predecessor_codebook[before] * s.hidden_projection(hidden)[:, None]
        lattice = unary[:, None, :] + torch.einsum("lpr,lcr->lpc", gate, s.successor_codebook[ids])
        path, row = [], 0
        for slot in range(len(ids)):
            row = int(lattice[slot, row].argmax())
            path.append(int(ids[slot, row]))
        return path


def _randomise(model: nn.Module, seed: int) -> None:
    """Every parameter random (so no initial identity hides a wrong wiring)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.3)
            if param.dim() == 1:
                param.add_(1.0)


def _write_checkpoint(tmp_path: Path, model: nn.Module) -> Path:
    optimizer, scheduler = build_optimizer(model, OptimConfig(), 10)
    return save_checkpoint(
        tmp_path, 3, model, model.spec, optimizer, scheduler, ResumeRecord(step=3)
    )


def test_checkpoint_loads_into_the_engine_layout_and_drafts_the_same(tmp_path: Path) -> None:
    cfg = make_cfg(sliding_windows=[0, 0], **DFLASH2)
    model = build_drafter(drafter_spec_from_target(TARGET, cfg, TAPS)).double()
    assert isinstance(model, DFlash2Drafter)
    _randomise(model, 1)
    path = _write_checkpoint(tmp_path, model)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    dflash = config["dflash_config"]
    assert {k: dflash[k] for k in ("conv_kernel_size", "conv_group_size")} == {
        "conv_kernel_size": 2,
        "conv_group_size": 16,
    }
    assert (dflash["selector_rank"], dflash["selector_top_k"], dflash["block_size"]) == (8, 4, 8)

    engine = EngineDFlash2(config).double()
    weights = load_file(str(path / "model.safetensors"))
    result = engine.load_state_dict({k: v.double() for k, v in weights.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys

    gen = torch.Generator().manual_seed(5)
    head = FrozenHead(*torch.randn(2, 64, 32, generator=gen, dtype=torch.float64))
    taps = torch.randn(11, 96, generator=gen, dtype=torch.float64)
    block = torch.tensor([9] + [model.spec.mask_token_id] * 7)
    ours = model.draft_logits(head, taps, torch.arange(11), block, 11 + torch.arange(8))
    with torch.no_grad():
        hidden = engine.hidden(taps, head.embed[block], 11)
        theirs = hidden @ head.lm_head.t()
        path = engine.walk(hidden[1:], theirs[1:], 9)
    # fp64 everywhere except the RoPE tables, which ringtrain (as the engines) builds in fp32.
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    proposed = model.propose(head, taps, torch.arange(11), block, 11 + torch.arange(8))
    assert proposed.tolist() == path
    assert proposed.tolist() != theirs[1:].argmax(-1).tolist(), "the selector changed nothing"


def test_checkpoint_round_trips_as_dflash2(tmp_path: Path) -> None:
    model = build_drafter(drafter_spec_from_target(TARGET, make_cfg(**DFLASH2), TAPS))
    loaded = load_checkpoint(_write_checkpoint(tmp_path, model), "cpu")
    assert isinstance(loaded.model, DFlash2Drafter)
    assert loaded.spec == model.spec


def test_a_fresh_dflash2_drafter_computes_what_dflash_computes() -> None:
    spec2 = drafter_spec_from_target(TARGET, make_cfg(**DFLASH2), TAPS)
    spec1 = drafter_spec_from_target(TARGET, make_cfg(), TAPS)
    torch.manual_seed(0)
    dflash2 = build_drafter(spec2).double()
    dflash = DFlashDrafter(spec1).double()
    shared = {k: v for k, v in dflash2.state_dict().items() if k in dflash.state_dict()}
    dflash.load_state_dict(shared)
    gen = torch.Generator().manual_seed(2)
    head = FrozenHead(*torch.randn(2, 64, 32, generator=gen, dtype=torch.float64))
    taps = torch.randn(30, 96, generator=gen, dtype=torch.float64)
    args = (head, taps, torch.arange(30), torch.tensor([4] + [63] * 7), 30 + torch.arange(8))
    torch.testing.assert_close(dflash2.draft_logits(*args), dflash.draft_logits(*args))
    assert dflash2.propose(*args).tolist() == dflash.propose(*args).tolist()


def test_block_convolution_equals_the_engines_over_several_blocks() -> None:
    """A random BlockConv of three taps over three blocks of four, channel groups of 8,
    both sides (the after side with the corrections the before side made from its own
    input) and under no_grad: each equals the engines' convolution, whose taps stop at the
    block's start; so do the gradients, the convolution's output formed again in backward."""
    cfg = make_cfg(**DFLASH2, block_size=4, conv_kernel_size=3, conv_group_size=8)
    conv = BlockConv(drafter_spec_from_target(TARGET, cfg, TAPS)).double()
    _randomise(conv, 3)
    engine = EngineConv(TARGET["hidden_size"], 3, 8, 4).double()
    engine.load_state_dict(conv.state_dict())
    gen = torch.Generator().manual_seed(4)
    x, y, w_before, w_after = (
        torch.randn(12, TARGET["hidden_size"], generator=gen, dtype=torch.float64) for _ in range(4)
    )
    x.requires_grad_(True)
    y.requires_grad_(True)
    before, delta = conv.before(x)
    after = conv.after(y, delta)
    engine_before, engine_delta = engine.prepare(x)
    engine_after = engine.finish(y, engine_delta)
    torch.testing.assert_close(before, engine_before, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(after, engine_after, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(conv.before(x)[0], engine_before, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(
        (before * w_before).sum() + (after * w_after).sum(), [x, y, *conv.parameters()]
    )
    expected = torch.autograd.grad(
        (engine_before * w_before).sum() + (engine_after * w_after).sum(),
        [x, y, *engine.parameters()],
    )
    for grad, expected_grad in zip(grads, expected, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


def test_codebook_rows_gradient_sums_every_lookup_of_each_token() -> None:
    """Forward, the looked-up rows; backward, each token's row gets the sum of the
    gradients of all its lookups (token 0 and the last token among them), a token not
    looked up gets zero."""
    gen = torch.Generator().manual_seed(6)
    codebook = torch.randn(6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([[0, 5, 0], [2, 5, 5]])
    grad = torch.randn(2, 3, 3, generator=gen, dtype=torch.float64)
    rows = codebook_rows(indices, codebook)
    assert torch.equal(rows, codebook.detach()[indices])
    (codebook_grad,) = torch.autograd.grad(rows, codebook, grad)
    expected = torch.zeros(6, 3, dtype=torch.float64)
    for i, row in enumerate(indices.tolist()):
        for j, token in enumerate(row):
            expected[token] += grad[i, j]
    torch.testing.assert_close(codebook_grad, expected, rtol=1e-12, atol=1e-12)


def test_bad_dflash2_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="conv_group_size=12 must divide"):
        drafter_spec_from_target(TARGET, make_cfg(conv_group_size=12, **DFLASH2), TAPS)
    with pytest.raises(ValueError, match="selector_top_k=65 exceeds"):
        drafter_spec_from_target(TARGET, make_cfg(**{**DFLASH2, "selector_top_k": 65}), TAPS)


def test_dflash2_trains_its_convolutions_and_selector() -> None:
    cfg, _, head, batch = make_setup(0, **DFLASH2)
    torch.manual_seed(0)
    model = build_drafter(drafter_spec_from_target(TARGET, cfg, TAPS)).double()
    successor = model.candidate_selector.successor_codebook.detach().clone()
    projection = model.layers[0].attention_conv.kernel_projection.weight.detach().clone()
    losses = train(model, head, batch, cfg, range(30))
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])
    assert not torch.equal(model.candidate_selector.successor_codebook, successor)
    assert not torch.equal(model.layers[0].attention_conv.kernel_projection.weight, projection)


def test_the_selector_loss_is_reported_apart_and_is_part_of_the_loss() -> None:
    cfg, dflash, head, batch = make_setup(0)
    dflash2 = build_drafter(drafter_spec_from_target(TARGET, make_cfg(**DFLASH2), TAPS)).double()
    dflash2.load_state_dict(dflash.state_dict(), strict=False)  # a fresh DFlash2 is DFlash
    plain = objective(dflash, head, batch, cfg, seed=3)
    with_selector = objective(dflash2, head, batch, make_cfg(**DFLASH2), seed=3)
    assert type(plain) is ObjectiveSums and type(with_selector) is SelectorSums
    assert "selector_loss" not in ObjectiveSums.summarise(plain.as_vector(), cfg.block_size)
    assert float(with_selector.selector_loss_sum) > 0.0
    torch.testing.assert_close(
        with_selector.loss_sum, plain.loss_sum + with_selector.selector_loss_sum
    )
    metrics = SelectorSums.summarise(with_selector.as_vector(), cfg.block_size)
    assert metrics["selector_loss"] == pytest.approx(
        float(with_selector.selector_loss_sum / with_selector.weight_sum)
    )
    assert SelectorSums.step_metrics(metrics)["loss_parts"] == {
        "selector_loss": metrics["selector_loss"]
    }
    # drafter.selector_loss_weight scales the selector's part, and only it.
    weighted = objective(dflash2, head, batch, make_cfg(**DFLASH2, selector_loss_weight=0.25), 3)
    torch.testing.assert_close(weighted.selector_loss_sum, 0.25 * with_selector.selector_loss_sum)
    torch.testing.assert_close(weighted.loss_sum, plain.loss_sum + weighted.selector_loss_sum)


def test_the_selector_weight_is_bounded_by_a_batch_of_uniform_choices() -> None:
    """The largest weight keeps a batch of scored slots, each at ln(top_k), finite in
    float32: a weight just under that bound is taken, one just over it refused."""
    slots, top_k = 1000, 16
    bound = torch.finfo(torch.float32).max / (slots * math.log(top_k))

    def cfg(weight: float) -> DrafterConfig:
        return make_cfg(**{**DFLASH2, "selector_top_k": top_k, "selector_loss_weight": weight})

    check_selector_weight(cfg(0.99 * bound), slots)
    with pytest.raises(ValueError, match="selector_loss_weight"):
        check_selector_weight(cfg(1.01 * bound), slots)


def test_selector_loss_and_gradients_equal_the_definition_over_full_logits() -> None:
    """The selector's loss takes its unary scores as the head's loss hands them over and
    their gradient through the candidates' LM-head rows only; loss, hits and every
    gradient equal the definition over vocabulary-wide logits (the candidates' logits
    taken from them, with their gradient)."""
    torch.manual_seed(0)
    cfg, _, head, _ = make_setup(0, **{**DFLASH2, "selector_top_k": 6})
    selector = build_drafter(drafter_spec_from_target(TARGET, cfg, TAPS)).candidate_selector
    selector = selector.double()
    nn.init.normal_(selector.successor_codebook, std=0.05)
    anchors, block, hidden = 5, 4, head.lm_head.shape[1]
    lm_head = head.lm_head.double()
    rows = torch.randn(anchors * (block - 1), hidden, dtype=torch.float64, requires_grad=True)
    # Labels: each slot's best logit (hits the walk takes), its second (hits it may miss)
    # or a random token (misses the top-k).
    logits = (rows @ lm_head.t()).detach()
    labels = torch.randint(0, lm_head.shape[0], (anchors, block))
    ranked = logits.topk(2, dim=-1).indices.view(anchors, block - 1, 2)
    draw = torch.rand(anchors, block - 1)
    labels[:, 1:] = torch.where(draw < 0.5, ranked[..., 0], labels[:, 1:])
    labels[:, 1:] = torch.where((draw >= 0.5) & (draw < 0.75), ranked[..., 1], labels[:, 1:])
    weights = torch.rand(anchors, block - 1, dtype=torch.float64)

    def definition() -> tuple[torch.Tensor, torch.Tensor]:
        unary, candidates = (rows @ lm_head.t()).topk(selector.top_k, dim=-1)
        targets = labels[:, 1:].reshape(-1)
        scores = selector.scores(rows, unary, candidates, labels[:, :-1].reshape(-1))
        hits = candidates == targets[:, None]
        loss = F.cross_entropy(scores, hits.long().argmax(-1), reduction="none")
        picked = candidates.gather(-1, scores.detach().argmax(-1, keepdim=True)).squeeze(-1)
        return (loss * weights.reshape(-1) * hits.any(-1)).sum(), picked == targets

    parameters = [rows, *selector.parameters()]
    expected, expected_hits = definition()
    expected_grads = torch.autograd.grad(expected, parameters)
    candidate_logits, candidates = logits.topk(selector.top_k, dim=-1)
    total, hits = selector_loss_sum(
        selector, rows, lm_head, labels, weights, candidates, candidate_logits, chunk=4
    )
    grads = torch.autograd.grad(total, parameters)
    assert expected > 0 and 0 < int(expected_hits.sum()) < len(expected_hits)
    torch.testing.assert_close(total, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(hits, expected_hits)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


# What 40 steps of the defaults must add to the held-out tau_sim of an untrained drafter
# (measured: 5.07 against 1.00).
LEARNED_TAU_SIM = 1.0


@pytest.mark.slow
def test_dflash2_learns_on_the_embedded_default(tmp_path: Path) -> None:
    """DFlash2 with the other defaults (D-PACE, Muon, WSD) learns: its held-out tau_sim
    after 40 steps is clearly above that of the drafter the run starts from (measured by
    a run of one step at a learning rate too small to change any weight); it writes a
    DFlash2 checkpoint."""
    run_dir, untrained_dir = tmp_path / "run", tmp_path / "untrained"
    overrides = ['drafter.architecture="dflash2"', "run.max_steps=40", "run.eval_every=40",
                 "run.checkpoint_every=40", "run.name=d2"]  # fmt: skip
    unchanged = ["run.max_steps=1", "run.eval_every=1", "run.checkpoint_every=0", "optim.lr=1e-30"]
    # The two runs are independent: the untrained one runs beside the trained one.
    untrained_run = start_training(
        untrained_dir, 1, 1, [*overrides[:1], *unchanged, "run.name=d2u"]
    )
    try:
        proc = run_training(run_dir, 1, 1, overrides)
        untrained_output = untrained_run.communicate(timeout=RUN_TIMEOUT_S)[0]
    finally:
        if untrained_run.poll() is None:
            os.killpg(untrained_run.pid, signal.SIGKILL)
            untrained_run.wait()
    assert untrained_run.returncode == 0, untrained_output[-4000:]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    records = step_records(run_dir)
    losses = [r["loss"] for r in records]
    assert len(losses) == 40
    # Every step record reports the selector's part of the loss beside it.
    assert all(0.0 < r["selector_loss"] < r["loss"] for r in records)
    # The loss holds the selector's CE too (5-step means).
    assert sum(losses[-5:]) < 0.95 * sum(losses[:5])
    config = json.loads(next((run_dir / "checkpoints").glob("step_*/config.json")).read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    trained, untrained = eval_records(run_dir)[-1], eval_records(untrained_dir)[-1]
    assert trained["tau_sim"] > untrained["tau_sim"] + LEARNED_TAU_SIM, (trained, untrained)


def _saved_for_backward(layer: nn.Module, length: int) -> int:
    """Bytes a decoder layer's forward keeps for backward (its weights and inputs aside)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(length, TARGET["hidden_size"], generator=gen, requires_grad=True)
    ctx = torch.randn(24, TARGET["hidden_size"], generator=gen)
    cos, sin = torch.randn(2, 24 + length, TARGET["head_dim"], generator=gen)
    kept = {p.untyped_storage().data_ptr() for p in (*layer.parameters(), x, ctx, cos, sin)}
    saved: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in kept:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        layer(x, ctx, cos, sin, attend)
    return sum(saved.values())


def test_dflash2_layers_keep_little_more_than_dflash_layers_for_backward() -> None:
    """The in-block convolutions' work is formed again in backward: beyond a DFlash
    layer's activations a DFlash2 layer keeps three of its four convolutions' inputs and
    their corrections, 3.5 [L, H] tensors (16 when the convolutions' intermediates stayed;
    4.5 when the attention's output after o_proj was kept for its convolution too)."""
    length = 64
    layers = [
        build_drafter(drafter_spec_from_target(TARGET, cfg, TAPS)).layers[0]
        for cfg in (make_cfg(), make_cfg(**DFLASH2))
    ]
    dflash, dflash2 = (_saved_for_backward(layer, length) for layer in layers)
    hidden_tensor = length * TARGET["hidden_size"] * 4
    assert dflash2 - dflash <= 4 * hidden_tensor, (dflash2 - dflash) / hidden_tensor
