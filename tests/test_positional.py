"""Position encodings: closed forms, invariances, the paper's ALiBi slopes, and the ALiBi/RoPE modules against the reference."""

import copy
import math

import pytest
import torch

import attention.general
from attention.causal.alibi import ALiBiAttention
from attention.causal.alibi_flex import ALiBiFlexAttention
from attention.causal.rope import RoPEAttention
from attention.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    rotary_angles,
    rotary_cos_sin,
    sinusoidal_table,
)
from attention.reference import (
    reference_alibi_slopes,
    reference_attention,
    reference_causal_self_attention,
    reference_rope,
    rope_frequencies,
)
from attention.registry import IMPLEMENTATIONS

# ---------------------------------------------------------------- sinusoidal and learned


def test_sinusoidal_table_matches_closed_form():
    T, dim, base = 12, 6, 10000.0
    expected = torch.tensor(
        [[math.sin(t / base ** (f / dim)) if f % 2 == 0 else math.cos(t / base ** ((f - 1) / dim)) for f in range(dim)]
         for t in range(T)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(sinusoidal_table(T, dim, dtype=torch.float64), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(sinusoidal_table(T, dim), expected.float())


def test_sinusoidal_module_adds_the_table_for_any_length_and_offset():
    module = SinusoidalPositionalEncoding(dim=8)
    x = torch.randn(2, 300, 8)
    torch.testing.assert_close(module(x), x + sinusoidal_table(300, 8))
    torch.testing.assert_close(module(x[:, :5], offset=7), x[:, :5] + sinusoidal_table(12, 8)[7:])
    with pytest.raises(ValueError, match=r"dim must be even \(sine and cosine pairs\), got dim=7"):
        SinusoidalPositionalEncoding(dim=7)


def test_learned_embedding_adds_its_rows_and_raises_past_max_len():
    module = LearnedPositionalEmbedding(max_len=6, dim=4)
    x = torch.randn(2, 4, 4)
    torch.testing.assert_close(module(x), x + module.weight[:4])
    torch.testing.assert_close(module(x[:, :2], offset=4), x[:, :2] + module.weight[4:6])
    with pytest.raises(ValueError, match=r"offset \+ T = 0 \+ 7 = 7 .* max_len=6"):
        module(torch.randn(1, 7, 4))
    with pytest.raises(ValueError, match=r"offset \+ T = 3 \+ 4 = 7 .* max_len=6"):
        module(x, offset=3)


# ---------------------------------------------------------------- rotary


def test_rotary_preserves_norms_and_matches_the_reference_rotation():
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    rotated = RotaryEmbedding(head_dim=8)(x)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rotated, rotated_pairs(x), atol=1e-6, rtol=1e-6)  # angles in float32
    torch.testing.assert_close(rotary_angles(9, 8), torch.arange(9.0, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, 8, 2) / 8))


def test_rotary_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=16)
    q, k = torch.randn(1, 2, 6, 16, dtype=torch.float64), torch.randn(1, 2, 6, 16, dtype=torch.float64)
    scores = rope(q) @ rope(k).transpose(-2, -1)  # (1, 2, 6, 6): positions 0..5
    for shift in (1, 13, 100):
        shifted = rope(q, offset=shift) @ rope(k, offset=shift).transpose(-2, -1)  # positions shift..shift+5
        torch.testing.assert_close(shifted, scores, atol=1e-4, rtol=1e-4)  # angles in float32


def rotated_pairs(x, base=10000.0):
    """The reference's rotation of `x` `(B, H, T, D)` at positions 0 .. T-1, pairs `(i, i + D/2)`."""
    return reference_rope(x, torch.arange(x.shape[-2]), rope_frequencies(x.shape[-1], {"rope_theta": base})[0])


def rotate_interleaved(x, base=10000.0):
    """RoPE in the interleaved layout of RoFormer and Meta's Llama code: adjacent pairs `(x[2i], x[2i+1])`
    rotated as complex numbers. Test-side, float64."""
    T, D = x.shape[-2], x.shape[-1]
    angles = torch.arange(T, dtype=torch.float64)[:, None] * base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    pairs = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], D // 2, 2))  # (..., T, D/2)
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).reshape(x.shape)


def interleaved_to_rotate_half(weight, num_heads):
    """Hugging Face's Llama conversion `permute`: row `2i + j` of each head's block moves to `i + j * D/2`."""
    return weight.view(num_heads, weight.shape[0] // num_heads // 2, 2, -1).transpose(1, 2).reshape(weight.shape)


def test_rotate_half_equals_interleaved_up_to_a_reordering_of_features():
    # The claim of attention/positional/rotary.py: the two layouts differ by a fixed permutation.
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    order = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])  # interleaved feature 2i + j -> rotate-half feature i + j*D/2
    torch.testing.assert_close(rotated_pairs(x[..., order]), rotate_interleaved(x)[..., order])
    torch.testing.assert_close(RotaryEmbedding(head_dim=8)(x[..., order]), rotate_interleaved(x)[..., order],
                               atol=1e-6, rtol=1e-6)  # angles in float32


def test_rope_module_runs_interleaved_weights_after_the_row_permutation():
    torch.manual_seed(0)
    num_heads, d_model, T = 4, 16, 7
    state = RoPEAttention(d_model, d_model, 16, 0.0, num_heads, qkv_bias=True).canonical_state_dict()
    x = torch.randn(2, T, d_model)
    # The interleaved model, written out in float64 from the same weights.
    x64, w = x.double(), {name: tensor.double() for name, tensor in state.items()}

    def heads(name):  # (B, T, d_model) -> (B, H, T, D)
        return (x64 @ w[f"{name}.weight"].T + w[f"{name}.bias"]).view(2, T, num_heads, -1).transpose(1, 2)

    q, k, v = rotate_interleaved(heads("query")), rotate_interleaved(heads("key")), heads("value")
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    context = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(2, T, d_model)  # (B, T, H*D)
    expected = context @ w["out.weight"].T + w["out.bias"]

    converted = dict(state)
    for name in ("query.weight", "query.bias", "key.weight", "key.bias"):
        converted[name] = interleaved_to_rotate_half(state[name], num_heads)
    module = RoPEAttention(d_model, d_model, 16, 0.0, num_heads, qkv_bias=True).eval()
    module.load_canonical_state_dict(converted)
    with torch.no_grad():
        torch.testing.assert_close(module(x).double(), expected, atol=2e-5, rtol=1e-4)
        module.load_canonical_state_dict(state)  # without the permutation: a different model, no error
        assert (module(x).double() - expected).abs().max() > 1e-2


def test_rotary_cache_grows_instead_of_truncating():
    rope = RotaryEmbedding(head_dim=4)
    rope(torch.randn(1, 1, 3, 4))
    long = torch.randn(1, 1, 50, 4)
    cos, sin = rotary_cos_sin(50, 4, 10000.0, "cpu", torch.float32)
    assert torch.equal(rope(long), apply_rotary(long, cos, sin))
    assert torch.equal(rope(long, offset=5)[..., :3, :], apply_rotary(long[..., :3, :], *(t[5:8] for t in rotary_cos_sin(8, 4, 10000.0, "cpu", torch.float32))))
    assert torch.equal(rope(long), attention.general.apply_rotary(long, *attention.general.rotary_cos_sin(50, 4, 10000.0, "cpu", torch.float32)))
    with pytest.raises(ValueError, match="head_dim must be a positive even int, got head_dim=5"):
        RotaryEmbedding(head_dim=5)


def test_rotary_cache_is_rebuilt_for_another_dtype_and_device():
    """A bf16 call after a float32 one gets bf16 cosines and sines (computed in float32, then rounded), and a
    call on another device gets them there: the cache is keyed by dtype and device, not only by length."""
    rope = RotaryEmbedding(head_dim=8)
    x = torch.randn(1, 2, 6, 8)
    rope(x)  # caches float32 cosines and sines on the CPU for 6 positions
    half = x.to(torch.bfloat16)
    out = rope(half)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, apply_rotary(half, *rotary_cos_sin(6, 8, 10000.0, "cpu", torch.bfloat16)))
    # The "meta" device stands in for a GPU: shapes and devices without data, on any machine.
    elsewhere = rope(torch.empty(1, 2, 6, 8, device="meta"))
    assert elsewhere.device.type == "meta" and rope.cos_cached.device.type == "meta"
    assert rope(x).device.type == "cpu" and torch.equal(rope(x), apply_rotary(x, *rotary_cos_sin(6, 8, 10000.0, "cpu", torch.float32)))


def test_rotary_cache_built_under_inference_mode_still_trains():
    """Cosines and sines first cached under `torch.inference_mode` (an evaluation, a generation) are not inference
    tensors: a later training step saves them for the backward (an inference tensor would raise there), and the
    gradient equals the one through a fresh encoding."""
    rope = RotaryEmbedding(head_dim=8)
    with torch.inference_mode():
        rope(torch.randn(1, 2, 6, 8))
    assert not rope.cos_cached.is_inference() and not rope.sin_cached.is_inference()
    x = torch.randn(1, 2, 6, 8, requires_grad=True)
    (rope(x) ** 2).sum().backward()
    expected = x.detach().clone().requires_grad_(True)
    (RotaryEmbedding(head_dim=8)(expected) ** 2).sum().backward()
    assert torch.equal(x.grad, expected.grad)


# ---------------------------------------------------------------- what attention sees of the order


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_causal_outputs_from_t_on_ignore_the_order_of_earlier_tokens(name):
    """Causal attention at position s is a function of x_s and the set {x_0..x_s}: shuffling positions
    0..t-1 among themselves keeps every output from t on, unless a position encoding sees distances."""
    torch.manual_seed(0)
    B, T, d_model, num_heads, t = 2, 7, 16, 4, 4
    module = IMPLEMENTATIONS[name](d_model, d_model, 16, 0.0, num_heads).eval()
    x = torch.randn(B, T, d_model)
    prefix_shuffle = torch.tensor([2, 0, 3, 1, 4, 5, 6])  # positions 0..t-1 among themselves
    with torch.no_grad():
        out, shuffled = module(x), module(x[:, prefix_shuffle])
    if module.position_encoding is None:
        torch.testing.assert_close(shuffled[:, t:], out[:, t:], atol=2e-5, rtol=1e-4)
    else:
        assert (shuffled[:, t:] - out[:, t:]).abs().max() > 1e-3
    assert (shuffled[:, :t] - out[:, prefix_shuffle][:, :t]).abs().max() > 1e-3  # and no equivariance before t


def test_attention_without_a_mask_is_permutation_equivariant():
    torch.manual_seed(0)
    state = RoPEAttention(16, 16, 16, 0.0, 4).canonical_state_dict()
    x, shuffle = torch.randn(2, 7, 16, dtype=torch.float64), torch.randperm(7)
    out, _ = reference_attention(x, x, x, state, num_heads=4)
    shuffled, _ = reference_attention(x[:, shuffle], x[:, shuffle], x[:, shuffle], state, num_heads=4)
    torch.testing.assert_close(shuffled, out[:, shuffle])


# ---------------------------------------------------------------- ALiBi


def test_alibi_slopes_follow_the_paper():
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0 ** -k for k in range(1, 9)], dtype=torch.float64))
    # 6 heads: the 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then every other 8-head slope: 2^-1, 2^-3.
    assert torch.equal(alibi_slopes(6), torch.tensor([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8], dtype=torch.float64))
    # 12 heads: the 8-head slopes, then every other 16-head slope: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
    expected_12 = [2.0 ** -k for k in range(1, 9)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected_12, dtype=torch.float64), atol=0, rtol=1e-15)
    for num_heads in range(1, 33):
        torch.testing.assert_close(alibi_slopes(num_heads), torch.tensor(reference_alibi_slopes(num_heads), dtype=torch.float64),
                                   atol=0, rtol=1e-15)
    with pytest.raises(ValueError, match="num_heads must be a positive int, got num_heads=0"):
        alibi_slopes(0)


def test_alibi_bias_causal_and_symmetric_forms():
    bias = alibi_bias(2, 3, 4, dtype=torch.float64)  # (H, Tq, Tk), slopes 1/16 and 1/256
    inf = float("inf")
    expected_head0 = torch.tensor([[0, -inf, -inf, -inf], [-1 / 16, 0, -inf, -inf], [-2 / 16, -1 / 16, 0, -inf]], dtype=torch.float64)
    assert bias.shape == (2, 3, 4)
    assert torch.equal(bias[0], expected_head0)
    torch.testing.assert_close(bias[1], expected_head0 * 16 / 256)
    symmetric = alibi_bias(2, 3, 4, causal=False, dtype=torch.float64)
    assert torch.equal(symmetric[0], torch.tensor([[0, -1, -2, -3], [-1, 0, -1, -2], [-2, -1, 0, -1]], dtype=torch.float64) / 16)


# ---------------------------------------------------------------- modules against the float64 reference

# 6 heads: ALiBi slopes off the power-of-two rule. One FlexAttention case: each compiles for seconds on CPU.
MODULE_CASES = [(ALiBiAttention, 4, True), (ALiBiAttention, 6, False), (RoPEAttention, 4, True),
                (RoPEAttention, 6, False), (ALiBiFlexAttention, 4, True)]


@pytest.mark.parametrize("cls, num_heads, qkv_bias", MODULE_CASES,
                         ids=[f"{cls.__name__}-H{heads}-bias{bias}" for cls, heads, bias in MODULE_CASES])
def test_module_matches_float64_reference(cls, num_heads, qkv_bias):
    torch.manual_seed(0)
    d_in, d_out, T = 10, 4 * num_heads, 7
    source = cls(d_in, d_out, context_length=16, dropout=0.0, num_heads=num_heads, qkv_bias=qkv_bias)
    state = {name: torch.randn_like(tensor) * 0.5 for name, tensor in source.canonical_state_dict().items()}
    module = cls(d_in, d_out, context_length=16, dropout=0.0, num_heads=num_heads, qkv_bias=qkv_bias)
    module.load_canonical_state_dict(state)

    x = torch.randn(2, T, d_in, requires_grad=True)
    out = module(x)
    x64 = x.detach().double().requires_grad_()
    state64 = {name: tensor.double().requires_grad_() for name, tensor in state.items()}
    expected, _ = reference_causal_self_attention(x64, state64, num_heads, position_encoding=cls.position_encoding)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-4)

    grad_out = torch.randn_like(expected)
    out.backward(grad_out.float())
    expected.backward(grad_out)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=2e-5, rtol=1e-4)
    for name, parameter in module.named_parameters():
        torch.testing.assert_close(parameter.grad.double(), state64[name].grad, atol=2e-5, rtol=1e-4, msg=name)

    if cls is ALiBiFlexAttention:  # the no-grad path runs FlexAttention alone
        with torch.no_grad():
            torch.testing.assert_close(module(x).double(), expected, atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------- the ALiBi bias, built once and reused


def count_alibi_bias_calls(monkeypatch, module_path):
    """Count the calls a module file makes to its `alibi_bias` (each builds a whole `(H, T, T)` bias)."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return alibi_bias(*args, **kwargs)

    monkeypatch.setattr(module_path + ".alibi_bias", counted)
    return calls


def test_alibi_bias_is_built_once_per_length_dtype_and_device(monkeypatch):
    """Calls at one (T, device, dtype) reuse one bias; another length, dtype or device gets its own, equal to a fresh
    `alibi_bias`, and the output equals that of a module that never saw another shape."""
    builds = count_alibi_bias_calls(monkeypatch, "attention.causal.alibi")
    torch.manual_seed(0)
    module = ALiBiAttention(8, 8, 16, 0.0, 2).eval()
    fresh = copy.deepcopy(module)
    x5, x7 = torch.randn(2, 5, 8), torch.randn(2, 7, 8)
    with torch.no_grad():
        out5 = module(x5)
        cached = module.bias_cache
        assert torch.equal(module(x5), out5) and module.bias_cache is cached and len(builds) == 1
        assert torch.equal(cached, alibi_bias(2, 5, 5, dtype=torch.float32))

        out7 = module(x7)  # a longer input after a shorter one, then the shorter again
        assert module.bias_cache.shape == (2, 7, 7) and torch.equal(module.bias_cache, alibi_bias(2, 7, 7))
        assert torch.equal(module(x5), out5) and module.bias_cache.shape == (2, 5, 5) and len(builds) == 3
        assert torch.equal(out7, copy.deepcopy(fresh)(x7))

        doubled = copy.deepcopy(module).double()  # the float32 bias of the last call is still cached
        out64 = doubled(x5.double())
        assert doubled.bias_cache.dtype == torch.float64
        assert torch.equal(doubled.bias_cache, alibi_bias(2, 5, 5, dtype=torch.float64))
        assert torch.equal(out64, copy.deepcopy(fresh).double()(x5.double()))

        # The "meta" device stands in for a GPU: shapes and devices without data, on any machine.
        elsewhere = copy.deepcopy(module).to("meta")  # .to() leaves the plain attribute on the CPU
        assert elsewhere(x5.to("meta")).device.type == "meta" and elsewhere.bias_cache.device.type == "meta"


@pytest.mark.parametrize("cls", [ALiBiAttention, ALiBiFlexAttention])
def test_alibi_cached_bias_holds_no_graph_and_no_state_dict_key(cls, monkeypatch):
    """Two training steps at one length build the bias once; it requires no grad, belongs to no graph, and the
    state dict (plain and canonical) has exactly the keys it had before any call."""
    builds = count_alibi_bias_calls(monkeypatch, cls.score_bias.__module__)  # the file whose score_bias builds it
    torch.manual_seed(0)
    module = cls(10, 16, context_length=16, dropout=0.0, num_heads=4)  # the shapes of the reference test above
    keys = list(module.state_dict())
    x = torch.randn(2, 7, 10, requires_grad=True)
    grads = []
    for _ in range(2):
        module.zero_grad()
        module(x).square().sum().backward()
        grads.append(module.query.weight.grad.clone())
    assert len(builds) == 1
    assert torch.equal(grads[0], grads[1])
    assert not module.bias_cache.requires_grad and module.bias_cache.grad_fn is None
    assert list(module.state_dict()) == keys and list(module.canonical_state_dict()) == keys


def test_alibi_bias_cached_under_inference_mode_still_trains():
    """A bias first built under `torch.inference_mode` is not an inference tensor: a later training step can save
    it for the backward (an inference tensor would raise there), and its gradients equal a fresh module's."""
    torch.manual_seed(0)
    module = ALiBiAttention(8, 8, 16, 0.0, 2)
    fresh = copy.deepcopy(module)
    x = torch.randn(2, 5, 8)
    with torch.inference_mode():
        module(x)
    assert not module.bias_cache.is_inference()
    module(x).sum().backward()
    fresh(x).sum().backward()
    for (name, parameter), expected in zip(module.named_parameters(), fresh.parameters()):
        assert torch.equal(parameter.grad, expected.grad), name


def test_modules_are_registered_with_their_position_encoding():
    assert IMPLEMENTATIONS["alibi"] is ALiBiAttention and ALiBiAttention.position_encoding == "alibi"
    assert IMPLEMENTATIONS["rope"] is RoPEAttention and RoPEAttention.position_encoding == "rope"
    assert IMPLEMENTATIONS["alibi_flex"] is ALiBiFlexAttention and ALiBiFlexAttention.position_encoding == "alibi"


def test_module_argument_errors():
    with pytest.raises(ValueError, match="dropout must be 0.0, got dropout=0.1"):
        ALiBiFlexAttention(8, 8, 8, 0.1, 2)
    with pytest.raises(ValueError, match="even head_dim, got head_dim=3"):
        RoPEAttention(8, 6, 8, 0.0, 2)
    with pytest.raises(ValueError, match="context_length=8"):
        ALiBiAttention(4, 4, 8, 0.0, 2)(torch.randn(1, 9, 4))
