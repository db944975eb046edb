# %% [markdown]
# # KV cache and decoding
#
# A language model generates one token at a time, and token `t + 1` attends to the keys and values
# of every token before it. Recomputing them at every step would project the whole prefix again;
# a **KV cache** keeps them, so a step projects only the new token and reads the cache. This page
# builds decoding on `GroupedQueryAttention` (`attention/causal/gqa.py`, the class of
# [Grouped-query and multi-query attention](../gqa/)), with the caches and kernels of `attention/decoding/`: prefill, one token per step, chunks of
# several tokens, then the pitfalls, each shown failing and fixed, then the speed of a step,
# measured. It assumes the [split-heads](../split_heads/) page (the `(B, H, T, D)` layout) and
# the [masks](../masks/) page (predicates, True = attend).
#
# API reference: [`attention.causal.gqa`](../../api/causal/gqa/), [`attention.decoding`](../../api/decoding/).

# %%
import torch
import torch.nn.functional as F

from attention.causal.gqa import GroupedQueryAttention
from attention.decoding import KVCache, SlidingWindowKVCache
from attention.display import show, show_markdown, show_shape, show_table
from attention.masks import and_masks, attention_sinks, causal, dense_mask, or_masks, sliding_window
from attention.plotting import plot_masks
from attention.reference import expand_kv_heads, reference_attention

torch.manual_seed(0)
d_model, num_heads, num_kv_heads = 64, 8, 2
module = GroupedQueryAttention(d_model, d_model, 128, 0.0, num_heads, num_kv_heads=num_kv_heads).eval()
sequence = torch.randn(2, 40, d_model)  # (B, T, C): the tokens a model would feed back one by one
with torch.no_grad():
    full = module(sequence)  # the full causal forward pass: what every decoding step must reproduce
show_shape("sequence", sequence, "(B, T, C)")
show_shape("full = module(sequence)", full, "(B, T, C)")

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
        step = module(sequence[:, t:t + 1], cache=cache)  # one new token per sequence
        outputs.append(step)
        if t < prompt_length + 2:
            show_shape(f"step t={t}: x", sequence[:, t:t + 1], "(B, 1, C)")
            show_shape(f"        output, cache.length = {cache.length}", step, "(B, 1, C)")
decoded = torch.cat(outputs, dim=1)  # (B, T, C)
print(f"max |decoded - full| over all {decoded.shape[1]} positions: {(decoded - full).abs().max().item():.2e}")
torch.testing.assert_close(decoded, full, atol=2e-5, rtol=1e-4)

# %% [markdown]
# Inside one step, with one query per sequence: the queries are `(B, H, 1, D)`, the cached keys and
# values `(B, H_kv, length, D)`, and each group of `H / H_kv` query heads reads one K/V head.

# %%
q = module.query(sequence[:, :1]).view(2, 1, num_heads, -1).transpose(1, 2)  # (B, 1, H*D) -> (B, H, 1, D)
show_shape("q (one new token)", q, "(B, H, 1, D)")
show_shape("cache.keys[:, :, :cache.length]", cache.keys[:, :, :cache.length], "(B, H_kv, S, D)")
show_shape("scores, per query head", torch.empty(2, num_heads, 1, cache.length), "(B, H, 1, S)")

# %% [markdown]
# ## Chunked prefill
#
# A long prompt can go in chunks (to bound the memory of one call, or to interleave prompts with
# other sequences' decode steps). A chunk of 5 queries after `L` cached positions sits at positions
# `L .. L + 4`: query `i` of the chunk attends to keys `0 .. L + i`. `KVCache.update` returns that
# mask, `(T, L + T)`, and the module gives it to the kernel.

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
# The wrong mask, run on real keys and values from a cache, against the full forward pass:

# %%
with torch.no_grad():
    pitfall_cache = module.new_cache(batch_size=2, capacity=64)
    module(sequence[:, :L], cache=pitfall_cache)  # 10 positions cached
    x_chunk = sequence[:, L:L + T_chunk]
    B, H, H_kv, D = 2, num_heads, num_kv_heads, module.head_dim
    q = module.query(x_chunk).view(B, T_chunk, H, D).transpose(1, 2)  # (B, H, 5, D)
    k = module.key(x_chunk).view(B, T_chunk, H_kv, D).transpose(1, 2)  # (B, H_kv, 5, D)
    v = module.value(x_chunk).view(B, T_chunk, H_kv, D).transpose(1, 2)
    keys, values, mask = pitfall_cache.update(k, v)  # (B, H_kv, 15, D) each, mask (5, 15)
    show_shape("q", q, "(B, H, T, D)")
    show_shape("keys (cache after the chunk)", keys, "(B, H_kv, S, D)")
    show_shape("mask from KVCache.update", mask, "(T, S)")

    def finish(context):  # (B, H, T, D) -> the module's output (B, T, C)
        return module.out(context.transpose(1, 2).reshape(B, T_chunk, d_model))

    wrong = finish(F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True))
    right = finish(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True))
expected = full[:, L:L + T_chunk]
wrong_error, right_error = (wrong - expected).abs().max().item(), (right - expected).abs().max().item()

# %% tags=["hide-input"]
show_table("5 queries after 10 cached positions, against the full forward pass", ["mask", "max |error|"],
           [("is_causal=True (top left)", f"{wrong_error:.3f}"), ("lower-right mask (KVCache.update)", f"{right_error:.1e}")])
assert wrong_error > 1e-2 and right_error < 1e-4
torch.testing.assert_close(mask, lower_right)

# %% [markdown]
# PyTorch also ships the lower-right variant as a mask object,
# `torch.nn.attention.bias.causal_lower_right(T, S)`, which SDPA accepts in place of a tensor:

# %%
from torch.nn.attention.bias import causal_lower_right

with torch.no_grad():
    q_repeated = q  # the bias object takes K/V with the queries' head count
    keys_repeated = keys.repeat_interleave(H // H_kv, dim=1)  # (B, H, S, D)
    values_repeated = values.repeat_interleave(H // H_kv, dim=1)
    via_bias = finish(F.scaled_dot_product_attention(q_repeated, keys_repeated, values_repeated,
                                                     attn_mask=causal_lower_right(T_chunk, L + T_chunk)))
print(f"causal_lower_right: max |error| = {(via_bias - expected).abs().max().item():.1e}")
torch.testing.assert_close(via_bias, expected, atol=2e-5, rtol=1e-4)

# %% [markdown]
# One query is the extreme case: with `is_causal=True` a single new token would attend to key 0
# only, since the top-left mask of a `(1, S)` score row keeps its first entry. That is why the
# module passes no mask at all for one query (it attends to every cached key) and `is_causal=False`
# whenever a cache is in play.

# %%
with torch.no_grad():
    one_cache = module.new_cache(batch_size=2, capacity=64)
    module(sequence[:, :20], cache=one_cache)
    x_one = sequence[:, 20:21]
    q1 = module.query(x_one).view(B, 1, H, D).transpose(1, 2)  # (B, H, 1, D)
    k1 = module.key(x_one).view(B, 1, H_kv, D).transpose(1, 2)
    v1 = module.value(x_one).view(B, 1, H_kv, D).transpose(1, 2)
    keys1, values1, mask1 = one_cache.update(k1, v1)  # mask1 is None: one query sees every key
    one_wrong = module.out(F.scaled_dot_product_attention(q1, keys1, values1, is_causal=True, enable_gqa=True)
                           .transpose(1, 2).reshape(B, 1, d_model))
print(f"mask for one query: {mask1}; is_causal=True for one query: max |error| = "
      f"{(one_wrong - full[:, 20:21]).abs().max().item():.3f}")

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
# A full cache grows with the sequence. Models trained with a sliding window (Mistral 7B's 4,096
# keys; [sliding_window](../masks/) on the masks page) only ever attend to the last `w` positions,
# so their cache can be a **ring buffer** of `w` slots: position `p` goes to slot `p mod w`,
# overwriting the position that just left the window. `new_cache(batch_size, window=w)` makes one.
# Which position each slot holds, step by step (window 6, 14 tokens):

# %%
window = 6
ring = module.new_cache(batch_size=1, window=window)
slot_history = []
with torch.no_grad():
    for t in range(14):
        module(sequence[:1, t:t + 1], cache=ring)
        slot_history.append(ring.positions.tolist())

# %% tags=["hide-input"]
show_table("Slot contents after each step (sliding window of 6, no sinks; -1 = empty)",
           ["after token"] + [f"slot {slot}" for slot in range(window)],
           [(t, *slots) for t, slots in enumerate(slot_history)])

# %% [markdown]
# Its memory stays the same however long the sequence, where a full cache grows with it:

# %%
rows = []
for length in (8, 16, 32, 40):
    bounded = module.new_cache(batch_size=2, window=window)
    with torch.no_grad():
        for start in range(0, length, 8):
            module(sequence[:, start:start + 8], cache=bounded)
    rows.append((length, bounded.length, f"{bounded.nbytes:,}", f"{module.new_cache(2, length).nbytes:,}"))

# %% tags=["hide-input"]
show_table("Bytes held after `length` tokens", ["tokens", "cache.length", "sliding window (6)", "full cache"], rows)

# %% [markdown]
# Its outputs equal the full forward pass under the `sliding_window(6)` mask, one token at a time
# and in chunks (a chunk's early queries still need keys its later positions would evict, so a
# chunk attends over the ring and its own keys before it is written):

# %%
state = expand_kv_heads(module.canonical_state_dict(), num_heads)  # K/V heads repeated: a multi-head state
window_mask = dense_mask(sliding_window(window), 40, 40)  # (T, T), True = attend
expected_window, _ = reference_attention(sequence, sequence, sequence, state, num_heads, mask=window_mask)
rows = []
for chunk in (1, 5, 13):
    ring = module.new_cache(batch_size=2, window=window)
    with torch.no_grad():
        out = torch.cat([module(sequence[:, s:s + chunk], cache=ring) for s in range(0, 40, chunk)], dim=1)
    error = (out.double() - expected_window).abs().max().item()
    rows.append((chunk, f"{error:.1e}"))
    assert error < 1e-4

# %% tags=["hide-input"]
show_table("Sliding-window cache against the float64 reference with the sliding_window(6) mask",
           ["tokens per call", "max |error|"], rows)

# %% [markdown]
# **Attention sinks.** Dropping the first tokens hurts: models put a large share of attention on
# them whatever they say, and a window that has moved past them degrades generation. StreamingLLM
# (Xiao et al., 2023, <https://arxiv.org/abs/2309.17453>) keeps the first `s` tokens (the sinks)
# for good, plus the window: `new_cache(batch_size, window=w, sinks=s)`. The matching mask, built
# from `attention.masks` combinators:

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
# ## Cache memory and K/V heads
#
# The cache holds `2 * H_kv * D` numbers per position and sequence (keys and values): fewer K/V
# heads, a smaller cache, in proportion. At this page's size, for 1,000 positions of 2 sequences:

# %%
rows = []
for label, kv in (("MHA", 8), ("GQA", 2), ("MQA", 1)):
    sized = GroupedQueryAttention(d_model, d_model, 1000, 0.0, num_heads, num_kv_heads=kv)
    cache_bytes = sized.new_cache(2, 1000).nbytes
    assert cache_bytes == 2 * 2 * kv * sized.head_dim * 1000 * 4  # K and V, B = 2, float32
    rows.append((label, kv, f"{cache_bytes:,}"))

# %% tags=["hide-input"]
show_table("KVCache.nbytes, B = 2, 1,000 positions, 8 query heads of 8, float32", ["model", "K/V heads", "bytes"], rows)
show_markdown("For real models (Llama, Mistral, Qwen, Gemma) at their published sizes: "
              "[Grouped-query and multi-query attention](../gqa/#why-it-matters-the-kv-cache).")

# %% [markdown]
# ## Decode speed, measured
#
# A decode step projects one token, then reads the whole cache to attend over it. With one query
# head per K/V head (MHA), every cached number it reads feeds about two floating-point operations,
# far fewer than a device can do in the time it takes to read the number: the step waits on memory,
# and its ceiling is the rate at which the device reads memory, not its matmul rate. Where a K/V
# head serves a group of query heads, each number feeds `2 * group` operations, and arithmetic can
# become the limit instead. The benchmark's decode profile measures both, on any device:
#
# ```bash
# python -m attention.bench --profile decode --out docs/results/decode/cpu-decode-float32.json
# ```
#
# It times one step of one attention layer at a Llama-like size (32 query heads of 128) with
# 32 (MHA), 4 (GQA, 8 query heads per K/V head) and 1 (MQA) K/V heads, batch 1 and 8, over
# caches of 1,024 to 32,768 positions, each step checked against a float64 reference. Beside
# each row, a sum over 512 MiB gives the read bandwidth of the same moment; at the start and after
# each model, a read and a copy over three sizes past the last-level cache give the run's ceiling,
# its best rate, which the shares below are against (the note under the charts states it). Tokens per second are
# for this one layer: a model's step runs every layer (and its MLPs), so divide accordingly. (The
# profile also steps current open models' layers and multi-head latent attention; their pages show
# those rows.) The recorded run:

# %% tags=["hide-input"]
from attention import report

GROUPED = ["MHA", "GQA", "MQA"]  # the profile's other rows (model families' layers, MLA) are on their own pages
decode_runs = {path: report.load_result(path) for path in report.find_results(report.RESULTS_DIR / "decode")}
decode_path = next((path for path, run in decode_runs.items() if run["dtype"] == "float32"), next(iter(decode_runs)))
decode_result = decode_runs[decode_path]  # the newest float32 run (a bfloat16 one: below)
show_markdown(f"`docs/results/decode/{decode_path.name}`: {decode_result['provenance']['device']['name']}, "
              f"{decode_result['dtype']}, recorded {decode_result['provenance']['date_utc'][:10]}"
              + (" (the code has changed since)" if report.is_stale(decode_result) else "") + ".")
share = report.shown_share(decode_result)  # against the run's peak bandwidth (older runs: the read beside each row)
show_markdown("**One decode step of one attention layer, per batch size, model and cache length: the fastest "
              f"kernel's tokens per second, its share of {report.share_words(decode_result)}, and which kernel "
              "that was (`matmul`: the grouped matmuls; `sdpa`: SDPA)**\n\n"
              + report.decode_summary_table(decode_result, contexts=[1024, 8192, 16384, 32768], models=GROUPED))
show(report.plot_decode(decode_result, "tokens_per_s", models=GROUPED))
show(report.plot_decode(decode_result, share, models=GROUPED))
show_markdown(report.bandwidth_note(decode_result))

# %% [markdown]
# What the run says, read from its rows:

# %% tags=["hide-input"]
def best(model, batch, context):
    return report.decode_best(decode_result, model, batch, context)


def row_of(model, kernel, batch, context):
    rows = report.decode_rows(decode_result, batch=batch, model=model, kernel=kernel, context=context)
    return rows[0] if rows else None


lines = []
context = 16384
fastest = max((best(model, 1, context) for model in ("MHA", "GQA", "MQA")), key=lambda row: row["tokens_per_s"])
lines.append(f"- At a {context:,}-position context and batch 1, the fastest step is {fastest['model']}'s with the "
             f"`{fastest['kernel']}` kernel: {fastest['tokens_per_s']:,.0f} tokens/s, reading "
             f"{fastest['gbps']:.1f} GB/s, {fastest[share]:.0%} of {report.share_words(decode_result)}"
             + (f" ({fastest['share_of_paired_bandwidth']:.0%} of the read timed beside it)."
                if share == "share_of_peak_bandwidth" else "."))
mha, gqa, mqa = (best(model, 1, context) for model in ("MHA", "GQA", "MQA"))
lines.append(f"- GQA reads {mha['cache_bytes_per_token'] // gqa['cache_bytes_per_token']}x less cache per token than "
             f"MHA and runs {gqa['tokens_per_s'] / mha['tokens_per_s']:.1f}x as many tokens/s; MQA "
             f"{mha['cache_bytes_per_token'] // mqa['cache_bytes_per_token']}x less and "
             f"{mqa['tokens_per_s'] / mha['tokens_per_s']:.1f}x: the query and output projections' weights, read at every "
             f"step too, do not shrink.")
for model in ("GQA", "MQA"):
    sdpa, matmul = row_of(model, "sdpa", 1, context), row_of(model, "matmul", 1, context)
    if sdpa and matmul:
        lines.append(f"- {model} through SDPA: {sdpa['tokens_per_s']:,.0f} tokens/s "
                     f"({sdpa[share]:.0%} of the bandwidth); through the grouped matmuls: "
                     f"{matmul['tokens_per_s']:,.0f} ({matmul[share]:.0%}).")
gains = [f"{model} {best(model, 8, context)['tokens_per_s'] / best(model, 1, context)['tokens_per_s']:.1f}x"
         for model in ("MHA", "GQA", "MQA") if best(model, 1, context) and best(model, 8, context)]
if gains:
    lines.append(f"- Batch 8 against batch 1, tokens/s over all sequences: {', '.join(gains)}. The weights are read "
                 f"once for 8 tokens, but each sequence's cache is its own.")
show_markdown("\n".join(lines))

# %% [markdown]
# ### A bfloat16 cache
#
# A bfloat16 cache holds half the bytes of a float32 one, and so do the weights: a step that only
# waited on memory would take half the time. Whether it does depends on the device's bfloat16
# matmuls, which on a CPU differ from one instruction set to the next (the device's identity names
# them: AVX-512 BF16, AMX). One detail matters on the CPU: a cache's keys and values are a slice of
# its buffer, each head's block `capacity` rows from the next, and PyTorch's batched bfloat16 matmul
# did not take such a batch as it lies on the CPU it was measured on (an AMD EPYC with AVX-512 BF16:
# it copied the slice and ran several times slower), so in bfloat16 the grouped kernel runs one 2-D
# matmul per K/V head (`per_head_matmul`). The decode profile in bfloat16
# (`--dtype bfloat16`) against the float32 run above, where both are recorded on the same device:

# %% tags=["hide-input"]
bf16_path = next((path for path, run in decode_runs.items() if run["dtype"] == "bfloat16"
                  and report.device_label(run["provenance"]["device"]) == report.device_label(
                      decode_result["provenance"]["device"])), None)
if bf16_path is None:
    show_markdown(f"**Not recorded yet** for {report.device_label(decode_result['provenance']['device'])}: "
                  "`python -m attention.bench --profile decode --dtype bfloat16 --out "
                  "docs/results/decode/<device>-bfloat16-decode.json` records it.")
else:
    bf16_result = decode_runs[bf16_path]
    bf16_share = report.shown_share(bf16_result)
    show_markdown(f"`docs/results/decode/{bf16_path.name}`: {report.run_line(bf16_result)}")
    cells, speedups, slower_reads = [], {}, []
    for batch in (1, 8):
        for model in GROUPED:
            f32, bf16 = best(model, batch, context), report.decode_best(bf16_result, model, batch, context)
            if f32 and bf16:
                speedups[model, batch] = bf16["tokens_per_s"] / f32["tokens_per_s"]
                slower_reads += [f"{model} batch {batch}"] if bf16["gbps"] < f32["gbps"] else []
                cells.append([batch, model, f"{f32['tokens_per_s']:,.1f} (`{f32['kernel']}`)",
                              f"{bf16['tokens_per_s']:,.1f} (`{bf16['kernel']}`)", f"{speedups[model, batch]:.2f}x",
                              f"{f32['bytes_read'] / bf16['bytes_read']:.2f}x", f"{bf16['gbps']:.1f}",
                              f"{bf16[bf16_share]:.0%}"])
    show_markdown(f"**One decode step at {context:,} cached positions, the fastest kernel of each run: tokens per "
                  "second in float32 and in bfloat16, the bfloat16 step's speed-up, how many times fewer bytes it "
                  f"reads, and its read rate and share of {report.share_words(bf16_result)} (its own run's)**\n\n"
                  + report.table(["Batch", "Model", "float32 tok/s", "bfloat16 tok/s", "bf16 speed-up",
                                  "fewer bytes", "bf16 GB/s", "bf16 share"], cells, "rlrrrrrr"))
    if speedups:
        best_pair, worst_pair = max(speedups, key=speedups.get), min(speedups, key=speedups.get)
        show_markdown(f"Halving the bytes gave between {speedups[worst_pair]:.2f}x ({worst_pair[0]}, batch "
                      f"{worst_pair[1]}) and {speedups[best_pair]:.2f}x ({best_pair[0]}, batch {best_pair[1]}) the "
                      "float32 tokens per second. " + (
                          f"The bfloat16 step read fewer GB/s than the float32 one in {len(slower_reads)} of "
                          f"{len(speedups)} cases ({', '.join(slower_reads)}): there the memory, which delivered more "
                          "to the float32 step, did not set its pace, the bfloat16 arithmetic did (unless the "
                          "machine's bandwidth moved between the two runs: compare their ceilings). "
                          if slower_reads else "The bfloat16 step read at least as many GB/s as the float32 one in "
                          "every case. ") + report.bandwidth_note(bf16_result))

# %% [markdown]
# ## What limits a step on this build's CPU
#
# Three measurements, made while this page was built, on the machine that built it: they move with
# that machine and its load, and every sentence about them below is written from the numbers (the
# recorded run above is the reference). First, the attention alone: one query per head over an
# 8,192-position cache, batch 1, 32 query heads of 128. Three kernels: SDPA with
# `enable_gqa=True`; SDPA over K/V heads repeated to 32 beforehand (an MHA-sized read, the copy not
# timed); and the grouped matmuls of `grouped_decode_attention`. GB/s counts the bytes of the cache
# the step must read (the compact one); GFLOP/s counts `4 * H * S * D`, the same for all. A GQA or
# MQA cache of 32 or 8 MiB would stay in the CPU's last-level cache if one step ran over it again
# and again, unlike a real step, whose weights pass in between; so each timed call reads the next of
# several copies, at least 256 MiB in all, and the bytes come from memory.

# %% tags=["hide-input"]
import itertools

import torch.nn.functional as F

from attention.report import prose
from attention.bench import metrics
from attention.decoding import grouped_decode_attention, row_split_linear

cpu = torch.device("cpu")
read_call, read_bytes = metrics.bandwidth_call(cpu, torch.float32)
matmul_tflops = metrics.matmul_rate(cpu, torch.float32, 2048, min_run_time=0.3)["tflops"]


FOOTPRINT = 256 * 2**20  # bytes the copies of a timed call's data fill, far past the CPU's caches


def copies_to_fill(nbytes):
    """How many copies of `nbytes` fill `FOOTPRINT`."""
    return max(1, -(-FOOTPRINT // nbytes))


def gbps(call, nbytes):
    """Bytes read per second of `call`, with the read bandwidth measured in blocks beside it (both GB/s)."""
    timing = metrics.time_callable(call, cpu, metrics.Timing(0.3, 5, 0.05), paired=read_call)
    return (nbytes / (timing["ms_median"] * 1e-3) / 1e9, read_bytes / (timing["paired_ms_median"] * 1e-3) / 1e9,
            timing["ms_median"])


generator = torch.Generator().manual_seed(0)
rows, times, shares = [], {}, {}
context_length, flops = 8192, 4 * 32 * 8192 * 128
for name, kv_heads in (("MHA", 32), ("GQA", 4), ("MQA", 1)):
    q = torch.randn(1, 32, 1, 128, generator=generator)
    cache_bytes = 2 * kv_heads * context_length * 128 * 4  # K and V, float32

    def cache_copy(heads):
        """A fresh cache, K and V (1, heads, S, D) each: `kv_heads` heads, each repeated `heads // kv_heads` times."""
        return [torch.randn(1, kv_heads, context_length, 128, generator=generator)
                .repeat_interleave(heads // kv_heads, dim=1) for _ in range(2)]

    kernels = {  # name: (K/V heads it reads, the call over one cache copy)
        "SDPA, enable_gqa": (kv_heads, lambda k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=kv_heads != 32)),
        "SDPA, K/V repeated to 32 heads": (32, lambda k, v: F.scaled_dot_product_attention(q, k, v)),
        "grouped matmuls": (kv_heads, lambda k, v: grouped_decode_attention(q, k, v)),
    }
    k, v = cache_copy(kv_heads)
    torch.testing.assert_close(kernels["grouped matmuls"][1](k, v), kernels["SDPA, enable_gqa"][1](k, v),
                               atol=1e-5, rtol=1e-4)
    for kernel, (heads, attend) in kernels.items():
        # Each call reads the next copy, so the bytes come from memory (FOOTPRINT in all).
        copies = itertools.cycle([cache_copy(heads) for _ in range(copies_to_fill(cache_bytes * heads // kv_heads))])
        rate, bandwidth, ms = gbps(lambda copies=copies, attend=attend: attend(*next(copies)), cache_bytes)
        del copies
        times[name, kernel] = ms
        shares[name, kernel] = (rate / bandwidth, flops / ms / 1e9 / matmul_tflops)  # of the bandwidth, of the matmul rate
        rows.append((name, kernel, f"{cache_bytes / 2**20:,.0f} MiB", f"{ms:.2f}", f"{rate:.1f}",
                     f"{rate / bandwidth:.0%}", f"{flops / ms / 1e6:.0f}", f"{flops / ms / 1e9 / matmul_tflops:.0%}"))
show_table("Attention over an 8,192-position float32 cache, batch 1, 32 query heads (measured at build time)",
           ["model", "kernel", "cache to read", "ms", "GB/s", "% of read bandwidth", "GFLOP/s", "% of matmul rate"],
           rows)
sdpa, grouped = "SDPA, enable_gqa", "grouped matmuls"
show_markdown(
    "GQA's cache is 8x smaller than MHA's and MQA's 32x. "
    + prose.cache_shrink_sentence(times, [sdpa, grouped]) + " "
    + prose.decode_kernels_sentence(times, list(kernels)) + " "
    + " ".join(prose.decode_limit_sentence(model, "the grouped matmuls", *shares[model, grouped]) for model in ("GQA", "MQA"))
    + f" The large-matmul rate of this build's machine: {matmul_tflops * 1e3:.0f} GFLOP/s. "
    + prose.bandwidth_share_note([share for share, _ in shares.values()]))

# %% [markdown]
# What the kernels do differently is in their code, whatever the machine. SDPA's CPU kernel
# (`aten::_scaled_dot_product_flash_attention_for_cpu`) splits its work over batch, query heads and
# blocks of queries, and each piece streams all the keys and values of its K/V head. With
# `enable_gqa=True` it maps query head `h` to K/V head `h // group` without a copy, but it still
# streams that K/V head once per query head, `group` times in all: what it saves is the copy, not
# the reading (where a K/V head fits in the CPU's caches, the repeats come from there). The grouped
# matmuls put a K/V head's whole group of queries in one product, `k @ qᵀ` of
# `(S, D) @ (D, group)`, so each cached key leaves memory once for all the queries that need it.
# Then the arithmetic per byte grows with the group: a step's FLOPs do not shrink with the K/V
# heads, only its bytes do, and a product only `group` columns wide runs below the large-matmul
# rate. The shares above say which limit each step came nearer on this machine.
#
# Second, the projections. At batch 1 each of the four projections is a matrix-vector product:
# every weight read once for two operations, bound by memory like the cache. Some CPU BLAS builds
# run a matrix-vector product on one thread, so that it reads memory at one core's rate;
# `row_split_linear` splits the weight's rows into 8 blocks and runs them as one batched product,
# which `torch.bmm` spreads over every thread. Whether this machine's BLAS needs that: one 4096 x
# 4096 float32 weight, on all threads and on one (each call takes the next of 4 such layers, 256 MiB
# in all, so that the weights come from memory, as in a model):

# %% tags=["hide-input"]
layers = [torch.nn.Linear(4096, 4096).requires_grad_(False) for _ in range(copies_to_fill(4096 * 4096 * 4))]  # 64 MiB each
x_row = torch.randn(1, 1, 4096, generator=generator)
weight_bytes = layers[0].weight.nbytes + layers[0].bias.nbytes
torch.testing.assert_close(row_split_linear(layers[0], x_row), layers[0](x_row), atol=1e-4, rtol=1e-4)
layer_cycle = itertools.cycle(layers)  # each call takes the next layer, so its weight comes from memory
threads = torch.get_num_threads()
rows, projection_ms, projection_shares = [], {}, []
for label, call, thread_count in (("F.linear", lambda: next(layer_cycle)(x_row), threads),
                                  ("F.linear", lambda: next(layer_cycle)(x_row), 1),
                                  ("row_split_linear (8 blocks, torch.bmm)",
                                   lambda: row_split_linear(next(layer_cycle), x_row), threads)):
    torch.set_num_threads(thread_count)
    rate, bandwidth, ms = gbps(call, weight_bytes)
    projection_ms[label.split()[0], thread_count] = ms
    projection_shares.append(rate / bandwidth)
    rows.append((label, thread_count, f"{ms:.2f}", f"{rate:.1f}", f"{rate / bandwidth:.0%}"))
torch.set_num_threads(threads)
show_table("One row through a 4096 x 4096 float32 projection (measured at build time); the bandwidth is measured "
           "with the same thread count", ["kernel", "torch threads", "ms", "GB/s", "% of read bandwidth"], rows)
show_markdown(" ".join(part for part in (
    prose.linear_threads_sentence(projection_ms["F.linear", threads], projection_ms["F.linear", 1], threads),
    prose.row_split_sentence(projection_ms["row_split_linear", threads], projection_ms["F.linear", threads], threads),
    prose.bandwidth_share_note(projection_shares)) if part))

# %% [markdown]
# Third, a trap met on the way: `torch.bmm` over the same blocks, with the input column given as a
# `(8, in, 1)` tensor of strides `(0, 1, 1)` instead of the transposed row's `(0, 1, in)`, computes
# the same numbers through a different BLAS call (which one depends on the strides), and on some
# machines at a very different speed:

# %% tags=["hide-input"]
all_blocks = [layer.weight.view(8, 512, 4096) for layer in layers]  # (chunks, out/chunks, in) per layer
blocks, block_cycle = all_blocks[0], itertools.cycle(all_blocks)
column_from_reshape = x_row.reshape(1, 4096, 1).expand(8, 4096, 1)  # strides (0, 1, 1)
column_from_transpose = x_row.reshape(1, 4096).T.unsqueeze(0).expand(8, 4096, 1)  # strides (0, 1, 4096)
torch.testing.assert_close(torch.bmm(blocks, column_from_reshape), torch.bmm(blocks, column_from_transpose))
rows, layout_ms, layout_shares = [], {}, []
for label, column in (("reshape, then expand", column_from_reshape), ("transpose the row, then expand", column_from_transpose)):
    rate, bandwidth, ms = gbps(lambda: torch.bmm(next(block_cycle), column), blocks.nbytes)
    layout_ms[label] = ms
    layout_shares.append(rate / bandwidth)
    rows.append((label, str(column.stride()), f"{ms:.2f}", f"{rate:.1f}", f"{rate / bandwidth:.0%}"))
show_table("torch.bmm of the 8 weight blocks with one input column, two layouts of the same column "
           "(measured at build time)", ["column made by", "strides", "ms", "GB/s", "% of read bandwidth"], rows)
show_markdown(" ".join(part for part in (
    prose.same_numbers_sentence("reshape", layout_ms["reshape, then expand"], "transpose",
                                layout_ms["transpose the row, then expand"]),
    prose.bandwidth_share_note(layout_shares)) if part))

# %% [markdown]
# So the `matmul` decode kernel (`decode_kernel="matmul"`; `"auto"` picks it on CPU for calls of
# at most `AUTO_MATMUL_MAX_TOKENS` new tokens) is those two changes: the grouped matmuls for the
# attention and, for a single token, the row-split projections. At batch 8 the projections are
# products of 8 rows, which `row_split_linear` leaves to the BLAS as they are. The recorded run
# above shows what each kernel gives at every context and batch size on the machine that recorded
# it; the measurements on this page say whether each change pays on the machine that built it.
