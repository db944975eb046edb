"""Tiled attention with the online softmax (attention/causal/tiled.py) against a float64 softmax.

The registered class is also checked by the shared tests (tests/test_implementations.py); here the
kernel itself: block sizes that do and do not divide the lengths, lower-right causal alignment,
masks with rows that may attend to nothing, gradients by recomputation, and O(T) memory.
"""

import math

import pytest
import torch

from attention.bench.metrics import profile_call
from attention.causal.tiled import TiledAttention, tiled_attention


def float64_attention(q, k, v, causal, mask=None):
    """Plain softmax attention in float64, with lower-right causal alignment; rows with no key give 0."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    Tq, Tk = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    allowed = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        allowed = torch.arange(Tq)[:, None] + (Tk - Tq) >= torch.arange(Tk)[None, :]
    if mask is not None:
        allowed = allowed & mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: all -inf -> NaN -> 0
    return weights @ v


def inputs(B, H, Tq, Tk, D, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=generator, requires_grad=True) for T in (Tq, Tk, Tk)]


@pytest.mark.parametrize("Tq,Tk,block_size", [(7, 7, 3), (12, 12, 4), (16, 16, 16), (5, 5, 64), (9, 9, 1),
                                             (4, 11, 3), (3, 20, 8)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_forward_and_gradients_match_float64(Tq, Tk, block_size, causal):
    q, k, v = inputs(2, 3, Tq, Tk, 8)
    grad_out = torch.randn(2, 3, Tq, 8)
    out = tiled_attention(q, k, v, block_size, causal=causal)
    (out * grad_out).sum().backward()
    q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v))
    expected = float64_attention(q64, k64, v64, causal)
    (expected * grad_out.to(torch.float64)).sum().backward()
    tolerance = dict(atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.double(), expected, **tolerance)
    for name, got, want in (("q", q.grad, q64.grad), ("k", k.grad, k64.grad), ("v", v.grad, v64.grad)):
        torch.testing.assert_close(got.double(), want, **tolerance, msg=lambda m: f"grad {name}: {m}")


def test_rows_that_may_attend_to_nothing_give_zeros_and_zero_gradients():
    q, k, v = inputs(1, 2, 6, 6, 4)
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[2] = False  # query 2 may attend to no key
    mask[:, 0] = False
    out = tiled_attention(q, k, v, 4, causal=True, mask=mask)  # query 0 sees only key 0, masked: nothing either
    assert torch.isfinite(out).all()
    assert out[:, :, [0, 2]].abs().max() == 0
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and q.grad[:, :, [0, 2]].abs().max() == 0
    torch.testing.assert_close(out.double(), float64_attention(q, k, v, True, mask), atol=2e-5, rtol=1e-4)


def test_bfloat16_keeps_float32_statistics():
    q, k, v = (t.detach().to(torch.bfloat16) for t in inputs(1, 2, 40, 40, 16))
    out = tiled_attention(q, k, v, 16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), float64_attention(q, k, v, True), atol=2e-2, rtol=2e-2)


def test_training_memory_grows_like_t_not_t_squared():
    """Forward plus backward at T = 2048: a (T, T) float32 score matrix per head would be 16 MiB; the tiles
    and the O(T) tensors stay far below it."""
    T, block_size = 2048, 64
    q, k, v = inputs(1, 1, T, T, 16)

    def call():
        tiled_attention(q, k, v, block_size).sum().backward()

    peak = profile_call(call, "cpu")["cpu_tensor_peak_bytes"]
    assert peak < T * T * 4 / 8, f"peak {peak} bytes"


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_bad_block_size_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="block_size"):
        TiledAttention(16, 16, 16, 0.0, 4, block_size=bad)
    q, k, v = inputs(1, 1, 4, 4, 4)
    with pytest.raises(ValueError, match="block_size"):
        tiled_attention(q, k, v, bad)


def test_bad_shapes_and_masks_are_clear_errors():
    q, k, v = inputs(1, 2, 4, 5, 4)
    with pytest.raises(ValueError, match="q must be"):
        tiled_attention(q, k[:, :, :, :3], v)
    with pytest.raises(TypeError, match="mask must be a boolean"):
        tiled_attention(q, k, v, 2, mask=torch.ones(4, 5))
