# %% [markdown]
# # Grouped-query and multi-query attention
#
# Multi-head attention gives each of its `H` query heads its own key and value head. Multi-query
# attention (MQA; Shazeer, 2019, <https://arxiv.org/abs/1911.02150>) gives all of them one shared
# key and value head; grouped-query attention (GQA; Ainslie et al., 2023,
# <https://arxiv.org/abs/2305.13245>) sits between: `H_kv` key/value heads, each shared by a group
# of `H / H_kv` consecutive query heads. Llama 2 70B, Llama 3, Mistral, Qwen2 and Gemma 2 run GQA;
# Falcon 7B and PaLM ran MQA. What shrinks is the key and value projections and, above all, the
# KV cache that every decoding step reads ([KV cache and decoding](../kv_cache/)).
#
# This page assumes the [split-heads](../split_heads/) page (the `(B, H, T, D)` layout) and the
# [SDPA](../sdpa/) page. The glossary entry: [KV heads](../../glossary/#kv-heads). API reference:
# [`attention.causal.gqa`](../../api/causal/gqa/), [`attention.causal.gqa_flex`](../../api/causal/gqa_flex/).

# %%
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

import attention
from attention.causal.gqa import GroupedQueryAttention, MultiQueryAttention
from attention.causal.gqa_flex import GroupedQueryFlexAttention
from attention.decoding import KVCache
from attention.display import show, show_markdown, show_shape, show_source, show_table
from attention.reference import expand_kv_heads, reference_causal_self_attention

# %% [markdown]
# ## Step by step
#
# Eight query heads, two key/value heads: groups of four. The queries are projected to `H * D`
# features as usual, the keys and values to only `H_kv * D`.

# %%
torch.manual_seed(0)
B, T, d_model, H, H_kv = 2, 6, 64, 8, 2
D, group = d_model // H, H // H_kv
module = GroupedQueryAttention(d_model, d_model, 256, 0.0, H, num_kv_heads=H_kv).eval()
x = torch.randn(B, T, d_model)
with torch.no_grad():
    q = module.query(x).view(B, T, H, D).transpose(1, 2)  # (B, T, H*D) -> (B, H, T, D)
    k = module.key(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, T, H_kv*D) -> (B, H_kv, T, D)
    v = module.value(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
show_shape("x", x, "(B, T, C)")
show_shape("module.query(x)", module.query(x), "(B, T, H*D)")
show_shape("module.key(x)", module.key(x), "(B, T, H_kv*D)")
show_shape("q = ...view(B, T, H, D).transpose(1, 2)", q, "(B, H, T, D)")
show_shape("k = ...view(B, T, H_kv, D).transpose(1, 2)", k, "(B, H_kv, T, D)")
show_shape("v", v, "(B, H_kv, T, D)")

# %% [markdown]
# Query head `h` reads key/value head `h // group`, consecutive query heads sharing one:

# %% tags=["hide-input"]
fig = Figure(figsize=(4.2, 3.2), layout="constrained")
ax = fig.add_subplot()
mapping = torch.zeros(H, H_kv)
mapping[torch.arange(H), torch.arange(H) // group] = 1
ax.imshow(mapping, cmap="Blues", aspect="auto")
ax.set_xticks(range(H_kv), [f"K/V {g}" for g in range(H_kv)])
ax.set_yticks(range(H), [f"query {h}" for h in range(H)])
ax.set_title(f"Which K/V head each query head reads (H = {H}, H_kv = {H_kv})")
show(fig)

# %% [markdown]
# The plainest way to compute it: repeat each K/V head `group` times, which gives an ordinary
# multi-head `(B, H, T, D)` key and value, then attend as usual.

# %%
with torch.no_grad():
    k_repeated = k.repeat_interleave(group, dim=1)  # (B, H_kv, T, D) -> (B, H, T, D): head h is K/V head h // group
    v_repeated = v.repeat_interleave(group, dim=1)  # (B, H, T, D)
    context_repeat = F.scaled_dot_product_attention(q, k_repeated, v_repeated, is_causal=True)  # (B, H, T, D)
    # SDPA can map the heads itself, without the copy:
    context_gqa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B, H, T, D)
    out = module.out(context_gqa.transpose(1, 2).reshape(B, T, d_model))  # (B, H, T, D) -> (B, T, H*D) -> (B, T, C)
show_shape("k.repeat_interleave(group, dim=1)", k_repeated, "(B, H, T, D)")
show_shape("SDPA(q, k, v, enable_gqa=True)", context_gqa, "(B, H, T, D)")
show_shape("out", out, "(B, T, C)")
print(f"repeat then SDPA against enable_gqa=True: max |difference| = {(context_repeat - context_gqa).abs().max().item():.1e}")

# %% [markdown]
# That is the module's `forward`: the same lines, with a cache's keys and values in place of `k` and
# `v` when it decodes ([KV cache and decoding](../kv_cache/) explains the cache and the grouped
# matmuls), and `kv_strategy="repeat"` for the copy:

# %% tags=["hide-input"]
show_source(GroupedQueryAttention.forward)

# %% [markdown]
# Against the float64 reference, which expands the shared K/V weights to one head per query head
# (`attention.reference.expand_kv_heads`) and then runs ordinary multi-head attention:

# %%
reference, _ = reference_causal_self_attention(x, module.canonical_state_dict(), H)
with torch.no_grad():
    module_out = module(x)
print(f"module against the float64 reference: max |error| = {(module_out.double() - reference).abs().max().item():.1e}")
torch.testing.assert_close(module_out.double(), reference, atol=2e-5, rtol=1e-4)

# %% [markdown]
# ## The weights: MHA, GQA and MQA
#
# The canonical state dict keeps the family's names; only `key.*` and `value.*` shrink, to
# `H_kv * D` rows. At GPT-2 small's width (768, 12 heads of 64):

# %%
rows = []
for label, cls, kwargs in (("MHA", attention.IMPLEMENTATIONS["split_heads"], {}),
                           ("GQA (num_kv_heads=3)", GroupedQueryAttention, {"num_kv_heads": 3}),
                           ("MQA", MultiQueryAttention, {})):
    sized = cls(768, 768, 1024, 0.0, 12, **kwargs)
    state = sized.canonical_state_dict()
    parameters = sum(tensor.numel() for tensor in state.values())
    rows.append((label, tuple(state["query.weight"].shape), tuple(state["key.weight"].shape),
                 tuple(state["value.weight"].shape), f"{parameters:,}"))

# %% tags=["hide-input"]
show_table("Canonical state dict shapes, d_model 768, 12 query heads", ["model", "query.weight", "key.weight",
           "value.weight", "parameters"], rows)

# %% [markdown]
# GQA is multi-head attention whose key/value heads come in identical groups: repeat each K/V
# head's rows `group` times and a multi-head class computes exactly the same function. (The GQA
# paper turns a trained MHA model into GQA the other way, by mean-pooling each group's heads and
# training a little more.)

# %%
mha = attention.IMPLEMENTATIONS["split_heads"](d_model, d_model, 256, 0.0, H).eval()
mha.load_canonical_state_dict(expand_kv_heads(module.canonical_state_dict(), H))
with torch.no_grad():
    difference = (mha(x) - module(x)).abs().max().item()
print(f"split_heads with the K/V rows repeated, against the GQA module: max |difference| = {difference:.1e}")

# %% [markdown]
# ## Which kernel runs
#
# `kv_strategy="enable_gqa"` (the default) passes the smaller K/V to SDPA with `enable_gqa=True`;
# `kv_strategy="repeat"` copies them to `H` heads first, for backends without GQA support. The same
# output, and the same fused SDPA kernel, as PyTorch's profiler sees it run:

# %%
import os

from torch.profiler import profile

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # before the profiler's first use: its backend would print each call

def sdpa_kernels(call):
    """The SDPA kernels (`aten::_scaled_dot_product_*` operators) the profiler saw `call()` run."""
    with profile() as trace:
        call()
    return sorted({event.name for event in trace.events() if event.name.startswith("aten::_scaled_dot_product")})


x_long = torch.randn(1, 256, d_model)
for strategy in ("enable_gqa", "repeat"):
    variant = GroupedQueryAttention(d_model, d_model, 256, 0.0, H, num_kv_heads=H_kv, kv_strategy=strategy).eval()
    variant.load_canonical_state_dict(module.canonical_state_dict())
    with torch.no_grad():
        difference = (variant(x_long) - module(x_long)).abs().max().item()
        print(f"kv_strategy={strategy!r}: {', '.join(sdpa_kernels(lambda: variant(x_long)))}; "
              f"max |difference| {difference:.1e}")
copy_bytes = 2 * (H - H_kv) * 256 * D * 4  # K and V: (H - H_kv) more heads of T x D, float32, B = 1
llama3_bytes = 2 * (32 - 8) * 4096 * 128 * 2  # Llama 3 8B: 32 query heads, 8 K/V heads of 128, 4,096 tokens, bf16
print(f"the repeat's copy: {copy_bytes:,} bytes here; {llama3_bytes / 2**20:,.0f} MiB per sequence for one layer of "
      "Llama 3 8B at 4,096 tokens in bfloat16")

# %% [markdown]
# The repeat allocates `(H - H_kv) * T * D` more numbers for K and for V, written and read again at
# every call.

# %% [markdown]
# ## FlexAttention
#
# `GroupedQueryFlexAttention` (`gqa_flex`) passes `enable_gqa=True` to FlexAttention, whose
# compiled kernel maps the heads in the same way. Same weights, same function:

# %%
flex = GroupedQueryFlexAttention(d_model, d_model, 256, 0.0, H, num_kv_heads=H_kv).eval()
flex.load_canonical_state_dict(module.canonical_state_dict())
with torch.no_grad():
    flex_difference = (flex(x_long) - module(x_long)).abs().max().item()
print(f"gqa_flex against gqa: max |difference| = {flex_difference:.1e}")

# %% [markdown]
# ## Why it matters: the KV cache
#
# Decoding keeps every earlier token's keys and values: `2 * layers * H_kv * D` numbers per token
# and sequence. The sizes of a few released models, from their published configurations (the
# `config.json` of each model's Hugging Face repository, linked in the code), in bfloat16:

# %%
MODELS = {  # name: (layers, query heads, K/V heads, head_dim)
    "Llama 2 7B": (32, 32, 32, 128),  # https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json
    "Llama 3 8B": (32, 32, 8, 128),  # https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
    "Mistral 7B v0.1": (32, 32, 8, 128),  # https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
    "Qwen2 7B": (28, 28, 4, 128),  # https://huggingface.co/Qwen/Qwen2-7B/blob/main/config.json
    "Gemma 7B": (28, 16, 16, 256),  # https://huggingface.co/google/gemma-7b/blob/main/config.json
    "Falcon 7B": (32, 71, 1, 64),  # https://huggingface.co/tiiuae/falcon-7b/blob/main/config.json (multi_query)
    "Llama 2 70B": (80, 64, 8, 128),  # https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json
}
CONTEXT = 32768
rows, per_token, per_context = [], {}, {}
for name, (layers, heads, kv_heads, head_dim) in MODELS.items():
    bytes_per_token = 2 * layers * kv_heads * head_dim * 2  # K and V, every layer, 2 bytes each
    # Checked against a real cache: one layer's, allocated for 4,096 positions, times the layers and 8.
    layer_cache = KVCache(batch_size=1, num_kv_heads=kv_heads, head_dim=head_dim, capacity=4096, dtype=torch.bfloat16)
    assert layer_cache.nbytes * layers * (CONTEXT // 4096) == bytes_per_token * CONTEXT, name
    del layer_cache
    per_token[name], per_context[name] = bytes_per_token, bytes_per_token * CONTEXT
    rows.append((name, layers, heads, kv_heads, head_dim, f"{bytes_per_token / 2**10:,.0f}",
                 f"{bytes_per_token * CONTEXT / 2**30:,.2f}", f"{heads // kv_heads}x"))

# %% tags=["hide-input"]
show_table("KV cache per sequence in bfloat16 (checked against KVCache.nbytes)",
           ["model", "layers", "query heads", "K/V heads", "head_dim", "KiB per token", "GiB per 32k context",
            "smaller than MHA by"], rows)

# %% tags=["hide-input"]
fig = Figure(figsize=(7.5, 3.6), layout="constrained")
ax_token, ax_context = fig.subplots(1, 2)
names = list(MODELS)
colors = ["C0" if MODELS[n][2] == MODELS[n][1] else "C2" if MODELS[n][2] == 1 else "C1" for n in names]
ax_token.barh(names, [per_token[n] / 2**10 for n in names], color=colors)
ax_token.set_xlabel("KiB per token")
ax_token.invert_yaxis()
ax_context.barh(names, [per_context[n] / 2**30 for n in names], color=colors)
ax_context.set_xlabel("GiB per 32k-token sequence")
ax_context.invert_yaxis()
ax_context.set_yticks([])
fig.suptitle("KV cache in bfloat16: MHA (blue), GQA (orange), MQA (green)")
show(fig)

# %% tags=["hide-input"]
llama2, llama3 = per_context["Llama 2 7B"], per_context["Llama 3 8B"]
ratio = llama2 // llama3
show_markdown(f"At 32k tokens a Llama 2 7B sequence needs {llama2 / 2**30:.0f} GiB of cache; Llama 3 8B, with 8 "
              f"K/V heads for 32 query heads, {llama3 / 2**30:.0f} GiB: {ratio}x less, so {ratio} times the "
              f"sequences fit in the same memory, and each decoding step reads {ratio} times fewer cache bytes.")

# %% [markdown]
# ## Prefill and training, measured
#
# Without a cache (a prompt's prefill, or training), GQA computes as many query heads as MHA, so
# the attention core costs the same; only the key and value projections shrink. The recorded
# default-profile benchmark runs the registered classes at its headline shape (GPT-2 small's widths,
# 12 query heads of 64; `gqa` with its default K/V heads, groups of 4 query heads). It also says
# which class suits a custom mask: GQA is what current models train with, keeping most of MHA's
# quality at a fraction of its cache (the GQA paper's result), and MQA saves the most memory at some
# cost in quality; in this package `gqa` (SDPA) is the class to copy, and for a custom mask or score,
# `gqa_flex` takes a FlexAttention `mask_mod` or `score_mod`. The run, read by
# `attention.report.prefill`:

# %%
from attention.report.long import recorded
from attention.report.prefill import grouped_query_section

path, default_run = recorded("")  # the newest default-profile run, float32

# %% tags=["hide-input"]
show_markdown(grouped_query_section(path, default_run))

# %% [markdown]
# Decoding, the KV cache's pitfalls and the measured speed of a step:
# [KV cache and decoding](../kv_cache/). Every shape of the recorded runs, and this build's own
# quick run: [Benchmarks](../../benchmarks/).
