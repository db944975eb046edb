"""FlashAttention-2 in Triton (`attention/kernels/triton_flash.py`), checked against the float64 reference.

On a CPU the kernels run in Triton's interpreter (the module sets `TRITON_INTERPRET=1` when CUDA is not available):
the forward and every gradient must match `attention.reference.reference_kernel` in float64 to about 1e-6 for
float32 inputs, causal and not, at lengths that are no multiple of a tile (64), T = 1, head sizes that are not powers
of two and grouped-query heads; shapes the kernel does not take are a `ValueError` or `TypeError` naming them.
"""

import pytest
import torch

triton = pytest.importorskip("triton", reason="Triton ships wheels for Linux x86-64 only: pip install -e '.[test]' there")

from attention.kernels.triton_flash import MAX_HEAD_DIM, flash_attention  # noqa: E402
from attention.reference import reference_kernel  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def checked(B, H, H_kv, T_q, T_k, D, causal, scale=None, dtype=torch.float32, atol=2e-6):
    """Forward and gradients of `flash_attention` against float64, on one draw of inputs and output gradient."""
    generator = torch.Generator().manual_seed(B * 1000 + T_q * 10 + D + causal)
    q = torch.randn(B, H, T_q, D, generator=generator)
    k, v = (torch.randn(B, H_kv, T_k, D, generator=generator) for _ in range(2))
    grad = torch.randn(B, H, T_q, D, generator=generator)
    inputs = [t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v)]
    out = flash_attention(*inputs, causal=causal, scale=scale)
    out.backward(grad.to(DEVICE, dtype))
    exact = [t.detach().cpu().double().requires_grad_() for t in inputs]
    mask = torch.ones(T_q, T_k, dtype=torch.bool).tril() if causal else None
    expected, _ = reference_kernel(*exact, mask, scale=scale)
    expected.backward(grad.double())
    for name, got, want in [("out", out, expected)] + [(f"d{n}", t.grad, e.grad) for n, t, e in zip("qkv", inputs, exact)]:
        assert got.shape == want.shape, name
        error = (got.detach().cpu().double() - want).abs().max().item()
        assert error <= atol * max(1.0, want.abs().max().item()), f"{name}: max error {error:.2e}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T", [1, 100, 129])
def test_forward_and_gradients_match_float64_at_lengths_no_tile_divides(causal, T):
    checked(2, 3, 3, T, T, 32, causal)


@pytest.mark.parametrize("D", [16, 48, 128])
def test_head_sizes_that_are_and_are_not_powers_of_two(D):
    checked(1, 2, 2, 70, 70, D, causal=True)


def test_grouped_query_heads_sum_their_groups_gradients():
    checked(2, 4, 2, 65, 65, 32, causal=True)
    checked(1, 4, 1, 33, 33, 16, causal=False)


def test_more_keys_than_queries_and_a_given_scale():
    checked(1, 2, 2, 20, 150, 32, causal=False, scale=0.3)


def test_bfloat16_inputs_give_bfloat16_outputs_near_float64():
    checked(1, 2, 2, 80, 80, 32, causal=True, dtype=torch.bfloat16, atol=3e-2)


def test_the_output_does_not_depend_on_the_inputs_layout():
    q, k, v = (torch.randn(1, 40, 2, 32, device=DEVICE).transpose(1, 2) for _ in range(3))  # (B, H, T, D) views
    torch.testing.assert_close(flash_attention(q, k, v, causal=True),
                               flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True))


@pytest.mark.parametrize("shapes, kwargs, error, match", [
    (((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 9, 16)), {}, ValueError, r"k, v both \(B, H_kv, T_k, D\).*v.shape=\(1, 2, 9, 16\)"),
    (((2, 3, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16)), {}, ValueError, "heads must divide q's"),
    (((1, 2, 8, MAX_HEAD_DIM + 1),) * 3, {}, ValueError, "D must be 1 to 128"),
    (((1, 2, 8, 16), (1, 2, 12, 16), (1, 2, 12, 16)), {"causal": True}, ValueError, "causal=True needs as many queries"),
    (((1, 2, 8),) * 3, {}, ValueError, r"q must be \(B, H, T_q, D\)"),
])
def test_shapes_it_does_not_take_are_errors_naming_them(shapes, kwargs, error, match):
    with pytest.raises(error, match=match):
        flash_attention(*(torch.randn(shape) for shape in shapes), **kwargs)


def test_dtypes_and_types_it_does_not_take_are_type_errors():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(TypeError, match="share one of float32, bfloat16, float16"):
        flash_attention(q, q.double(), q)
    with pytest.raises(TypeError, match="must be tensors"):
        flash_attention(q, q.tolist(), q)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_on_a_gpu_prompts_of_thousands_match_float64_in_both_dtypes(causal, D):
    """The compiled kernel (not the interpreter) at the GPU profile's head sizes, past many tiles and off their edges."""
    checked(1, 2, 2, 2049, 2049, D, causal)
    checked(1, 4, 2, 1000, 1000, D, causal, dtype=torch.bfloat16, atol=3e-2)
