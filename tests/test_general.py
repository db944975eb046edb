"""The general-purpose MultiHeadAttention: masks, cross-attention, returned weights, RoPE, dropout."""

import pytest
import torch
from helpers import tolerance

from attention import MultiHeadAttention
from attention.reference import reference_attention

TOL = tolerance("cpu", torch.float32)


def build(d_model=16, num_heads=4, **kwargs):
    torch.manual_seed(0)
    return MultiHeadAttention(d_model, num_heads, **kwargs)


def random_mask(shape, p_attend=0.6):
    return torch.rand(shape) < p_attend


MASK_SHAPES = {
    "none": None,
    "TqTk": lambda B, H, Tq, Tk: (Tq, Tk),
    "B1TqTk": lambda B, H, Tq, Tk: (B, 1, Tq, Tk),
    "1HTqTk": lambda B, H, Tq, Tk: (1, H, Tq, Tk),
    "BHTqTk": lambda B, H, Tq, Tk: (B, H, Tq, Tk),
    # Shapes that broadcast like SDPA's: a key padding mask, one row for every query, 3-D per head.
    "B11Tk": lambda B, H, Tq, Tk: (B, 1, 1, Tk),
    "Tk": lambda B, H, Tq, Tk: (Tk,),
    "HTqTk": lambda B, H, Tq, Tk: (H, Tq, Tk),
    "B1Tq1": lambda B, H, Tq, Tk: (B, 1, Tq, 1),
}


@pytest.mark.parametrize("lengths", [(6, 6), (5, 9), (8, 3)], ids=["self", "Tq<Tk", "Tq>Tk"])
@pytest.mark.parametrize("mask_kind", list(MASK_SHAPES))
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "weights"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_reference(lengths, mask_kind, need_weights, bias):
    B, H, d_model = 2, 4, 16
    Tq, Tk = lengths
    module = build(d_model, H, bias=bias)
    query = torch.randn(B, Tq, d_model, requires_grad=True)
    key_value = torch.randn(B, Tk, d_model, requires_grad=True)
    mask = None if MASK_SHAPES[mask_kind] is None else random_mask(MASK_SHAPES[mask_kind](B, H, Tq, Tk))
    grad_out = torch.randn(B, Tq, d_model)

    out, weights = module(query, key_value, key_value, mask=mask, need_weights=need_weights)
    (out * grad_out).sum().backward()

    q64 = query.detach().double().requires_grad_()
    kv64 = key_value.detach().double().requires_grad_()
    state = {k: v.double().requires_grad_() for k, v in module.canonical_state_dict().items()}
    ref_out, ref_weights = reference_attention(q64, kv64, kv64, state, H, mask=mask)
    (ref_out * grad_out.double()).sum().backward()

    torch.testing.assert_close(out.double(), ref_out, **TOL)
    torch.testing.assert_close(query.grad.double(), q64.grad, **TOL)
    torch.testing.assert_close(key_value.grad.double(), kv64.grad, **TOL)
    for name, param in module.named_parameters():
        torch.testing.assert_close(param.grad.double(), state[name].grad, **TOL, msg=lambda m: f"{name}: {m}")
    if need_weights:
        assert weights.shape == (B, H, Tq, Tk)
        torch.testing.assert_close(weights.double(), ref_weights, **TOL)
    else:
        assert weights is None


def test_self_attention_defaults_key_and_value_to_query():
    module = build()
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(module(x)[0], module(x, x, x)[0], rtol=0, atol=0)


def test_returned_weights_sum_to_one_and_are_zero_where_masked():
    module = build()
    mask = random_mask((2, 1, 6, 9))
    mask[:, :, :, 0] = True  # every row keeps at least one key
    _, weights = module(torch.randn(2, 6, 16), torch.randn(2, 9, 16), mask=mask, need_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
    assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)


@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "weights"])
def test_fully_masked_rows_give_zeros_not_nan(need_weights):
    module = build(bias=False)
    query = torch.randn(2, 4, 16, requires_grad=True)
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[2] = False  # query 2 may attend to nothing
    out, weights = module(query, torch.randn(2, 7, 16), mask=mask, need_weights=need_weights)
    out.sum().backward()
    assert torch.all(out[:, 2] == 0), "a query with no key gets a zero output (bias=False: no output bias)"
    assert not torch.isnan(out).any() and not torch.isnan(query.grad).any()
    if need_weights:
        assert torch.all(weights[:, :, 2] == 0)


def test_causal_mask_via_general_module_matches_causal_family():
    from attention.causal.split_heads import SplitHeadsAttention
    general = build()
    causal = SplitHeadsAttention(16, 16, 8, 0.0, 4, qkv_bias=True).eval()
    causal.load_canonical_state_dict(general.canonical_state_dict())
    x = torch.randn(2, 8, 16)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    torch.testing.assert_close(general(x, mask=mask)[0], causal(x), **TOL)


@pytest.mark.parametrize("lengths", [(6, 6), (4, 9)])
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "weights"])
def test_rope_matches_reference(lengths, need_weights):
    Tq, Tk = lengths
    module = build(rope=True)
    query, key_value = torch.randn(2, Tq, 16), torch.randn(2, Tk, 16)
    out, _ = module(query, key_value, need_weights=need_weights)
    ref_out, _ = reference_attention(query, key_value, key_value, module.canonical_state_dict(), 4, rope_base=10000.0)
    torch.testing.assert_close(out.double(), ref_out, **TOL)
    plain, _ = build(rope=False)(query, key_value)
    assert not torch.allclose(out, plain), "rope=True must change the scores"


@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "weights"])
def test_dropout_stochastic_in_training_and_off_in_eval(need_weights):
    module = build(dropout=0.5)
    no_dropout = build(dropout=0.0)
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        first, second = module.train()(x, need_weights=need_weights)[0], module(x, need_weights=need_weights)[0]
        assert not torch.allclose(first, second)
        torch.testing.assert_close(module.eval()(x, need_weights=need_weights)[0], no_dropout(x)[0], **TOL)


def test_returned_weights_are_taken_before_dropout():
    """In training, dropout zeroes and rescales the weights that multiply the values, but `need_weights` returns
    them before dropout (the docstring's promise): rows summing to 1, the same as in eval mode."""
    module = build(dropout=0.5)
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        eval_out, eval_weights = module.eval()(x, need_weights=True)
        train_out, train_weights = module.train()(x, need_weights=True)
    torch.testing.assert_close(train_weights, eval_weights, rtol=0, atol=0)
    torch.testing.assert_close(train_weights.sum(dim=-1), torch.ones(2, 4, 6))
    assert not torch.allclose(train_out, eval_out), "dropout still acts on the output in training"


def test_weights_path_equals_sdpa_path():
    module = build()
    x, mask = torch.randn(3, 7, 16), random_mask((3, 1, 7, 7))
    torch.testing.assert_close(module(x, mask=mask)[0], module(x, mask=mask, need_weights=True)[0], **TOL)


@pytest.mark.parametrize("kwargs, error, says", [
    (dict(d_model=64.0, num_heads=4), TypeError, r"d_model must be an int, got d_model=64\.0"),
    (dict(d_model=64, num_heads=True), TypeError, r"num_heads must be an int, got num_heads=True"),
    (dict(d_model=64, num_heads=4, dropout="0.1"), TypeError, r"dropout must be a float, got dropout='0\.1'"),
    (dict(d_model=64, num_heads=4, dropout=True), TypeError, r"dropout must be a float, got dropout=True"),
    (dict(d_model=64, num_heads=4, rope=True, rope_base=0.0), ValueError, r"rope_base must be positive, got rope_base=0\.0"),
    (dict(d_model=64, num_heads=4, rope=True, rope_base=float("nan")), ValueError, r"rope_base must be positive, got rope_base=nan"),
])
def test_constructor_arguments_of_the_wrong_type_or_value_are_refused_naming_them(kwargs, error, says):
    with pytest.raises(error, match=says):
        MultiHeadAttention(**kwargs)


def test_inputs_that_are_not_floating_point_tensors_on_one_device_are_refused_naming_them():
    mha = MultiHeadAttention(d_model=8, num_heads=2)
    x = torch.randn(1, 3, 8)
    with pytest.raises(TypeError, match=r"key must be a torch\.Tensor, got list"):
        mha(x, [[0.0] * 8] * 3, x)
    with pytest.raises(TypeError, match=r"value must be a floating-point tensor, got value\.dtype=torch\.int64"):
        mha(x, x, torch.zeros(1, 3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"query, key and value must be on one device, got cpu, meta, cpu"):
        mha(x, x.to("meta"), x)


def test_a_canonical_state_dict_with_missing_extra_or_misshapen_weights_is_refused_and_nothing_loaded():
    mha = MultiHeadAttention(d_model=8, num_heads=2)
    before = mha.canonical_state_dict()
    state = {name: torch.zeros_like(tensor) for name, tensor in before.items()}
    del state["out.bias"]
    with pytest.raises(ValueError, match=r"missing keys \['out\.bias'\], unexpected keys \['out\.scale'\]"):
        mha.load_canonical_state_dict(state | {"out.scale": torch.ones(8)})
    with pytest.raises(ValueError, match=r"key\.weight must have shape \(8, 8\), got \(8, 4\)"):
        mha.load_canonical_state_dict(state | {"out.bias": torch.zeros(8), "key.weight": torch.zeros(8, 4)})
    for name, tensor in mha.canonical_state_dict().items():
        assert torch.equal(tensor, before[name]), name
    mha.load_canonical_state_dict(state | {"out.bias": torch.zeros(8)})
    assert all(not tensor.any() for tensor in mha.canonical_state_dict().values())
