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


def test_rotary_rotate_half_and_interleaved_layouts_turn_each_pair_by_its_angle():
    from attention.reference import reference_rope, rope_frequencies

    x = torch.randn(1, 2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    inverse, factor = rope_frequencies(8, {"rope_theta": 10000.0})
    assert factor == 1.0
    torch.testing.assert_close(inverse, 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8), rtol=0, atol=0)
    angles = torch.arange(5, dtype=torch.float64)[:, None] * inverse[None, :]  # (T, 4)
    turn = torch.polar(torch.ones_like(angles), angles)
    half = torch.view_as_real(torch.complex(x[..., :4], x[..., 4:]) * turn)  # pair (i, i + 4) as one complex number
    torch.testing.assert_close(reference_rope(x, torch.arange(5), inverse), torch.cat([half[..., 0], half[..., 1]], -1),
                               rtol=0, atol=1e-14)
    interleaved = torch.view_as_real(torch.view_as_complex(x.reshape(1, 2, 5, 4, 2).contiguous()) * turn).flatten(-2)
    torch.testing.assert_close(reference_rope(x, torch.arange(5), inverse, interleaved=True), interleaved, rtol=0, atol=1e-14)
    partial = reference_rope(x, torch.arange(5), inverse[:2], attention_factor=2.0)  # 4 of 8 features rotate
    torch.testing.assert_close(partial[..., 4:], x[..., 4:], rtol=0, atol=0)
    assert not torch.allclose(partial[..., :4], x[..., :4])


def test_llama3_scaling_keeps_fast_pairs_divides_slow_ones_and_blends_between():
    from attention.reference import rope_frequencies

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    plain, _ = rope_frequencies(128, {"rope_theta": 500000.0})
    scaled, factor = rope_frequencies(128, {**scaling, "rope_theta": 500000.0})
    wavelength = 2 * math.pi / plain
    fast, slow = wavelength < 8192 / 4, wavelength > 8192 / 1
    assert fast.any() and slow.any() and (~fast & ~slow).any() and factor == 1.0
    torch.testing.assert_close(scaled[fast], plain[fast], rtol=0, atol=0)
    torch.testing.assert_close(scaled[slow], plain[slow] / 8, rtol=0, atol=0)
    between = ~fast & ~slow
    assert ((scaled[between] < plain[between]) & (scaled[between] > plain[between] / 8)).all()


def test_yarn_attention_factor_and_ramp():
    from attention.reference import rope_frequencies

    plain, _ = rope_frequencies(64, {"rope_theta": 150000.0})
    scaling = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "truncate": False}
    scaled, factor = rope_frequencies(64, {**scaling, "rope_theta": 150000.0})
    assert factor == pytest.approx(0.1 * math.log(32.0) + 1)
    torch.testing.assert_close(scaled[:3], plain[:3], rtol=0, atol=0)  # fast pairs turn 32+ times: kept
    torch.testing.assert_close(scaled[-3:], plain[-3:] / 32, rtol=1e-12, atol=0)  # slow pairs: interpolated
    _, ratio = rope_frequencies(64, {**scaling, "rope_theta": 10000.0, "factor": 40.0, "mscale": 0.707,
                                     "mscale_all_dim": 1.0})
    assert ratio == pytest.approx((0.1 * 0.707 * math.log(40) + 1) / (0.1 * math.log(40) + 1))
    with pytest.raises(ValueError, match="rope scaling type"):
        rope_frequencies(64, {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 2.0})


@pytest.mark.parametrize("model_type, parameters", [
    ("llama", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ("gpt_oss", {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}),
    ("deepseek_v3", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}),
    ("llama", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
])
def test_rope_frequencies_match_transformers(model_type, parameters):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from attention.reference import rope_frequencies

    config = transformers.AutoConfig.for_model(model_type, hidden_size=256, num_attention_heads=4, head_dim=64,
                                               qk_rope_head_dim=64, max_position_embeddings=131072,
                                               rope_parameters=parameters)
    theirs, their_factor = ROPE_INIT_FUNCTIONS[parameters["rope_type"]](config, "cpu")
    ours, our_factor = rope_frequencies(2 * theirs.shape[0], config.rope_parameters)
    torch.testing.assert_close(ours, theirs.to(torch.float64), rtol=1e-6, atol=0)  # theirs is float32
    assert our_factor == pytest.approx(their_factor, rel=1e-12)
