"""ringtrain's grouped experts: the same outputs as transformers' grouped_mm experts, the
top-k combine op against its definition, and where they take over (CUDA, plain layout)."""

from __future__ import annotations

import pytest
import torch
from transformers import CONFIG_MAPPING
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer

from ringtrain.target.compiled import compile_decoder_layers, takes_grouped_experts
from ringtrain.target.moe_experts import (
    GROUPED_EXPERTS,
    fits_grouped_experts,
    grouped_experts_forward,
)


def routed_layer(device: str = "cpu", top_k: int = 3) -> Qwen3MoeDecoderLayer:
    """A Qwen3-MoE decoder layer (8 experts) in bf16 with weights large enough to matter."""
    config = CONFIG_MAPPING["qwen3_moe"](
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=top_k,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        num_hidden_layers=1,
    )
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    layer = Qwen3MoeDecoderLayer(config, 0).to(device=device, dtype=torch.bfloat16)
    for parameter in layer.parameters():
        torch.nn.init.normal_(parameter, std=0.2)
    return layer


def routing(tokens: int, experts: int, top_k: int, device: str = "cpu"):
    """Random routes (distinct experts per token) and renormalised bf16 weights."""
    generator = torch.Generator().manual_seed(1)
    picks = torch.rand(tokens, experts, generator=generator).topk(top_k, dim=-1).indices
    weights = torch.rand(tokens, top_k, generator=generator).softmax(-1)
    return picks.to(device), weights.to(device=device, dtype=torch.bfloat16)


def test_grouped_experts_match_transformers_grouped_mm() -> None:
    experts = routed_layer().mlp.experts
    hidden = torch.randn(37, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    picks, weights = routing(37, 8, 3)
    reference = experts(hidden, picks, weights).float()
    ours = grouped_experts_forward(experts, hidden, picks, weights).float()
    assert ours.shape == (37, 64) and reference.abs().max() > 1
    # transformers rounds each weighted row to bf16 before the sum; ringtrain sums in
    # float32 and rounds once: equal to within bf16 rounding of the outputs.
    torch.testing.assert_close(ours, reference, atol=2e-2, rtol=1e-2)


def test_combine_is_the_weighted_sum_of_each_tokens_rows() -> None:
    tokens, top_k, hidden = 5, 3, 7
    rows = torch.randn(tokens * top_k, hidden, dtype=torch.float64)
    row_of_pick = torch.randperm(tokens * top_k)
    weights = torch.rand(tokens, top_k, dtype=torch.float64)
    combined = torch.ops.ringtrain.moe_combine(rows, row_of_pick, weights)
    for token in range(tokens):
        expected = sum(
            weights[token, pick] * rows[row_of_pick[token * top_k + pick]] for pick in range(top_k)
        )
        torch.testing.assert_close(combined[token], expected)


def test_experts_with_biases_do_not_fit() -> None:
    config = CONFIG_MAPPING["gpt_oss"](
        hidden_size=32,
        intermediate_size=16,
        num_local_experts=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_hidden_layers=1,
    )
    assert fits_grouped_experts(routed_layer().mlp.experts)
    assert not fits_grouped_experts(GptOssExperts(config))


def test_transformers_experts_stay_where_ringtrains_do_not_run() -> None:
    # On CPU (where the grouped GEMMs do not compile in every dtype) transformers' stay.
    layers = torch.nn.ModuleList([routed_layer()])
    experts = layers[0].mlp.experts
    assert not takes_grouped_experts(experts)
    compile_decoder_layers(layers, backend="eager", moe=True)
    assert experts.config._experts_implementation == "grouped_mm"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_routed_layer_takes_ringtrains_experts_and_matches_on_gpu() -> None:
    layers = torch.nn.ModuleList([routed_layer("cuda", top_k=8)])
    experts = layers[0].mlp.experts
    assert takes_grouped_experts(experts)
    hidden = torch.randn(300, 64, device="cuda", dtype=torch.bfloat16)
    picks, weights = routing(300, 8, 8, "cuda")
    with torch.no_grad():
        reference = experts(hidden, picks, weights).float()
        compile_decoder_layers(layers, moe=True)
        assert experts.config._experts_implementation == GROUPED_EXPERTS
        ours = experts(hidden, picks, weights).float()
        rows = torch.randn(2400, 2048, device="cuda", dtype=torch.bfloat16)
        row_of_pick = torch.randperm(2400, device="cuda")
        mix = torch.rand(300, 8, device="cuda").bfloat16()
        kernel = torch.ops.ringtrain.moe_combine(rows, row_of_pick, mix)
        on_cpu = torch.ops.ringtrain.moe_combine(rows.cpu(), row_of_pick.cpu(), mix.cpu())
    torch.testing.assert_close(ours, reference, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(kernel.cpu(), on_cpu)
