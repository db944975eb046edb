"""Bad input gets a clear ValueError/TypeError that names the argument and its value."""

import pytest
import torch
from helpers import IMPLEMENTATION_NAMES, build

import attention
from attention import MultiHeadAttention

GOOD = dict(d_in=16, d_out=16, context_length=8, dropout=0.0, num_heads=4)


@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
@pytest.mark.parametrize("bad,error,pattern", [
    (dict(d_out=18), ValueError, "d_out=18, num_heads=4"),
    (dict(num_heads=0), ValueError, "num_heads=0"),
    (dict(d_in=-1), ValueError, "d_in=-1"),
    (dict(context_length=0), ValueError, "context_length=0"),
    (dict(dropout=1.0), ValueError, "dropout=1.0"),
    (dict(dropout=-0.1), ValueError, "dropout=-0.1"),
    (dict(d_in=16.0), TypeError, "d_in=16.0"),
    (dict(dropout="0.1"), TypeError, "dropout='0.1'"),
])
def test_constructor_rejects_bad_arguments(name, bad, error, pattern):
    with pytest.raises(error, match=pattern.replace("(", "\\(").replace(".", "\\.")):
        attention.IMPLEMENTATIONS[name](**{**GOOD, **bad})


@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
@pytest.mark.parametrize("x,error,pattern", [
    (torch.randn(2, 9, 16), ValueError, "context_length=8\\], got T=9"),
    (torch.randn(9, 16), ValueError, "x.shape=\\(9, 16\\)"),
    (torch.randn(2, 3, 15), ValueError, "d_in=16\\), got x.shape=\\(2, 3, 15\\)"),
    (torch.randn(2, 0, 16), ValueError, "got T=0"),
    (torch.ones(2, 3, 16, dtype=torch.long), TypeError, "x.dtype=torch.int64"),
    ([[0.0] * 16], TypeError, "x must be a torch.Tensor, got list"),
])
def test_forward_rejects_bad_input(name, x, error, pattern):
    module = build(name, 16, 16, 8, 4)
    with pytest.raises(error, match=pattern):
        module(x)


@pytest.mark.parametrize("mask,error,pattern", [
    (torch.ones(5, 6, dtype=torch.bool), ValueError, "got mask.shape=\\(5, 6\\)"),
    (torch.ones(2, 3, 4, 6, dtype=torch.bool), ValueError, "got mask.shape=\\(2, 3, 4, 6\\)"),
    (torch.ones(3, 1, 4, 6, dtype=torch.bool), ValueError, "broadcast to \\(B=2, H=4, Tq=4, Tk=6\\)"),
    (torch.ones(2, 6, dtype=torch.bool), ValueError, "\\(B, Tk\\) key padding mask must be passed as mask\\[:, None, None, :\\]"),
    (torch.ones(1, 2, 1, 4, 6, dtype=torch.bool), ValueError, "got mask.shape=\\(1, 2, 1, 4, 6\\)"),
    (torch.ones(2, 1, 1, 5, dtype=torch.bool), ValueError, "got mask.shape=\\(2, 1, 1, 5\\)"),
    (torch.ones(4, 6), TypeError, "mask.dtype=torch.float32"),
    (torch.ones(4, 6, dtype=torch.bool, device="meta"), ValueError, "mask.device=meta"),
    ([[True]], TypeError, "mask must be a torch.Tensor"),
])
def test_general_module_rejects_bad_masks(mask, error, pattern):
    module = MultiHeadAttention(16, 4)
    with pytest.raises(error, match=pattern):
        module(torch.randn(2, 4, 16), torch.randn(2, 6, 16), mask=mask)


@pytest.mark.parametrize("args,error,pattern", [
    (dict(d_model=18, num_heads=4), ValueError, "d_model=18, num_heads=4"),
    (dict(d_model=0, num_heads=1), ValueError, "d_model=0"),
    (dict(d_model=16, num_heads=-2), ValueError, "num_heads=-2"),
    (dict(d_model=16, num_heads=4, dropout=1.5), ValueError, "dropout=1.5"),
    (dict(d_model=12, num_heads=4, rope=True), ValueError, "head_dim=3"),
])
def test_general_module_rejects_bad_constructor_arguments(args, error, pattern):
    with pytest.raises(error, match=pattern):
        MultiHeadAttention(**args)


@pytest.mark.parametrize("query,key,pattern", [
    (torch.randn(2, 4, 15), None, "query.shape=\\(2, 4, 15\\)"),
    (torch.randn(4, 16), None, "query.shape=\\(4, 16\\)"),
    (torch.randn(2, 4, 16), torch.randn(3, 6, 16), "batch size, got 2, 3, 3"),
])
def test_general_module_rejects_bad_inputs(query, key, pattern):
    with pytest.raises(ValueError, match=pattern):
        MultiHeadAttention(16, 4)(query, key)


def test_general_module_rejects_key_value_length_mismatch():
    with pytest.raises(ValueError, match="key and value must have the same length"):
        MultiHeadAttention(16, 4)(torch.randn(2, 4, 16), torch.randn(2, 6, 16), torch.randn(2, 5, 16))
