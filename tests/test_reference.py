"""The float64 kernel every reference in the project runs on, against independent formulas."""

import math

import pytest
import torch

from attention.reference import reference_attention, reference_kernel


def qkv(heads=4, kv_heads=4, tq=5, tk=7, dk=6, dv=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, tq, dk, generator=generator, dtype=torch.float64)
    k = torch.randn(2, kv_heads, tk, dk, generator=generator, dtype=torch.float64)
    v = torch.randn(2, kv_heads, tk, dv, generator=generator, dtype=torch.float64)
    return q, k, v


def test_plain_softmax_attention_with_values_of_another_width():
    q, k, v = qkv()
    out, weights = reference_kernel(q, k, v)
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(6), dim=-1)
    torch.testing.assert_close(weights, expected, rtol=0, atol=1e-14)
    torch.testing.assert_close(out, expected @ v, rtol=0, atol=1e-13)
    assert out.shape == (2, 4, 5, 3)


def test_grouped_kv_heads_read_by_consecutive_query_heads():
    q, k, v = qkv(heads=6, kv_heads=2)
    out, _ = reference_kernel(q, k, v, scale=0.3)
    for h in range(6):
        weights = torch.softmax(q[:, h] @ k[:, h // 3].transpose(-1, -2) * 0.3, dim=-1)
        torch.testing.assert_close(out[:, h], weights @ v[:, h // 3], rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="dividing q's"):
        reference_kernel(*qkv(heads=6, kv_heads=4))


def test_softcap_then_bias_then_mask():
    q, k, v = qkv()
    bias = torch.randn(4, 5, 7, dtype=torch.float64)
    mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True
    out, weights = reference_kernel(q * 10, k, v, mask=mask, bias=bias, softcap=2.0)
    scores = 2.0 * torch.tanh(q * 10 @ k.transpose(-1, -2) / math.sqrt(6) / 2.0) + bias
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(weights, expected, rtol=0, atol=1e-14)
    assert (weights[..., ~mask] == 0).all()


def test_sinks_take_their_share_of_each_row_as_a_concatenated_logit_would():
    q, k, v = qkv()
    sinks = torch.tensor([-1.0, 0.0, 2.0, 30.0], dtype=torch.float64)
    out, weights = reference_kernel(q, k, v, sinks=sinks)
    scores = q @ k.transpose(-1, -2) / math.sqrt(6)  # (2, 4, 5, 7)
    combined = torch.cat([scores, sinks.view(1, 4, 1, 1).expand(2, 4, 5, 1)], dim=-1)
    expected = torch.softmax(combined, dim=-1)[..., :-1]  # transformers' gpt-oss eager path
    torch.testing.assert_close(weights, expected, rtol=0, atol=1e-14)
    torch.testing.assert_close(out, expected @ v, rtol=0, atol=1e-13)
    row_sums = weights.sum(-1)
    assert (row_sums < 1).all() and (row_sums[:, 3] < 1e-8).all()  # a sink of 30 takes nearly everything


@pytest.mark.parametrize("sinks", [None, torch.zeros(4, dtype=torch.float64)])
def test_a_fully_masked_row_gives_zeros_not_nan(sinks):
    q, k, v = qkv()
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False
    out, weights = reference_kernel(q, k, v, mask=mask, sinks=sinks)
    assert torch.isfinite(out).all() and (out[:, :, 2] == 0).all() and (weights[:, :, 2] == 0).all()


def test_module_reference_accepts_grouped_query_weights():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(1, 5, 8, generator=generator, dtype=torch.float64)
    state = {"query.weight": torch.randn(8, 8, generator=generator), "key.weight": torch.randn(4, 8, generator=generator),
             "value.weight": torch.randn(4, 8, generator=generator), "out.weight": torch.randn(8, 8, generator=generator),
             "out.bias": torch.randn(8, generator=generator)}  # 4 query heads of 2, 2 K/V heads
    expanded = {**state, "key.weight": state["key.weight"].view(2, 2, 8).repeat_interleave(2, 0).reshape(8, 8),
                "value.weight": state["value.weight"].view(2, 2, 8).repeat_interleave(2, 0).reshape(8, 8)}
    grouped, _ = reference_attention(x, x, x, state, 4)
    multi_head, _ = reference_attention(x, x, x, expanded, 4)
    torch.testing.assert_close(grouped, multi_head, rtol=0, atol=1e-12)
