"""Grouped-query and multi-query attention against the float64 reference, for several (H, H_kv) pairs.

The shared tests (test_implementations.py) run `gqa`, `mqa` and `gqa_flex` with their default
`num_kv_heads`; these run every pair below, both SDPA strategies and FlexAttention, forward and
gradients, and the errors for pairs that cannot work.
"""

import inspect

import pytest
import torch
from helpers import canonical_grads, reference_with_grads, tolerance

import attention
from attention.causal.gqa import GroupedQueryAttention, MultiQueryAttention
from attention.causal.gqa_flex import GroupedQueryFlexAttention
from attention.reference import expand_kv_heads, reference_causal_self_attention

PAIRS = [(8, 8), (8, 4), (8, 2), (8, 1), (6, 3), (6, 2)]  # (num_heads, num_kv_heads): MHA ... MQA
BUILDERS = {
    "gqa-enable_gqa": lambda *args, **kw: GroupedQueryAttention(*args, kv_strategy="enable_gqa", **kw),
    "gqa-repeat": lambda *args, **kw: GroupedQueryAttention(*args, kv_strategy="repeat", **kw),
    "gqa_flex": GroupedQueryFlexAttention,
}


@pytest.mark.parametrize("qkv_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("num_heads,num_kv_heads", PAIRS, ids=lambda value: str(value))
@pytest.mark.parametrize("builder", list(BUILDERS))
def test_forward_and_gradients_match_reference(builder, num_heads, num_kv_heads, qkv_bias):
    d_in, d_out, T = 20, num_heads * 4, 9
    torch.manual_seed(0)
    module = BUILDERS[builder](d_in, d_out, 16, 0.0, num_heads, qkv_bias, num_kv_heads=num_kv_heads)
    assert module.num_kv_heads == num_kv_heads
    x = torch.randn(2, T, d_in, requires_grad=True)
    grad_out = torch.randn(2, T, d_out)
    out = module(x)
    (out * grad_out).sum().backward()
    ref_out, ref_x_grad, ref_grads = reference_with_grads(x, module.canonical_state_dict(), num_heads, None, grad_out)
    tol = tolerance("cpu", torch.float32)
    torch.testing.assert_close(out.double(), ref_out, **tol)
    torch.testing.assert_close(x.grad.double(), ref_x_grad, **tol)
    grads = canonical_grads(module)
    assert grads.keys() == ref_grads.keys()
    for key, grad in grads.items():  # key/value gradients: summed over each group's query heads
        torch.testing.assert_close(grad.double(), ref_grads[key], **tol, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("num_heads,num_kv_heads", PAIRS, ids=lambda value: str(value))
def test_canonical_state_dict_has_num_kv_heads_rows_of_key_and_value(num_heads, num_kv_heads):
    module = GroupedQueryAttention(16, num_heads * 4, 8, 0.0, num_heads, qkv_bias=True, num_kv_heads=num_kv_heads)
    shapes = {name: tuple(tensor.shape) for name, tensor in module.canonical_state_dict().items()}
    kv = num_kv_heads * 4
    assert shapes == {"query.weight": (num_heads * 4, 16), "key.weight": (kv, 16), "value.weight": (kv, 16),
                      "out.weight": (num_heads * 4, num_heads * 4), "out.bias": (num_heads * 4,),
                      "query.bias": (num_heads * 4,), "key.bias": (kv,), "value.bias": (kv,)}


def test_gqa_is_mha_with_the_key_and_value_heads_repeated():
    gqa = GroupedQueryAttention(24, 32, 16, 0.0, 8, qkv_bias=True, num_kv_heads=2).eval()
    mha = attention.IMPLEMENTATIONS["split_heads"](24, 32, 16, 0.0, 8, qkv_bias=True).eval()
    mha.load_canonical_state_dict(expand_kv_heads(gqa.canonical_state_dict(), 8))
    x = torch.randn(3, 11, 24)
    with torch.no_grad():
        torch.testing.assert_close(mha(x), gqa(x), **tolerance("cpu", torch.float32))


def test_mqa_is_gqa_with_one_kv_head():
    mqa = MultiQueryAttention(16, 32, 16, 0.0, 8).eval()
    assert mqa.num_kv_heads == 1
    gqa = GroupedQueryAttention(16, 32, 16, 0.0, 8, num_kv_heads=1).eval()
    gqa.load_canonical_state_dict(mqa.canonical_state_dict())
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        torch.testing.assert_close(mqa(x), gqa(x), rtol=0, atol=0)


def test_mqa_takes_every_keyword_of_gqa_but_num_kv_heads():
    gqa_keywords = {name for name, parameter in inspect.signature(GroupedQueryAttention).parameters.items()
                    if parameter.kind is inspect.Parameter.KEYWORD_ONLY}
    mqa_keywords = {name for name, parameter in inspect.signature(MultiQueryAttention).parameters.items()
                    if parameter.kind is inspect.Parameter.KEYWORD_ONLY}
    assert mqa_keywords == gqa_keywords - {"num_kv_heads"}
    mqa = MultiQueryAttention(16, 32, 16, 0.0, 8, kv_strategy="repeat", decode_kernel="matmul")
    assert (mqa.kv_strategy, mqa.decode_kernel) == ("repeat", "matmul")


def test_weights_move_between_sdpa_and_flex():
    gqa = GroupedQueryAttention(16, 32, 16, 0.0, 8, num_kv_heads=4).eval()
    flex = GroupedQueryFlexAttention(16, 32, 16, 0.0, 8, num_kv_heads=4).eval()
    flex.load_canonical_state_dict(gqa.canonical_state_dict())
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        torch.testing.assert_close(flex(x), gqa(x), **tolerance("cpu", torch.float32))
    wrong = GroupedQueryAttention(16, 32, 16, 0.0, 8, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"key.weight must have shape \(8, 16\), got \(16, 16\)"):
        wrong.load_canonical_state_dict(gqa.canonical_state_dict())


@pytest.mark.parametrize("cls", [GroupedQueryAttention, GroupedQueryFlexAttention])
def test_bad_num_kv_heads_get_clear_errors(cls):
    with pytest.raises(ValueError, match="num_kv_heads=3, num_heads=8"):
        cls(16, 32, 16, 0.0, 8, num_kv_heads=3)
    for value in (0, -1):
        with pytest.raises(ValueError, match=f"num_kv_heads={value}"):
            cls(16, 32, 16, 0.0, 8, num_kv_heads=value)
    for value in (2.0, True, "2"):
        with pytest.raises(TypeError, match="num_kv_heads must be an int"):
            cls(16, 32, 16, 0.0, 8, num_kv_heads=value)


def test_other_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="kv_strategy must be one of"):
        GroupedQueryAttention(16, 32, 16, 0.0, 8, kv_strategy="expand")
    with pytest.raises(ValueError, match="dropout"):
        GroupedQueryFlexAttention(16, 32, 16, 0.1, 8)


def test_default_num_kv_heads_takes_groups_of_4_else_2_else_1():
    # Groups of 4 query heads per K/V head (Llama 3 8B, Mistral 7B) where 4 divides num_heads.
    expected = {12: 3, 8: 2, 4: 1, 6: 3, 2: 1, 3: 3, 1: 1}
    for num_heads, num_kv_heads in expected.items():
        assert GroupedQueryAttention(8, num_heads * 2, 8, 0.0, num_heads).num_kv_heads == num_kv_heads
        assert GroupedQueryFlexAttention(8, num_heads * 2, 8, 0.0, num_heads).num_kv_heads == num_kv_heads


def test_kv_strategy_decides_what_sdpa_receives(monkeypatch):
    import attention.causal.gqa as gqa_module

    seen = []
    original = gqa_module.F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        seen.append((k.shape[1], kwargs["enable_gqa"]))
        return original(q, k, v, **kwargs)

    monkeypatch.setattr(gqa_module.F, "scaled_dot_product_attention", recording)
    outputs = {}
    for strategy in ("enable_gqa", "repeat"):
        torch.manual_seed(0)
        module = GroupedQueryAttention(16, 32, 16, 0.0, 8, num_kv_heads=2, kv_strategy=strategy).eval()
        with torch.no_grad():
            outputs[strategy] = module(torch.ones(1, 5, 16))
    assert seen == [(2, True), (8, False)]  # the smaller K/V with enable_gqa; K/V repeated to 8 heads otherwise
    torch.testing.assert_close(outputs["repeat"], outputs["enable_gqa"], **tolerance("cpu", torch.float32))


@pytest.mark.parametrize("name", ["gqa", "mqa"])
def test_bfloat16_against_float64(name):
    module = attention.IMPLEMENTATIONS[name](64, 64, 128, 0.0, 8)
    x = torch.randn(2, 64, 64)
    reference, _ = reference_causal_self_attention(x, module.canonical_state_dict(), 8)
    with torch.no_grad():
        out = module.to(torch.bfloat16)(x.to(torch.bfloat16))
    torch.testing.assert_close(out.double(), reference, **tolerance("cpu", torch.bfloat16))
