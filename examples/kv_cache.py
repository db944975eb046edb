# %% [markdown]
# # KV cache and decoding
#
# A language model generates one token at a time, and token `t + 1` attends to the keys and values
# of every token before it. Recomputing them at every step would project the whole prefix again;
# a **KV cache** keeps them, so a step projects only the new token and reads the cache. This page
# builds decoding on the [grouped-query](../gqa/) class with the caches and kernels of
# `attention/decoding/`: prefill, steps, chunks, the code, the pitfalls (each shown failing, then
# fixed) and a step's speed. It assumes the [split-heads](../split_heads/) and [masks](../masks/) pages.
#
# ![A KV cache growing one strip per step: the prompt's keys and values fill the first slots of a
# preallocated buffer in one call, then each decoding step writes one position and its query reads
# every filled slot](../../diagrams/kv-cache-growth.svg)
#
# API reference: [`attention.causal.gqa`](../../api/causal/gqa/), [`attention.decoding`](../../api/decoding/).

# %%
import torch
import torch.nn.functional as F

from attention.causal.gqa import GroupedQueryAttention
from attention.decoding import KVCache, SlidingWindowKVCache, grouped_decode_attention
from attention.display import show, show_markdown, show_shape, show_source
from attention.masks import and_masks, attention_sinks, causal, dense_mask, or_masks, sliding_window
from attention.plotting import plot_masks
from attention.reference import expand_kv_heads, reference_attention

torch.manual_seed(0)
d_model, num_heads, num_kv_heads = 64, 8, 2
module = GroupedQueryAttention(d_model, d_model, 128, 0.0, num_heads, num_kv_heads=num_kv_heads).eval()
sequence = torch.randn(2, 40, d_model)  # (B, T, C): the tokens a model would feed back one by one
with torch.no_grad():
    full = module(sequence)  # the full causal forward pass: what every decoding step must reproduce

# %% [markdown]
# ## Prefill, then one token per step
#
# `module.new_cache(batch_size, capacity)` preallocates keys and values for `capacity` positions,
# `(B, H_kv, capacity, D)` each, and starts empty (`length` 0). `module(x, cache=cache)` projects
# `x`, writes its keys and values at positions `length .. length + T - 1`, and attends from its
# queries over everything cached so far. The cache is for inference, so the calls run under
# `torch.no_grad()`.

# %%
cache = module.new_cache(batch_size=2, capacity=64)
show_shape("cache.keys (preallocated)", cache.keys, "(B, H_kv, capacity, D)")
prompt_length = 7
with torch.no_grad():
    outputs = [module(sequence[:, :prompt_length], cache=cache)]  # prefill: the prompt in one call
    show_shape(f"prefill output, cache.length = {cache.length}", outputs[0], "(B, T, C)")
    for t in range(prompt_length, sequence.shape[1]):
        outputs.append(module(sequence[:, t:t + 1], cache=cache))  # one new token per sequence: (B, 1, C)
    show_shape(f"last step's output, cache.length = {cache.length}", outputs[-1], "(B, 1, C)")
decoded = torch.cat(outputs, dim=1)  # (B, T, C)
print(f"max |decoded - full| over all {decoded.shape[1]} positions: {(decoded - full).abs().max().item():.2e}")
torch.testing.assert_close(decoded, full, atol=2e-5, rtol=1e-4)

# %% [markdown]
# ## The code
#
# The cache writes a chunk at `length`, counts it, and returns views of everything cached with the
# mask the chunk's queries need (none for one query, which sees every key):

# %% tags=["hide-input"]
show_source(KVCache.update)

# %% [markdown]
# The module's forward: project, `update`, attend. With a cache it never passes `is_causal=True`
# (pitfall 1 below), and for a few new tokens on a CPU it attends through the grouped matmuls,
# `grouped_decode_attention` (the section on speed, below, shows why):

# %% tags=["hide-input"]
show_source(GroupedQueryAttention.forward)

# %% [markdown]
# ## Chunked prefill
#
# A long prompt can go in chunks (to bound the memory of one call, or to interleave prompts with
# other sequences' decode steps). A chunk of 5 queries after `L` cached positions sits at positions
# `L .. L + 4`: query `i` of the chunk attends to keys `0 .. L + i`, the mask `update` returns,
# `(T, L + T)`.

# %%
chunked_cache = module.new_cache(batch_size=2, capacity=64)
with torch.no_grad():
    chunks = [module(sequence[:, start:start + 5], cache=chunked_cache) for start in range(0, 40, 5)]
chunked = torch.cat(chunks, dim=1)
print(f"8 chunks of 5: max |chunked - full| = {(chunked - full).abs().max().item():.2e}")
torch.testing.assert_close(chunked, full, atol=2e-5, rtol=1e-4)

# %% [markdown]
# ## Pitfall 1: is_causal aligns the mask to the top left
#
# `F.scaled_dot_product_attention(..., is_causal=True)` builds the causal mask as if the queries
# and the keys both started at position 0: query `i` sees keys `0 .. i`. That is right when the
# queries are the whole sequence, and wrong as soon as a chunk of `T` queries meets a cache of
# `S > T` keys: the chunk's queries really sit at the end, `S - T .. S - 1`. Here, 5 queries after
# 10 cached positions:

# %%
L, T_chunk = 10, 5
top_left = torch.ones(T_chunk, L + T_chunk, dtype=torch.bool).tril()  # what is_causal=True means
query_positions = torch.arange(L, L + T_chunk)
lower_right = query_positions[:, None] >= torch.arange(L + T_chunk)[None, :]  # what the chunk needs
show(plot_masks({"is_causal=True (top left): wrong": top_left, "lower right: right": lower_right},
                ncols=2, q_offset=L, title=f"{T_chunk} queries at positions {L}-{L + T_chunk - 1} over {L + T_chunk} keys"))

# %% [markdown]
# The wrong mask, run on real keys and values from a cache, against the full forward pass; then the
# mask `KVCache.update` returns, and PyTorch's own lower-right mask object,
# `torch.nn.attention.bias.causal_lower_right(T, S)`, which SDPA accepts in place of a tensor (with
# K/V repeated to the query heads):

# %%
from torch.nn.attention.bias import causal_lower_right

with torch.no_grad():
    pitfall_cache = module.new_cache(batch_size=2, capacity=64)
    module(sequence[:, :L], cache=pitfall_cache)  # 10 positions cached
    x_chunk = sequence[:, L:L + T_chunk]
    B, H, H_kv, D = 2, num_heads, num_kv_heads, module.head_dim
    q = module.query(x_chunk).view(B, T_chunk, H, D).transpose(1, 2)  # (B, H, 5, D)
    k = module.key(x_chunk).view(B, T_chunk, H_kv, D).transpose(1, 2)  # (B, H_kv, 5, D)
    v = module.value(x_chunk).view(B, T_chunk, H_kv, D).transpose(1, 2)
    keys, values, mask = pitfall_cache.update(k, v)  # (B, H_kv, 15, D) each, mask (5, 15)

    def finish(context):  # (B, H, T, D) -> the module's output (B, T, C)
        return module.out(context.transpose(1, 2).reshape(B, context.shape[2], d_model))

    wrong = finish(F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True))
    right = finish(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True))
    via_bias = finish(F.scaled_dot_product_attention(q, keys.repeat_interleave(H // H_kv, dim=1),  # (B, H, S, D)
                                                     values.repeat_interleave(H // H_kv, dim=1),
                                                     attn_mask=causal_lower_right(T_chunk, L + T_chunk)))
expected = full[:, L:L + T_chunk]
for label, out in (("is_causal=True (top left)", wrong), ("mask from KVCache.update", right),
                   ("causal_lower_right", via_bias)):
    print(f"{label:28} max |error| = {(out - expected).abs().max().item():.1e}")
assert (wrong - expected).abs().max() > 1e-2
torch.testing.assert_close(mask, lower_right)
torch.testing.assert_close(right, expected, atol=2e-5, rtol=1e-4)
torch.testing.assert_close(via_bias, expected, atol=2e-5, rtol=1e-4)

# %% [markdown]
# With `is_causal=True` one new token would attend to key 0 only (the top-left mask of a `(1, S)` row keeps
# its first entry): the module passes no mask for one query and never `is_causal=True` over a cache.

# %%
with torch.no_grad():
    q1 = module.query(sequence[:, L:L + 1]).view(B, 1, H, D).transpose(1, 2)  # (B, H, 1, D): position 10
    one_wrong = finish(F.scaled_dot_product_attention(q1, keys[:, :, :L + 1], values[:, :, :L + 1], is_causal=True,
                                                      enable_gqa=True))
print(f"is_causal=True for one query: max |error| = {(one_wrong - full[:, L:L + 1]).abs().max().item():.3f}")

# %% [markdown]
# ## Pitfall 2: past capacity
#
# A full cache refuses a chunk that does not fit, with a clear error, and stays as it was: a
# failed call must not leave half a chunk written.

# %%
small = module.new_cache(batch_size=2, capacity=10)
with torch.no_grad():
    module(sequence[:, :8], cache=small)
    keys_before = small.keys.clone()
    try:
        module(sequence[:, 8:11], cache=small)
    except ValueError as error:
        print(f"ValueError: {error}")
print(f"cache.length after the refused call: {small.length}; keys unchanged: {torch.equal(small.keys, keys_before)}")

# %% [markdown]
# ## Pitfall 3: a cache that must stay bounded
#
# Models trained with a sliding window (Mistral 7B's 4,096 keys; [sliding_window](../masks/)) attend to
# the last `w` positions only, so their cache can be a **ring buffer** of `w` slots: position `p` goes to
# slot `p mod w`, over the position that just left the window. **Attention sinks** (below), the first few
# tokens kept for good, sit in slots of their own, before the ring.
#
# ![A sliding-window cache with attention sinks: 2 sink slots keep positions 0 and 1 for good, 4
# ring slots keep the last 4 positions; token 12 goes to slot 2 + (12 - 2) mod 4 = 4 and evicts
# position 8](../../diagrams/kv-cache-ring-sinks.svg)
#
# `new_cache(batch_size, window=w, sinks=s)` makes one, a `SlidingWindowKVCache`. One token is
# written in place, since the slot it overwrites held the position its query no longer sees; a
# chunk attends over the ring and its own keys before it is written, since its early queries still
# need keys its later positions would evict:

# %% tags=["hide-input"]
show_source(SlidingWindowKVCache.update)
show_source(SlidingWindowKVCache._write)

# %% [markdown]
# Which position each slot holds, step by step (a window of 6, no sinks, 10 tokens):

# %%
window = 6
ring = module.new_cache(batch_size=1, window=window)
with torch.no_grad():
    for t in range(10):
        module(sequence[:1, t:t + 1], cache=ring)
        print(f"after token {t:2}: slots hold positions {ring.positions.tolist()}")  # -1: empty

# %% [markdown]
# Its memory stays the same however long the sequence, where a full cache grows with it; and its
# outputs equal the full forward pass under the `sliding_window(6)` mask, one token at a time and in
# chunks:

# %%
state = expand_kv_heads(module.canonical_state_dict(), num_heads)  # K/V heads repeated: a multi-head state
expected_window, _ = reference_attention(sequence, sequence, sequence, state, num_heads,
                                         mask=dense_mask(sliding_window(window), 40, 40))  # (B, T, C), float64
for chunk in (1, 5, 13):
    ring = module.new_cache(batch_size=2, window=window)
    with torch.no_grad():
        out = torch.cat([module(sequence[:, s:s + chunk], cache=ring) for s in range(0, 40, chunk)], dim=1)
    error = (out.double() - expected_window).abs().max().item()
    print(f"{chunk:2} tokens per call: max |error| = {error:.1e}; the ring holds {ring.nbytes:,} bytes, a full cache "
          f"of 40 positions {module.new_cache(2, 40).nbytes:,}")
    assert error < 1e-4

# %% [markdown]
# **Attention sinks.** Dropping the first tokens hurts: models put a large share of attention on
# them whatever they say, and a window that has moved past them degrades generation. StreamingLLM
# (Xiao et al., 2023, <https://arxiv.org/abs/2309.17453>) keeps the first `s` tokens (the sinks)
# for good, plus the window. It also numbers positions within the cache, not in the text: a RoPE
# model rotates each cached key by its slot's place, so that no query-key distance exceeds what it
# saw in training. This page's module has no position encoding, so the cache keeps absolute
# positions; a RoPE model taking it unchanged would need that renumbering too. The matching mask,
# built from `attention.masks` combinators, and the cache against it:

# %%
sinks = 2
sink_pattern = or_masks(sliding_window(window), and_masks(causal, attention_sinks(sinks)))
show(plot_masks({"sliding_window(6)": sliding_window(window), "attention_sinks(2), causal":
                 and_masks(causal, attention_sinks(sinks)), "window or sinks": sink_pattern}, q_len=16,
                title="A sliding window with attention sinks"))
expected_sinks, _ = reference_attention(sequence, sequence, sequence, state, num_heads,
                                        mask=dense_mask(sink_pattern, 40, 40))
sink_cache = module.new_cache(batch_size=2, window=window, sinks=sinks)
with torch.no_grad():
    out = torch.cat([module(sequence[:, t:t + 1], cache=sink_cache) for t in range(40)], dim=1)
print(f"sinks + window, one token per call: max |error| = {(out.double() - expected_sinks).abs().max().item():.1e}; "
      f"slots: {sink_cache.keys.shape[2]} (2 sinks + 6), positions held: {sink_cache.positions.tolist()}")
torch.testing.assert_close(out.double(), expected_sinks, atol=2e-5, rtol=1e-4)

# %% [markdown]
# ## Pitfall 4: gradients
#
# A cache is written in place at every call, which autograd cannot differentiate through across
# steps. The module refuses a cache while gradients are on, instead of failing later in `backward`:

# %%
try:
    module(sequence[:, :4], cache=module.new_cache(2, 8))
except ValueError as error:
    print(f"ValueError: {error}")

# %% [markdown]
# A model with rotary embeddings has one more pitfall: a new token rotated at position 0 instead of
# at the cache's length. It is shown failing, then fixed, on the [current models
# page](../models/#pitfall-a-cached-step-rotated-at-position-0), whose layers rotate.
#
# ## Cache memory and K/V heads
#
# The cache holds `2 * H_kv * D` numbers per position and sequence (keys and values): fewer K/V
# heads, a smaller cache, in proportion. At this page's size, for 1,000 positions of 2 sequences
# (real models at their published sizes: [Grouped-query and multi-query
# attention](../gqa/#why-it-matters-the-kv-cache)):

# %%
for label, kv in (("MHA", 8), ("GQA", 2), ("MQA", 1)):
    sized = GroupedQueryAttention(d_model, d_model, 1000, 0.0, num_heads, num_kv_heads=kv)
    cache_bytes = sized.new_cache(2, 1000).nbytes
    assert cache_bytes == 2 * 2 * kv * sized.head_dim * 1000 * 4  # K and V, B = 2, float32
    print(f"{label}: {kv} K/V heads, KVCache.nbytes = {cache_bytes:,}")

# %% [markdown]
# ## Decode speed, measured
#
# A decode step reads the whole cache for one token: with one query head per K/V head (MHA) each
# cached number feeds about two floating-point operations (`2 * group` where a K/V head serves a
# group), so the step waits on memory, not on the matmul rate. SDPA's CPU kernel with
# `enable_gqa=True` streams each K/V head once per query head of its group; the grouped matmuls put
# a K/V head's whole group of queries in one product, so each cached key leaves memory once:

# %% tags=["hide-input"]
show_source(grouped_decode_attention)

# %% [markdown]
# The decode profile times one checked step of a layer of 32 query heads of 128 with 32 (MHA), 4 (GQA)
# and 1 (MQA) K/V heads, through SDPA and the grouped matmuls. Which is faster depends on the CPU, so
# `decode_kernel="auto"` times both on its first step of each shape and keeps the faster for the
# process (`ATTENTION_TUNING=off`: no timing). Tokens per second are for one layer. The recorded run
# (`attention.report.decode`), then what `auto` chose on each machine with a recorded run:

# %%
from attention.report.decode import cache_section, choice_section
from attention.report.long import recorded, recorded_runs

path, decode_run = recorded("decode")  # float32, the newest run
decode_runs = recorded_runs("decode")  # float32, every machine's

# %% tags=["hide-input"]
show_markdown(cache_section(path, decode_run))

# %% tags=["hide-input"]
show_markdown(choice_section(decode_runs))
