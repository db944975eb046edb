"""A query that may attend to no key gets zeros, never NaN, in every kernel and layer that takes a mask.

One sweep over `CASES`: each runs one kernel or layer twice on the same inputs, under a mask where every query
has keys and under the same mask with one query's row emptied. That query's output must be exactly zero, every
other query's exactly what it was, and the gradients finite. A kernel that takes a mask joins the sweep with one
`Case`. The model layers build their own masks (causal, windows, chunks: every query sees itself), so they are
covered through the kernels they attend with; the sinks' own way of attending to nothing (a sink of +inf) is
tested below the sweep.
"""

import dataclasses
from collections.abc import Callable

import pytest
import torch

from attention import MultiHeadAttention
from attention.decoding import cached_attention, grouped_decode_attention
from attention.causal.tiled import tiled_attention
from attention.models.deepseek_v3 import DeepseekV3Attention
from attention.models.gemma2 import softcapped_attention
from attention.models.gpt_oss import GptOssAttention, attention_with_sinks
from attention.reference import reference_kernel
from tests.helpers import tolerance

B, H, H_KV, T, S, D = 2, 4, 2, 5, 7, 8  # grouped: 2 query heads per K/V head; 5 queries after 2 earlier keys
ROW = 2  # the query whose row is emptied
KEY_POSITIONS, QUERY_POSITIONS = torch.arange(S), torch.arange(S - T, S)
MASK = QUERY_POSITIONS[:, None] >= KEY_POSITIONS[None, :]  # (T, S), True = attend: causal, aligned lower right
EMPTIED = MASK.clone()
EMPTIED[ROW] = False  # query ROW may attend to no key


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel or layer taking a mask: `run(q, k, v, mask)` with `q` `(B, H, T, D)`, `k`, `v` `(B, H_KV, S, D)`
    and `mask` `(T, S)` returns its output with the queries on dim -2 (a layer derives its inputs from them)."""

    name: str
    run: Callable


def repeat_kv(t):
    """`(B, H_KV, S, D)` -> `(B, H, S, D)`: each K/V head for its query heads, for kernels without grouped heads."""
    return t.repeat_interleave(H // H_KV, dim=1)


def sinks_of(q):
    return torch.linspace(-1.0, 2.0, H, dtype=q.dtype)


def multi_head_attention(need_weights):
    """`attention.MultiHeadAttention` (no biases, so an output with no key is 0) on inputs made of q, k and v."""
    def run(q, k, v, mask):
        torch.manual_seed(0)
        module = MultiHeadAttention(H * D, H, bias=False).to(q.dtype)
        query = q.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D)
        key = repeat_kv(k).transpose(1, 2).reshape(B, S, H * D)  # (B, S, H*D)
        value = repeat_kv(v).transpose(1, 2).reshape(B, S, H * D)
        return module(query, key, value, mask=mask, need_weights=need_weights)[0]  # (B, T, H*D)
    return run


def latent_attention(path):
    """MLA's `attend_absorbed` or `attend_naive` (the kernel behind each path) on q, k, v cut to its inputs."""
    def run(q, k, v, mask):
        torch.manual_seed(0)
        module = DeepseekV3Attention(H * D, H, None, D, D // 2, D // 2, D, path=path).to(q.dtype)
        q_nope, q_rope = q.split([D // 2, D // 2], dim=-1)  # (B, H, T, D/2) each
        attend = module.attend_absorbed if path == "absorbed" else module.attend_naive
        return attend(q_nope, q_rope, k[:, :1], v[:, :1, :, :D // 2], mask)  # latent (B, 1, S, D), rotary key (B, 1, S, D/2)
    return run


CASES = [
    Case("sdpa (cached_attention)", lambda q, k, v, mask: cached_attention(q, k, v, mask, decode_kernel="sdpa")),
    Case("grouped matmuls (cached_attention)", lambda q, k, v, mask: cached_attention(q, k, v, mask, decode_kernel="matmul")),
    Case("grouped_decode_attention", lambda q, k, v, mask: grouped_decode_attention(q, k, v, mask)),
    Case("gemma2 softcapped_attention", lambda q, k, v, mask: softcapped_attention(q, k, v, mask, 0.3, 5.0)),
    Case("gemma2 softcapped_attention, no cap", lambda q, k, v, mask: softcapped_attention(q, k, v, mask, 0.3, None)),
    Case("gpt_oss attention_with_sinks", lambda q, k, v, mask: attention_with_sinks(q, k, v, mask, 0.3, sinks_of(q))),
    Case("gpt_oss attention_with_sinks, sinks -inf",
         lambda q, k, v, mask: attention_with_sinks(q, k, v, mask, 0.3, torch.full((H,), float("-inf"), dtype=q.dtype))),
    Case("MLA absorbed", latent_attention("absorbed")),
    Case("MLA naive", latent_attention("naive")),
    Case("MultiHeadAttention", multi_head_attention(need_weights=False)),
    Case("MultiHeadAttention, need_weights", multi_head_attention(need_weights=True)),
    Case("tiled_attention", lambda q, k, v, mask: tiled_attention(q, repeat_kv(k), repeat_kv(v), block_size=4,
                                                                   causal=False, mask=mask)),
    Case("reference_kernel", lambda q, k, v, mask: reference_kernel(q, k, v, mask)[0]),
]


def inputs(dtype):
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, T, D, generator=generator, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(B, H_KV, S, D, generator=generator, dtype=torch.float64).to(dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_query_with_no_key_gets_zeros_and_the_others_are_unchanged(case, dtype):
    q, k, v = inputs(dtype)
    with torch.no_grad():
        before = case.run(q, k, v, MASK)
        out = case.run(q, k, v, EMPTIED)
    assert torch.equal(out[..., ROW, :], torch.zeros_like(out[..., ROW, :])), out[..., ROW, :]
    others = [row for row in range(T) if row != ROW]
    assert torch.equal(out[..., others, :], before[..., others, :])
    assert before[..., ROW, :].abs().sum() > 0  # the row had keys before: emptying it changed something


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_gradients_through_a_query_with_no_key_are_finite(case):
    q, k, v = (t.requires_grad_(True) for t in inputs(torch.float64))
    case.run(q, k, v, EMPTIED).sum().backward()
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        assert tensor.grad.isfinite().all(), name
    assert torch.equal(q.grad[:, :, ROW], torch.zeros_like(q.grad[:, :, ROW]))  # its query reached nothing


# A sink of +inf: the head attends to nothing (the reference's reading), whatever its keys.

def test_a_head_whose_sink_is_infinite_gets_zeros_and_the_others_are_unchanged():
    q, k, v = inputs(torch.float64)
    sinks = sinks_of(q)
    infinite = sinks.clone()
    infinite[1] = float("inf")
    before = attention_with_sinks(q, k, v, MASK, 0.3, sinks)
    out = attention_with_sinks(q, k, v, MASK, 0.3, infinite)
    assert torch.equal(out[:, 1], torch.zeros_like(out[:, 1]))
    assert torch.equal(out[:, [0, 2, 3]], before[:, [0, 2, 3]])
    torch.testing.assert_close(out, reference_kernel(q, k, v, MASK, scale=0.3, sinks=infinite)[0], rtol=0, atol=1e-15)


def test_a_gpt_oss_layer_whose_sinks_are_infinite_outputs_its_bias():
    config = dict(model_type="gpt_oss", hidden_size=32, num_hidden_layers=2, num_attention_heads=H,
                  num_key_value_heads=H_KV, head_dim=D, sliding_window=4, rope_theta=1e4)
    module = GptOssAttention.from_config(config, 0).double()
    with torch.no_grad():
        module.sinks.fill_(float("inf"))
    x = torch.randn(B, T, 32, dtype=torch.float64, requires_grad=True)
    out = module(x)
    assert torch.equal(out, module.o_proj.bias.expand(B, T, 32))
    out.sum().backward()
    assert x.grad.isfinite().all() and all(p.grad.isfinite().all() for p in module.parameters())


def test_flex_forward_of_a_layer_whose_sinks_are_infinite_outputs_its_bias():
    """The fused path (attention/models/flex.py, the sink as one more key) agrees: zeros, not the NaN of inf - inf."""
    from attention.models.flex import flex_forward

    config = dict(model_type="gpt_oss", hidden_size=32, num_hidden_layers=2, num_attention_heads=H,
                  num_key_value_heads=H_KV, head_dim=D, sliding_window=4, rope_theta=1e4)
    module = GptOssAttention.from_config(config, 0).requires_grad_(False)
    module.sinks[1] = float("inf")
    x = torch.randn(B, T, 32)
    with torch.no_grad():
        fused, own = flex_forward(module, x), module(x)
    torch.testing.assert_close(fused, own, **tolerance("cpu", torch.float32))
    module.sinks.fill_(float("inf"))
    with torch.no_grad():
        assert torch.equal(flex_forward(module, x), module.o_proj.bias.expand(B, T, 32))
