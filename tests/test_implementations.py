"""Every registered causal self-attention class against the float64 reference.

Same weights (through the canonical state dict), fresh random inputs, forward output and the
gradients of the input and of every parameter, element by element.
"""

import inspect
import itertools

import pytest
import torch
from helpers import IMPLEMENTATION_NAMES, build, canonical_grads, reference_with_grads, supports, tolerance

import attention
from attention.reference import reference_causal_self_attention

# (B, T, d_in, d_out, num_heads, context_length, qkv_bias): batch 1 and several, T below and at
# context_length, d_in equal to and different from d_out, qkv_bias on and off.
CONFIGS = [
    (2, 7, 16, 16, 4, 12, False),
    (1, 12, 12, 24, 3, 12, True),
    (3, 5, 16, 16, 2, 16, True),
    (2, 9, 24, 16, 4, 16, False),
]


def config_id(config):
    B, T, d_in, d_out, H, ctx, bias = config
    return f"B{B}-T{T}-din{d_in}-dout{d_out}-H{H}-ctx{ctx}-{'bias' if bias else 'nobias'}"


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
def test_forward_and_gradients_match_reference(name, config):
    B, T, d_in, d_out, H, ctx, qkv_bias = config
    if not supports(name, d_in, d_out):
        with pytest.raises(ValueError, match="d_in"):
            build(name, d_in, d_out, ctx, H, qkv_bias)
        return
    module = build(name, d_in, d_out, ctx, H, qkv_bias)
    x = torch.randn(B, T, d_in, requires_grad=True)
    grad_out = torch.randn(B, T, d_out)

    out = module(x)
    (out * grad_out).sum().backward()
    ref_out, ref_x_grad, ref_param_grads = reference_with_grads(
        x, module.canonical_state_dict(), H, module.position_encoding, grad_out)

    tol = tolerance("cpu", torch.float32)
    torch.testing.assert_close(out.double(), ref_out, **tol)
    torch.testing.assert_close(x.grad.double(), ref_x_grad, **tol)
    grads = canonical_grads(module)
    assert grads.keys() == ref_param_grads.keys()
    for key, grad in grads.items():
        torch.testing.assert_close(grad.double(), ref_param_grads[key], **tol, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
def test_causal_future_tokens_do_not_change_the_past(name):
    module = build(name, 16, 16, 16, 4).eval()
    x = torch.randn(2, 10, 16)
    t = 4
    changed = x.clone()
    changed[:, t + 1:] = torch.randn(2, 10 - t - 1, 16) * 10
    with torch.no_grad():
        before, after = module(x), module(changed)
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], **tolerance("cpu", torch.float32))
    assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])


@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
def test_dropout_is_stochastic_in_training_and_off_in_eval(name):
    if name in ("flex", "alibi_flex", "tiled", "gqa_flex"):
        with pytest.raises(ValueError, match="dropout"):
            build(name, 16, 16, 16, 4, dropout=0.5)
        return
    with_dropout = build(name, 16, 16, 16, 4, dropout=0.5, seed=1)
    without = build(name, 16, 16, 16, 4, dropout=0.0, seed=2)
    without.load_canonical_state_dict(with_dropout.canonical_state_dict())
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        with_dropout.train()
        first, second = with_dropout(x), with_dropout(x)
        assert not torch.allclose(first, second), "dropout in training mode should be random"
        with_dropout.eval()
        torch.testing.assert_close(with_dropout(x), without.eval()(x), **tolerance("cpu", torch.float32))


def position_group(name):
    return attention.IMPLEMENTATIONS[name].position_encoding


@pytest.mark.parametrize("source,target", list(itertools.product(IMPLEMENTATION_NAMES, repeat=2)))
def test_canonical_state_dict_round_trip(source, target):
    qkv_bias = True
    src = build(source, 16, 16, 16, 4, qkv_bias, seed=3)
    dst = build(target, 16, 16, 16, 4, qkv_bias, seed=4)
    state = src.canonical_state_dict()
    if state["key.weight"].shape != dst.canonical_state_dict()["key.weight"].shape:  # K/V heads differ (GQA, MQA)
        with pytest.raises(ValueError, match="key.weight must have shape"):
            dst.load_canonical_state_dict(state)
        return
    dst.load_canonical_state_dict(state)
    round_trip = dst.canonical_state_dict()
    assert round_trip.keys() == state.keys()
    for key in state:
        torch.testing.assert_close(round_trip[key], state[key], rtol=0, atol=0)
    if position_group(source) == position_group(target):  # same model, so the same function
        x = torch.randn(2, 6, 16)
        with torch.no_grad():
            torch.testing.assert_close(dst.eval()(x), src.eval()(x), **tolerance("cpu", torch.float32))


@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
def test_canonical_state_dict_keys_and_shapes(name):
    for qkv_bias in (False, True):
        module = build(name, 16, 16, 16, 4, qkv_bias)
        kv = getattr(module, "num_kv_heads", 4) * 4  # grouped-query classes: num_kv_heads heads of head_dim 4
        state = module.canonical_state_dict()
        expected = {"query.weight": (16, 16), "key.weight": (kv, 16), "value.weight": (kv, 16),
                    "out.weight": (16, 16), "out.bias": (16,)}
        if qkv_bias:
            expected.update({"query.bias": (16,), "key.bias": (kv,), "value.bias": (kv,)})
        assert {k: tuple(v.shape) for k, v in state.items()} == expected


@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
def test_load_canonical_state_dict_rejects_bad_state(name):
    module = build(name, 16, 16, 16, 4)
    state = module.canonical_state_dict()
    missing = {k: v for k, v in state.items() if k != "key.weight"}
    with pytest.raises(ValueError, match="missing keys \\['key.weight'\\]"):
        module.load_canonical_state_dict(missing)
    with pytest.raises(ValueError, match="unexpected keys \\['query.bias'\\]"):
        module.load_canonical_state_dict({**state, "query.bias": torch.zeros(16)})
    with pytest.raises(ValueError, match="out.weight must have shape \\(16, 16\\), got \\(16, 8\\)"):
        module.load_canonical_state_dict({**state, "out.weight": torch.zeros(16, 8)})


def permute_heads(state, num_heads, num_kv_heads, head_dim):
    """Reorder the heads consistently: the K/V heads rotate by one, each query group follows its K/V head
    and is reversed within itself; the output projection's columns follow the query heads."""
    group = num_heads // num_kv_heads
    kv_order = [(g + 1) % num_kv_heads for g in range(num_kv_heads)]
    query_order = [kv_order[g] * group + (group - 1 - i) for g in range(num_kv_heads) for i in range(group)]
    assert query_order != list(range(num_heads)), "the permutation must move some head"

    def rows(order):
        return torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in order])

    permuted = dict(state)
    for proj, order in (("query", query_order), ("key", kv_order), ("value", kv_order)):
        permuted[f"{proj}.weight"] = state[f"{proj}.weight"][rows(order)]
        if f"{proj}.bias" in state:
            permuted[f"{proj}.bias"] = state[f"{proj}.bias"][rows(order)]
    permuted["out.weight"] = state["out.weight"][:, rows(query_order)]
    return permuted


@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
def test_permuting_heads_consistently_keeps_the_output(name):
    if position_group(name) == "alibi":
        pytest.skip("ALiBi ties a slope to each head index, so reordering heads changes the model")
    module = build(name, 16, 16, 16, 4, qkv_bias=True)
    x = torch.randn(2, 7, 16)
    num_kv_heads = getattr(module, "num_kv_heads", 4)
    with torch.no_grad():
        before = module.eval()(x)
        module.load_canonical_state_dict(permute_heads(module.canonical_state_dict(), 4, num_kv_heads, head_dim=4))
        after = module(x)
    torch.testing.assert_close(after, before, **tolerance("cpu", torch.float32))


@pytest.mark.parametrize("seq_len", [16, 64, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
def test_low_precision_against_float64(name, dtype, seq_len):
    module = build(name, 64, 64, 256, 4)
    x = torch.randn(2, seq_len, 64)
    state = module.canonical_state_dict()
    reference, _ = reference_causal_self_attention(x, state, 4, module.position_encoding)
    with torch.no_grad():
        out = module.to(dtype)(x.to(dtype))
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), reference, **tolerance("cpu", dtype))


def test_unknown_name_lists_valid_names():
    with pytest.raises(KeyError) as excinfo:
        attention.IMPLEMENTATIONS["flash9"]
    message = str(excinfo.value)
    assert "'flash9'" in message
    for name in IMPLEMENTATION_NAMES:
        assert name in message


def test_registry_holds_the_required_family():
    required = {"stacked_heads", "split_heads", "fused_qkv", "einsum", "sdpa_causal", "sdpa_mask",
                "torch_mha", "torch_mha_weights", "flex", "seq_first"}
    assert required <= set(attention.IMPLEMENTATIONS)


@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
def test_every_class_keeps_the_family_contract(name):
    """attention.causal.CausalSelfAttention, the contract written once, holds for every registered class."""
    import inspect

    from attention.causal import CausalSelfAttention

    cls = attention.IMPLEMENTATIONS[name]
    signature = inspect.signature(cls.__init__)
    # The family's positional signature; keyword-only extras (block_size, num_kv_heads) need defaults.
    parameters = [name for name, p in signature.parameters.items() if p.kind != p.KEYWORD_ONLY][1:]
    assert parameters == ["d_in", "d_out", "context_length", "dropout", "num_heads", "qkv_bias"], parameters
    assert all(p.default is not p.empty for p in signature.parameters.values() if p.kind == p.KEYWORD_ONLY)
    assert inspect.signature(cls.__init__).parameters["qkv_bias"].default is False
    assert cls.position_encoding in (None, "rope", "alibi")
    assert isinstance(cls(8, 8, 8, 0.0, 2), CausalSelfAttention)


SDPA_NAMES = [name for name in IMPLEMENTATION_NAMES
              if "F.scaled_dot_product_attention(" in inspect.getsource(inspect.getmodule(attention.IMPLEMENTATIONS[name]))]


def test_sdpa_classes_are_found():
    assert {"sdpa_causal", "sdpa_mask", "alibi", "rope"} <= set(SDPA_NAMES)


@pytest.mark.parametrize("name", SDPA_NAMES)
def test_sdpa_classes_take_the_fused_cpu_kernel(name):
    # Pinned to the flash kernel, SDPA raises instead of falling back to math: a mask or bias of a shape
    # the fused kernel refuses (a 3-D float bias, say) would fail here.
    # And the fused kernel's output and gradients are this package's model: the float64 reference's.
    module = build(name, d_in=32, d_out=32, context_length=64, num_heads=4)
    x = torch.randn(2, 64, 32, requires_grad=True)
    grad_out = torch.randn(2, 64, 32)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        out = module(x)
        (out * grad_out).sum().backward()
    ref_out, ref_x_grad, ref_param_grads = reference_with_grads(
        x, module.canonical_state_dict(), 4, module.position_encoding, grad_out)
    tol = tolerance("cpu", torch.float32)
    torch.testing.assert_close(out.double(), ref_out, **tol)
    torch.testing.assert_close(x.grad.double(), ref_x_grad, **tol)
    for key, grad in canonical_grads(module).items():
        torch.testing.assert_close(grad.double(), ref_param_grads[key], **tol, msg=lambda m: f"{key}: {m}")
