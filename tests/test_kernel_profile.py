"""The benchmarks' kernel comparison: Inductor's kernel numbers do not split one kernel in
two, and what the second profile runs beyond the first comes first."""

from __future__ import annotations

from tools.bench.kernel_profile import kernel_diff


def _row(kernel: str, ms: float, calls: float) -> dict:
    return {"kernel": kernel, "ms_per_step": ms, "calls_per_step": calls, "share": 0.0}


def test_the_diff_groups_numbered_kernels_and_ranks_the_extra_time() -> None:
    base = [
        _row("triton_poi_fused_mul_silu_12", 0.8, 4),
        _row("flex_attention_backward_6", 6.0, 4),
        _row("triton_per_fused_norm_3", 0.5, 9),
        _row("all kernels", 7.3, 17),
        _row("other", 0.0, 0),
    ]
    other = [
        _row("triton_poi_fused_mul_silu_14", 0.8, 4),
        _row("flex_attention_backward_15", 6.1, 4),
        _row("row_topk_kernel", 1.8, 30),
        _row("triton_per_fused_norm_12", 0.3, 7),
        _row("triton_per_fused_norm_2", 0.1, 1),
        _row("all kernels", 9.1, 46),
        _row("other", 0.0, 0),
    ]
    diff = {row["kernel"]: row for row in kernel_diff(base, other)}
    assert set(diff) == {
        "triton_poi_fused_mul_silu", "flex_attention_backward", "row_topk_kernel",
        "triton_per_fused_norm",
    }  # fmt: skip
    assert diff["triton_poi_fused_mul_silu"]["extra_ms"] == 0.0
    assert diff["triton_per_fused_norm"]["other_calls"] == 8
    assert diff["triton_per_fused_norm"]["extra_ms"] == -0.1
    assert [row["kernel"] for row in kernel_diff(base, other)][:2] == [
        "row_topk_kernel", "flex_attention_backward",
    ]  # fmt: skip
