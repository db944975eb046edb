"""KV-cache decoding: every step equals the full forward pass; bounded caches equal their masks.

Checked at every call, not only at the end: prefill, one token per call and chunks (chunked
prefill), for MHA, GQA and MQA; past capacity the cache is left as it was; the top-left pitfall of
`is_causal=True` is shown wrong and the lower-right mask right; sliding-window caches (with and
without attention sinks) equal the float64 reference under the matching `attention.masks` mask.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import tolerance

from attention.causal.gqa import GroupedQueryAttention
from attention.decoding import KVCache, SlidingWindowKVCache, grouped_decode_attention
from attention.masks import and_masks, attention_sinks, causal, dense_mask, or_masks, sliding_window
from attention.reference import expand_kv_heads, reference_attention

TOL = tolerance("cpu", torch.float32)


def build(num_kv_heads, context_length=128, decode_kernel="auto"):
    torch.manual_seed(0)
    return GroupedQueryAttention(24, 32, context_length, 0.0, 8, num_kv_heads=num_kv_heads,
                                 decode_kernel=decode_kernel).eval()


@pytest.mark.parametrize("decode_kernel", ["sdpa", "matmul"])
@pytest.mark.parametrize("chunk", [1, 5])
@pytest.mark.parametrize("prompt_length", [1, 7, 64])
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_every_step_equals_the_full_forward(num_kv_heads, prompt_length, chunk, decode_kernel):
    module = build(num_kv_heads, decode_kernel=decode_kernel)
    total = prompt_length + 23
    x = torch.randn(2, total, 24)
    with torch.no_grad():
        full = module(x)
        cache = module.new_cache(2, total)
        out = module(x[:, :prompt_length], cache=cache)  # prefill
        torch.testing.assert_close(out, full[:, :prompt_length], **TOL)
        assert cache.length == prompt_length
        for start in range(prompt_length, total, chunk):
            stop = min(start + chunk, total)
            out = module(x[:, start:stop], cache=cache)
            torch.testing.assert_close(out, full[:, start:stop], **TOL, msg=lambda m: f"positions {start}..{stop}: {m}")
            assert cache.length == stop


@pytest.mark.parametrize("decode_kernel", ["auto", "matmul"])
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_batch_one_decode_steps_equal_the_full_forward(num_kv_heads, decode_kernel):
    """One token of one sequence takes the row-split projections (`row_split_linear`), a path of its own:
    with projection biases, every step equals the full forward pass."""
    torch.manual_seed(0)
    module = GroupedQueryAttention(24, 32, 32, 0.0, 8, qkv_bias=True, num_kv_heads=num_kv_heads,
                                   decode_kernel=decode_kernel).eval()
    with torch.no_grad():
        for layer in (module.query, module.key, module.value, module.out):
            layer.bias.normal_()  # nn.Linear starts its biases small: make a dropped bias show
        x = torch.randn(1, 12, 24)
        full = module(x)
        cache = module.new_cache(1, 12)
        module(x[:, :4], cache=cache)  # prefill
        for t in range(4, 12):
            torch.testing.assert_close(module(x[:, t:t + 1], cache=cache), full[:, t:t + 1], **TOL,
                                       msg=lambda m: f"position {t}: {m}")


def test_is_causal_aligns_top_left_and_the_cache_mask_lower_right():
    module = build(2)
    x = torch.randn(2, 15, 24)
    with torch.no_grad():
        full = module(x)
        cache = module.new_cache(2, 32)
        module(x[:, :10], cache=cache)
        chunk = x[:, 10:15]
        q = module.query(chunk).view(2, 5, 8, 4).transpose(1, 2)  # (B, H, 5, D)
        k = module.key(chunk).view(2, 5, 2, 4).transpose(1, 2)  # (B, H_kv, 5, D)
        v = module.value(chunk).view(2, 5, 2, 4).transpose(1, 2)
        keys, values, mask = cache.update(k, v)  # 15 keys, mask (5, 15)
        expected_mask = torch.arange(10, 15)[:, None] >= torch.arange(15)[None, :]
        assert torch.equal(mask, expected_mask)

        def finish(context):
            return module.out(context.transpose(1, 2).reshape(2, 5, 32))

        wrong = finish(F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True))
        right = finish(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True))
    assert not torch.allclose(wrong, full[:, 10:15], atol=1e-3)
    torch.testing.assert_close(right, full[:, 10:15], **TOL)
    # With no past (queries and keys the same positions) is_causal=True is right.
    with torch.no_grad():
        q0 = module.query(x).view(2, 15, 8, 4).transpose(1, 2)
        k0 = module.key(x).view(2, 15, 2, 4).transpose(1, 2)
        v0 = module.value(x).view(2, 15, 2, 4).transpose(1, 2)
        context = F.scaled_dot_product_attention(q0, k0, v0, is_causal=True, enable_gqa=True)
        torch.testing.assert_close(module.out(context.transpose(1, 2).reshape(2, 15, 32)), full, **TOL)


def test_past_capacity_raises_and_leaves_the_cache_unchanged():
    module = build(2)
    x = torch.randn(2, 12, 24)
    with torch.no_grad():
        full = module(x[:, :10])
        cache = module.new_cache(2, 10)
        module(x[:, :8], cache=cache)
        keys, values = cache.keys.clone(), cache.values.clone()
        with pytest.raises(ValueError, match="8 cached \\+ 3 new positions exceed capacity=10"):
            module(x[:, 8:11], cache=cache)
        assert cache.length == 8 and torch.equal(cache.keys, keys) and torch.equal(cache.values, values)
        torch.testing.assert_close(module(x[:, 8:10], cache=cache), full[:, 8:10], **TOL)  # still decodes


def test_new_cache_arguments_are_checked():
    module = build(2, context_length=16)
    with pytest.raises(ValueError, match="capacity must be at most context_length=16, got capacity=17"):
        module.new_cache(1, 17)
    with pytest.raises(ValueError, match="needs capacity"):
        module.new_cache(1)
    with pytest.raises(ValueError, match="not both"):
        module.new_cache(1, 8, window=4)
    with pytest.raises(ValueError, match="sinks apply to a sliding-window cache"):
        module.new_cache(1, 8, sinks=2)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        module.new_cache(0, 8)
    with pytest.raises(ValueError, match="window must be a positive int"):
        module.new_cache(1, window=0)
    with pytest.raises(ValueError, match="sinks must be a non-negative int"):
        module.new_cache(1, window=4, sinks=-1)


def test_a_cache_that_does_not_fit_gets_a_clear_error():
    module = build(2)
    x = torch.randn(2, 3, 24)
    with pytest.raises(ValueError, match="torch.no_grad"):
        module(x, cache=module.new_cache(2, 8))  # gradients on: a cache is for inference
    with torch.no_grad():
        with pytest.raises(ValueError, match="batch size 2, the cache was made for batch_size=3"):
            module(x, cache=module.new_cache(3, 8))
        with pytest.raises(ValueError, match="cache holds 1 K/V heads"):
            module(x, cache=build(1).new_cache(2, 8))
        with pytest.raises(TypeError, match="cache must come from new_cache"):
            module(x, cache={"keys": None})
        with pytest.raises(ValueError, match="cache is torch.bfloat16"):
            module(x, cache=KVCache(2, 2, 4, 8, dtype=torch.bfloat16))


def window_reference(module, x, window, sinks):
    pattern = or_masks(sliding_window(window), and_masks(causal, attention_sinks(sinks)))
    state = expand_kv_heads(module.canonical_state_dict(), module.num_heads)
    out, _ = reference_attention(x, x, x, state, module.num_heads, mask=dense_mask(pattern, x.shape[1], x.shape[1]))
    return out


@pytest.mark.parametrize("decode_kernel", ["sdpa", "matmul"])
@pytest.mark.parametrize("chunk", [1, 5, 12])
@pytest.mark.parametrize("sinks", [0, 2])
@pytest.mark.parametrize("window", [1, 4, 9])
def test_sliding_window_cache_equals_its_mask_at_every_step(window, sinks, chunk, decode_kernel):
    module = build(2, decode_kernel=decode_kernel)
    x = torch.randn(2, 40, 24)
    expected = window_reference(module, x, window, sinks)
    cache = module.new_cache(2, window=window, sinks=sinks)
    assert isinstance(cache, SlidingWindowKVCache)
    nbytes = cache.nbytes
    assert nbytes == 2 * 2 * (sinks + window) * 4 * 2 * 4  # K and V, B=2, H_kv=2, D=4, float32
    with torch.no_grad():
        for start in range(0, 40, chunk):
            stop = min(start + chunk, 40)
            out = module(x[:, start:stop], cache=cache)
            torch.testing.assert_close(out.double(), expected[:, start:stop], **TOL,
                                       msg=lambda m: f"positions {start}..{stop}: {m}")
            assert cache.length == stop and cache.nbytes == nbytes  # memory fixed whatever the length


def test_no_sinks_is_the_sliding_window_mask_and_the_window_really_drops_keys():
    assert torch.equal(dense_mask(or_masks(sliding_window(4), and_masks(causal, attention_sinks(0))), 12, 12),
                       dense_mask(sliding_window(4), 12, 12))
    module = build(2)
    x = torch.randn(2, 30, 24)
    with torch.no_grad():
        full = module(x)
        small = module.new_cache(2, window=4)
        windowed = torch.cat([module(x[:, t:t + 1], cache=small) for t in range(30)], dim=1)
        large = module.new_cache(2, window=30)
        unbounded = torch.cat([module(x[:, t:t + 1], cache=large) for t in range(30)], dim=1)
    assert not torch.allclose(windowed[:, 10:], full[:, 10:], atol=1e-3)  # old keys are gone
    torch.testing.assert_close(unbounded, full, **TOL)  # a window past the length is the full cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cache_bytes(dtype):
    module = build(2).to(dtype)
    cache = module.new_cache(3, 50)
    assert cache.keys.dtype == dtype
    assert cache.nbytes == 2 * 3 * 2 * 50 * 4 * torch.empty((), dtype=dtype).element_size()


@pytest.mark.parametrize("kind", ["full", "window"])
def test_rewind_repeats_a_step_exactly_and_keeps_the_contract(kind):
    from attention.decoding import DecodingCache

    module = build(2)
    cache = module.new_cache(2, 64) if kind == "full" else module.new_cache(2, window=6, sinks=2)
    assert isinstance(cache, DecodingCache)
    x = torch.randn(2, 24, 24)
    with torch.no_grad():
        module(x[:, :20], cache=cache)
        first = module(x[:, 20:21], cache=cache)
        cache.rewind(20)
        assert cache.length == 20
        again = module(x[:, 20:21], cache=cache)
        other = module(x[:, 21:22], cache=cache)  # continues from the repeated step, as without the rewind
    assert torch.equal(first, again)
    with torch.no_grad():
        fresh = module.new_cache(2, 64) if kind == "full" else module.new_cache(2, window=6, sinks=2)
        module(x[:, :21], cache=fresh)
        expected = module(x[:, 21:22], cache=fresh)
    torch.testing.assert_close(other, expected, **TOL)
    for bad in (-1, 23, 2.0, True):
        with pytest.raises(ValueError, match="length must be an int"):
            cache.rewind(bad)


def test_a_chunk_after_a_rewind_sees_only_what_the_rewind_kept():
    """Positions from the rewind on are forgotten: a chunk that follows attends to its own keys, not also to the
    ones it replaces (the chunk path attends over the ring and the chunk together). A window longer than the
    sequence keeps every position, so the cache may rewind by more than one step."""
    module = build(2)
    x, other = torch.randn(2, 24, 24), torch.randn(2, 4, 24)
    with torch.no_grad():
        cache = module.new_cache(2, window=30, sinks=2)
        module(x, cache=cache)
        cache.rewind(20)
        out = module(other, cache=cache)  # positions 20..23 again, other tokens
        fresh = module.new_cache(2, window=30, sinks=2)
        module(x[:, :20], cache=fresh)
        expected = module(other, cache=fresh)
    torch.testing.assert_close(out, expected, **TOL)


def test_grouped_decode_attention_gives_zeros_to_a_query_with_no_key():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing
    out = grouped_decode_attention(q, k, v, mask)  # (1, 4, 3, 8)
    assert not out.isnan().any() and torch.equal(out[:, :, 1], torch.zeros(1, 4, 8))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # rows with a key
    torch.testing.assert_close(out[:, :, [0, 2]], expected[:, :, [0, 2]], **TOL)


def test_sliding_window_refuses_to_rewind_past_what_it_evicted():
    module = build(2)
    cache = module.new_cache(2, window=6, sinks=2)
    x = torch.randn(2, 23, 24)
    with torch.no_grad():
        module(x, cache=cache)  # holds positions 0, 1 (sinks) and 17..22
    with pytest.raises(ValueError, match=r"cannot rewind to length=20: position\(s\) \[15, 16\] were evicted"):
        cache.rewind(20)
    assert cache.length == 23  # unchanged by the refused rewind
    cache.rewind(22)  # needs 17..21 and the sinks: all held
    assert cache.positions.tolist().count(22) == 0
