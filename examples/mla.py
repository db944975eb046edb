# %% [markdown]
# # Multi-head latent attention
#
# Multi-head latent attention (MLA; DeepSeek-AI, 2024, DeepSeek-V2, <https://arxiv.org/abs/2405.04434>,
# section 2.1) is the attention of DeepSeek-V2, DeepSeek-V3 and Kimi K2. Where
# [grouped-query attention](../gqa/) shrinks the KV cache by sharing key/value heads, MLA caches per
# token one **latent** vector `c^KV` of `kv_lora_rank` numbers, shared by every head, plus one small
# rotary key `k^R`, also shared. Each head's keys and values are up-projections of the latent.
#
# Decoding can use that cache two ways: expand the cached latents back to every head's keys and
# values, then attend (the **naive** path), or fold the up-projections into the query and the output
# and attend over the latent itself (the **absorbed** path). This page builds one layer, follows both
# paths, checks them, then counts and measures what each costs. It assumes the [KV cache](../kv_cache/)
# and [Position encodings](../positional/) pages. API: [`attention.models.deepseek_v3`](../../api/mla/).

# %%
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from attention.decoding import KVCache, LatentCache
from attention.display import show, show_markdown, show_shape, show_source, show_table
from attention.models import MODELS
from attention.models.deepseek_v3 import (PUBLISHED_CONFIGS, DeepseekV3Attention, apply_rotary_interleaved,
                                          decode_step_bytes, interleaved_cos_sin, kv_cache_bytes_per_token,
                                          latent_attention_flops, latent_cache_bytes_per_token)
from attention.reference import reference_latent_attention

# %% [markdown]
# ## One layer, from a configuration
#
# `from_config` reads a configuration with transformers' field names (here a small one shaped like
# DeepSeek-V3's: compressed queries, YaRN rotary scaling) and names the parameters as transformers
# does, so a real checkpoint's layer loads with `load_state_dict` unchanged. `attention.models.MODELS`
# maps `deepseek_v3`, `deepseek_v2` and `kimi_k2` to the class. The layer below runs in float64, so
# the checks further down compare the paths' arithmetic, not rounding.

# %%
torch.manual_seed(0)
config = {"model_type": "deepseek_v3", "hidden_size": 256, "num_attention_heads": 8, "q_lora_rank": 96,
          "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "rope_theta": 10000.0,
          "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                           "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
modules = {path: MODELS["deepseek_v3"].from_config(config, layer_idx=0, path=path).to(torch.float64).eval()
           for path in ("naive", "absorbed")}
modules["absorbed"].load_state_dict(modules["naive"].state_dict())  # one set of weights, two paths
module = modules["naive"]
H, Dc, Dn, Dr, Dv = (config[name] for name in ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                                               "qk_rope_head_dim", "v_head_dim"))
B, T = 2, 12
x = torch.randn(B, T, config["hidden_size"], dtype=torch.float64)
for name, tensor in module.state_dict().items():
    show_shape(name, tensor, "(out features, in features)" if tensor.dim() == 2 else "(features,)")

# %% [markdown]
# ## Step by step: what every path shares
#
# Queries go through a low-rank bottleneck (`q_a_proj` to `q_lora_rank` features, an RMS norm, then
# `q_b_proj`; DeepSeek-V2-Lite projects them directly with `q_proj`). Each head's query has a content
# part of `Dn` features and a rotary part of `Dr`. One projection, `kv_a_proj_with_mqa`, gives the
# latent (`Dc` features, then normalised) and the rotary key (`Dr`), one of each per token for all
# heads: that pair is all the cache keeps.

# %%
with torch.no_grad():
    c_q = module.q_a_layernorm(module.q_a_proj(x))  # (B, T, q_lora_rank)
    q = module.q_b_proj(c_q).view(B, T, H, Dn + Dr).transpose(1, 2)  # (B, T, H*(Dn+Dr)) -> (B, H, T, Dn+Dr)
    q_nope, q_rope = q.split([Dn, Dr], dim=-1)  # (B, H, T, Dn), (B, H, T, Dr)
    latent, k_rope = module.kv_a_proj_with_mqa(x).split([Dc, Dr], dim=-1)  # (B, T, Dc), (B, T, Dr)
    latent = module.kv_a_layernorm(latent).unsqueeze(1)  # (B, 1, T, Dc): one "head", read by every query head
    k_rope = k_rope.unsqueeze(1)  # (B, 1, T, Dr)
show_shape("x", x, "(B, T, C)")
show_shape("c_q = q_a_layernorm(q_a_proj(x))", c_q, "(B, T, q_lora_rank)")
show_shape("q = q_b_proj(c_q).view(...).transpose(1, 2)", q, "(B, H, T, Dn+Dr)")
show_shape("q_nope, q_rope = q.split(...)", q_nope, "(B, H, T, Dn)")
show_shape("latent = kv_a_layernorm(...)   [cached]", latent, "(B, 1, T, Dc)")
show_shape("k_rope                        [cached]", k_rope, "(B, 1, T, Dr)")

# %% [markdown]
# The rotary parts turn with position (the cache stores `k_rope` already turned); the content parts do
# not. Turning the content keys would put a position-dependent rotation between the query and the key
# up-projection, and the absorbed path below could no longer fold one into the other: hence the
# separate ("decoupled") rotary key, paper section 2.1.3.

# %%
with torch.no_grad():
    cos, sin = interleaved_cos_sin(module, 0, T, x)  # (T, Dr/2) each, times YaRN's attention factor
    q_rope = apply_rotary_interleaved(q_rope, cos, sin)  # (B, H, T, Dr): DeepSeek's pairs (2i, 2i + 1)
    k_rope = apply_rotary_interleaved(k_rope, cos, sin)  # (B, 1, T, Dr)
positions = torch.arange(T)
causal_mask = positions[:, None] >= positions[None, :]  # (T, T), True = attend
show_shape("q_rope, rotated", q_rope, "(B, H, T, Dr)")
show_shape("k_rope, rotated", k_rope, "(B, 1, T, Dr)")

# %% [markdown]
# ## The naive path: expand, then attend
#
# `kv_b_proj` turns every position's latent into each head's content key (`Dn`) and value (`Dv`);
# the shared rotary key is appended to every head's content key. Then ordinary multi-head attention,
# with keys of `Dn + Dr` features and values of `Dv`. Over a cache of `S` positions this expands all
# `S` latents at every call: transformers' `DeepseekV3Attention` works this way.

# %%
with torch.no_grad():
    kv = module.kv_b_proj(latent).view(B, T, H, Dn + Dv).transpose(1, 2)  # (B, 1, T, Dc) -> (B, H, T, Dn+Dv)
    k_nope, v = kv.split([Dn, Dv], dim=-1)  # (B, H, T, Dn), (B, H, T, Dv)
    k = torch.cat([k_nope, k_rope.expand(B, H, T, Dr)], dim=-1)  # (B, H, T, Dn+Dr)
    q_full = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, Dn+Dr)
    context_naive = F.scaled_dot_product_attention(q_full, k, v, attn_mask=causal_mask, scale=module.scaling)  # (B, H, T, Dv)
show_shape("kv = kv_b_proj(latent).view(...).transpose", kv, "(B, H, S, Dn+Dv)")
show_shape("k = cat([k_nope, k_rope.expand(...)])", k, "(B, H, S, Dn+Dr)")
show_shape("q = cat([q_nope, q_rope])", q_full, "(B, H, T, Dn+Dr)")
show_shape("context = SDPA(q, k, v)", context_naive, "(B, H, T, Dv)")

# %% [markdown]
# ## The absorbed path: attend over the latent
#
# Head `h`'s content score is `q_h · (W^UK_h c)`, which equals `(q_h W^UK_h) · c`: fold the key
# up-projection into the query once per new token, and every head scores the cached latent itself.
# Its output `Σ_j p_j W^UV_h c_j` equals `W^UV_h (Σ_j p_j c_j)`: weight the latents, then up-project
# once. Every head reads the same cache, so it is multi-query attention with keys `Dc + Dr` wide
# and values `Dc` wide, and the heads fold into the rows of one matmul.
#
# ![Multi-head latent attention's two paths: the naive path expands every cached latent into each
# head's keys and values; the absorbed path folds the key up-projection into the query and the value
# up-projection after the weighted sum, and reads the latent cache as it lies](../../diagrams/mla-absorption.svg)

# %%
with torch.no_grad():
    w_kv = module.kv_b_proj.weight.view(H, Dn + Dv, Dc)  # (H*(Dn+Dv), Dc) -> (H, Dn+Dv, Dc)
    w_uk, w_uv = w_kv[:, :Dn], w_kv[:, Dn:]  # (H, Dn, Dc), (H, Dv, Dc)
    q_latent = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk)  # (B, H, T, Dc): W^UK folded into the query
    scores = (q_latent.reshape(B, H * T, Dc) @ latent[:, 0].transpose(1, 2)  # (B, H*T, Dc) @ (B, Dc, S) -> (B, H*T, S)
              + q_rope.reshape(B, H * T, Dr) @ k_rope[:, 0].transpose(1, 2))  # (B, H*T, Dr) @ (B, Dr, S) -> (B, H*T, S)
    scores = scores.view(B, H, T, T) * module.scaling  # (B, H, T, S)
    attn_weights = torch.softmax(scores.masked_fill(~causal_mask, float("-inf")), dim=-1)  # (B, H, T, S)
    context_latent = attn_weights.view(B, H * T, T) @ latent[:, 0]  # (B, H*T, S) @ (B, S, Dc) -> (B, H*T, Dc)
    context_absorbed = torch.einsum("bhtc,hvc->bhtv", context_latent.view(B, H, T, Dc), w_uv)  # (B, H, T, Dv)
show_shape("w_uk, w_uv = kv_b_proj.weight.view(H, ...)", w_uk, "(H, Dn, Dc)")
show_shape("q_latent = q_nope @ w_uk", q_latent, "(B, H, T, Dc)")
show_shape("scores (heads folded into rows)", scores, "(B, H, T, S)")
show_shape("context_latent = weights @ latent", context_latent, "(B, H*T, Dc)")
show_shape("context = context_latent @ w_uvᵀ", context_absorbed, "(B, H, T, Dv)")

# %% [markdown]
# Both paths end in the same `(B, H, T, Dv)` context, then `o_proj`. The module's absorbed path is
# these lines, over what the cache returns (its `attend_naive` is the section before):

# %% tags=["hide-input"]
show_source(DeepseekV3Attention.attend_absorbed)

# %% [markdown]
# The checks, in float64 (largest |difference| over every element):

# %%
with torch.no_grad():
    outputs = {path: m(x) for path, m in modules.items()}
expected, _ = reference_latent_attention(x, module.state_dict(), H, Dn, Dr, Dv, config["rope_theta"],
                                         config["rope_scaling"], module.rope_interleave)
checks = {
    "the page's naive lines against its absorbed lines": (context_naive - context_absorbed).abs().max().item(),
    "module(x), naive path, against the float64 reference": (outputs["naive"] - expected).abs().max().item(),
    "module(x), absorbed path, against the float64 reference": (outputs["absorbed"] - expected).abs().max().item(),
    "module(x): absorbed against naive": (outputs["absorbed"] - outputs["naive"]).abs().max().item(),
}
for label, error in checks.items():
    print(f"{label:57} {error:.1e}")
    assert error < 1e-12

# %% [markdown]
# The reference (`attention.reference.reference_latent_attention`) is written from the paper's
# equations 9-19, with what the released models add (RMS norms on the compressed query and the
# latent, YaRN's score scale). The tests (`tests/test_mla.py`) also check the class against
# transformers' `DeepseekV3Attention` and `DeepseekV2Attention` (V2 differs only in always rotating
# adjacent pairs, so one class serves both).

# %% [markdown]
# ## Decoding with the latent cache
#
# `new_cache(batch_size, capacity)` makes a `LatentCache`: the latent and the rotary key of every
# position, `(B, 1, capacity, Dc)` and `(B, 1, capacity, Dr)`, nothing per head. Both paths read the
# same cache. A prompt, then single tokens, then chunks, each call against the full forward's rows:

# %%
sequence = torch.randn(B, 40, config["hidden_size"], dtype=torch.float64)
with torch.no_grad():
    full = module(sequence)  # the full causal forward over all 40 positions
caches = {path: m.new_cache(batch_size=B, capacity=64) for path, m in modules.items()}
show_shape("cache.latent (preallocated)", caches["absorbed"].latent, "(B, 1, capacity, Dc)")
show_shape("cache.rope_keys", caches["absorbed"].rope_keys, "(B, 1, capacity, Dr)")
calls = [("prefill", 0, 16), ("step", 16, 17), ("step", 17, 18), ("chunk", 18, 27), ("step", 27, 28), ("chunk", 28, 40)]
with torch.no_grad():
    for kind, start, end in calls:
        out = {path: m(sequence[:, start:end], cache=caches[path]) for path, m in modules.items()}
        errors = {path: (out[path] - full[:, start:end]).abs().max().item() for path in out}
        assert max(errors.values()) < 1e-12
        print(f"{kind:7} positions {start:2}..{end - 1:2}: cache.length {caches['absorbed'].length:2}, max |difference| "
              f"from the full forward: absorbed {errors['absorbed']:.0e}, naive {errors['naive']:.0e}")
cache = caches["absorbed"]  # cache.nbytes: batch x positions x (kv_lora_rank + qk_rope_head_dim) x element size
per_position = Dc + Dr
assert cache.nbytes == B * cache.capacity * per_position * 8  # float64: 8 bytes
print(f"{B} x {cache.capacity} x ({Dc} + {Dr}) x 8 = {cache.nbytes:,} bytes; a KV cache of this layer's keys and values "
      f"({H} heads of {Dn + Dr} + {Dv}) would hold {H * (Dn + Dr + Dv) / per_position:.1f} times as much")

# %% [markdown]
# ## The cache at the published sizes
#
# The three models' attention fields are typed from their `config.json` on huggingface.co
# (`attention.models.deepseek_v3.PUBLISHED_CONFIGS`, each linked below). What would the same heads
# cache without the latent? The paper's Table 1 compares MLA with
# multi-head, grouped-query and multi-query attention of the same query heads, keys and values of
# the per-head width `d_h` (here `v_head_dim`): `2 n_h d_h` numbers per token and layer for MHA,
# `2 n_g d_h` for GQA with `n_g` groups (8 here), `2 d_h` for MQA, against `Dc + Dr` for MLA. Bytes in
# bfloat16 (2 per number), each count checked against a cache allocated at batch 2 and 3 positions
# (`attention.decoding`'s `LatentCache`, and its `KVCache` for the others):

# %%
dtype, element_size = torch.bfloat16, 2
kinds = ("MLA", "MHA", "GQA (8 groups)", "MQA")


def bytes_per_token(c, kind):
    """Cache bytes per token and layer of `kind` at the sizes of config `c`, bfloat16."""
    if kind == "MLA":
        return latent_cache_bytes_per_token(c, dtype)
    kv_heads = {"MHA": c["num_attention_heads"], "GQA (8 groups)": 8, "MQA": 1}[kind]
    return kv_cache_bytes_per_token(c, kv_heads, dtype)


cache_rows, per_token = [], {}
for name, c in PUBLISHED_CONFIGS.items():
    allocated = {"MLA": LatentCache(2, c["kv_lora_rank"], c["qk_rope_head_dim"], 3, dtype=dtype).nbytes}
    for kind, kv_heads in (("MHA", c["num_attention_heads"]), ("GQA (8 groups)", 8), ("MQA", 1)):
        allocated[kind] = KVCache(2, kv_heads, c["v_head_dim"], 3, dtype=dtype).nbytes
    per_token[name] = {kind: bytes_per_token(c, kind) for kind in kinds}
    assert all(allocated[kind] == 2 * 3 * per_token[name][kind] for kind in kinds)
    cache_rows.append((f"[{name}]({c['source']})", *(f"{per_token[name][kind]:,}" for kind in kinds),
                       f"{per_token[name]['MHA'] / per_token[name]['MLA']:.1f}x",
                       f"{per_token[name]['MLA'] * c['num_hidden_layers'] / 1024:,.1f} KiB",
                       f"{per_token[name]['MHA'] * c['num_hidden_layers'] / 1024:,.1f} KiB"))

# %% tags=["hide-input"]
show_table("Cache bytes per token and layer, bfloat16 (and per token over all layers)",
           ["model", *kinds, "MHA / MLA", "MLA, all layers", "MHA, all layers"], cache_rows)
v3 = per_token["DeepSeek-V3"]
v3_heads = PUBLISHED_CONFIGS["DeepSeek-V3"]["num_attention_heads"]
v3_key = PUBLISHED_CONFIGS["DeepSeek-V3"]["qk_nope_head_dim"] + PUBLISHED_CONFIGS["DeepSeek-V3"]["qk_rope_head_dim"]
v3_value = PUBLISHED_CONFIGS["DeepSeek-V3"]["v_head_dim"]
gqa_equivalent = v3["MLA"] / (kv_cache_bytes_per_token(PUBLISHED_CONFIGS["DeepSeek-V3"], 1, dtype))
show_markdown(
    f"At DeepSeek-V3's sizes the latent and rotary key take {v3['MLA']:,} bytes per token and layer, "
    f"{v3['MHA'] / v3['MLA']:.1f} times less than multi-head attention of its {v3_heads} "
    f"heads ({v3['MHA']:,} bytes) and {v3['GQA (8 groups)'] / v3['MLA']:.1f} times less than GQA with 8 groups; "
    f"MQA would cache {'less' if v3['MQA'] < v3['MLA'] else 'more'} ({v3['MQA']:,} bytes): MLA's cache is that of "
    f"GQA with {gqa_equivalent:.2f} groups. Keys and values as this layer's naive path expands them "
    f"({v3_heads} heads of {v3_key} + {v3_value}) would take {v3_heads * (v3_key + v3_value) * element_size:,} bytes, "
    f"{v3_heads * (v3_key + v3_value) * element_size / v3['MLA']:.1f} times the latent's.")

# %% [markdown]
# ## What a decoded token costs on each path
#
# Per layer and sequence, one new token over `S` positions (`latent_attention_flops`, checked in the
# tests against PyTorch's FLOP counter). Beyond the shared projections, the naive path multiplies
# `kv_b_proj` into all `S` latents, `2 S Dc H (Dn + Dv)` FLOPs; the absorbed path folds `W^UK` and
# `W^UV` in once, `2 H Dc (Dn + Dv)`, then attends over the latent, `2 S H (2 Dc + Dr)`. Bytes moved
# (`decode_step_bytes`, bfloat16, batch 1): the weights and the cache, and for the naive path its
# expanded keys and values, written and read back.

# %%
flop_rows, decode_costs = [], {}
for name, c in PUBLISHED_CONFIGS.items():
    for S in (1024, 4096, 16384, 32768):
        flops = {path: latent_attention_flops(c, 1, S, path) for path in ("absorbed", "naive")}
        moved = {path: decode_step_bytes(c, S, 1, dtype, path) for path in ("absorbed", "naive")}
        decode_costs[name, S] = flops, moved
        flop_rows.append((name, f"{S:,}", f"{flops['absorbed'] / 1e9:.3f}", f"{flops['naive'] / 1e9:.2f}",
                          f"{flops['naive'] / flops['absorbed']:.0f}x", f"{moved['absorbed'] / 1e6:,.1f}",
                          f"{moved['naive'] / 1e6:,.1f}", f"{flops['absorbed'] / moved['absorbed']:.1f}",
                          f"{flops['naive'] / moved['naive']:.1f}"))

# %% tags=["hide-input"]
show_table("One decoded token, one layer of DeepSeek-V3, one sequence (bfloat16 bytes)",
           ["context S", "absorbed GFLOP", "naive GFLOP", "naive / absorbed", "absorbed MB moved",
            "naive MB moved", "absorbed FLOP/byte", "naive FLOP/byte"],
           [row[1:] for row in flop_rows if row[0] == "DeepSeek-V3"])
flops_16k, moved_16k = decode_costs["DeepSeek-V3", 16384]
show_markdown(
    f"At 16,384 positions one DeepSeek-V3 layer's naive step computes {flops_16k['naive'] / flops_16k['absorbed']:.0f} "
    f"times the absorbed step's FLOPs and moves {moved_16k['naive'] / moved_16k['absorbed']:.0f} times its bytes; "
    f"the absorbed step does {flops_16k['absorbed'] / moved_16k['absorbed']:.1f} FLOPs per byte it moves, the naive "
    f"step {flops_16k['naive'] / moved_16k['naive']:.1f}.")

# %% [markdown]
# ## When to use which path
#
# Per query-key pair the absorbed path works over `2 Dc + Dr` features, the naive path over
# `Dn + Dr + Dv`, but pays for expanding each latent once per call: the more new tokens a call brings,
# the better expanding pays. The naive path's FLOPs over the absorbed path's, for `T` new tokens ending
# at `S` positions, DeepSeek-V3 (below 1: naive needs fewer):

# %%
v3_config = PUBLISHED_CONFIGS["DeepSeek-V3"]

# %% tags=["hide-input"]
fig = Figure(figsize=(6.5, 3.8), layout="constrained")
ax = fig.add_subplot()
for S in (1024, 4096, 16384, 32768):
    new_tokens = [t for t in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768) if t <= S]
    ratio = [latent_attention_flops(v3_config, t, S, "naive") / latent_attention_flops(v3_config, t, S, "absorbed")
             for t in new_tokens]
    ax.plot(new_tokens, ratio, marker="o", markersize=3, label=f"S = {S:,}")
ax.axhline(1.0, color="gray", linewidth=1)
ax.set_xscale("log", base=2)
ax.set_xticks([4**k for k in range(8)], [f"{4**k:,}" for k in range(8)])
ax.set_yscale("log")
ax.set_xlabel("new tokens in the call (T)")
ax.set_ylabel("naive FLOPs / absorbed FLOPs")
ax.set_title("DeepSeek-V3 layer: which path needs fewer FLOPs")
ax.grid(True, which="major", alpha=0.3)
ax.legend(fontsize=8)
show(fig)

# %%
def smallest_chunk_where_naive_is_cheaper(c, S):
    """The fewest new tokens `T <= S` for which the naive path's FLOPs fall below the absorbed path's (None: never)."""
    low, high = 1, S
    if latent_attention_flops(c, S, S, "naive") >= latent_attention_flops(c, S, S, "absorbed"):
        return None
    def naive_cheaper(tokens):
        return latent_attention_flops(c, tokens, S, "naive") < latent_attention_flops(c, tokens, S, "absorbed")

    while low < high:  # naive minus absorbed falls as T grows: the expansion is shared by more tokens
        middle = (low + high) // 2
        low, high = (low, middle) if naive_cheaper(middle) else (middle + 1, high)
    assert naive_cheaper(low) and (low == 1 or not naive_cheaper(low - 1))
    return low


crossover = {(name, S): smallest_chunk_where_naive_is_cheaper(c, S)
             for name, c in PUBLISHED_CONFIGS.items() for S in (1024, 4096, 16384, 32768)}

# %% tags=["hide-input"]
same_for_all = len({tuple(crossover[name, S] for S in (1024, 4096, 16384, 32768)) for name in PUBLISHED_CONFIGS}) == 1
show_table("Fewest new tokens in one call for which the naive path needs fewer FLOPs",
           ["model", *(f"S = {S:,}" for S in (1024, 4096, 16384, 32768))],
           [(name, *(crossover[name, S] if crossover[name, S] else "never" for S in (1024, 4096, 16384, 32768)))
            for name in (["DeepSeek-V3"] if same_for_all else PUBLISHED_CONFIGS)])
decode_winner = {name: all(decode_costs[name, S][0]["absorbed"] < decode_costs[name, S][0]["naive"]
                           and decode_costs[name, S][1]["absorbed"] < decode_costs[name, S][1]["naive"]
                           for S in (1024, 4096, 16384, 32768)) for name in PUBLISHED_CONFIGS}
expanded_32k = 32768 * v3_config["num_attention_heads"] * (v3_config["qk_nope_head_dim"] + v3_config["qk_rope_head_dim"]
                                                            + v3_config["v_head_dim"]) * element_size
show_markdown(
    "From these counts: **decoding** (one new token per call) "
    + ("needs fewer FLOPs and moves fewer bytes on the absorbed path for all three models at 1,024 to 32,768 positions"
       if all(decode_winner.values()) else "does not favour the absorbed path everywhere; see the table above")
    + f". A **prefill** or long chunk favours the naive path once a call brings at least the tokens in the table "
    f"(for DeepSeek-V3 at 32,768 positions, {crossover['DeepSeek-V3', 32768]} new tokens)"
    + ("; the threshold is the same for the three models, whose latent, rotary and head widths are the same "
       "(the head count cancels out), so the table shows one" if same_for_all else "")
    + ". The naive path also "
    f"holds each sequence's expanded keys and values while it attends: {expanded_32k / 2**30:.1f} GiB per DeepSeek-V3 "
    f"layer at 32,768 positions in bfloat16, against {32768 * per_token['DeepSeek-V3']['MLA'] / 2**20:.0f} MiB of "
    f"cache. FLOPs and bytes bound the time; which path is faster on a device is for the measured rows below.")

# %% [markdown]
# ## Measured: decode steps
#
# The benchmark's decode profile steps one MLA layer on both paths beside GQA and MQA layers of the
# same query heads, each step checked against `reference_latent_attention`. The layer keeps
# DeepSeek-V3's widths in units of the profile's head size (latent 4 heads of 128, rotary key 1/2).
# The recorded run, read by `attention.report.decode`:

# %%
from attention.report.decode import latent_section
from attention.report.long import recorded

decode_path, decode_run = recorded("decode")  # float32

# %% tags=["hide-input"]
show_markdown(latent_section(decode_path, decode_run))

# %% [markdown]
# ## Measured: prefill
#
# The prefill profile runs the same layer on whole prompts, no cache, on both paths: one checked
# causal forward of `T` tokens. The FLOP counts above favour the naive path at every length
# (asserted below); the rows say what the time does. The recorded run, read by
# `attention.report.prefill`:

# %%
from attention.report.prefill import latent_section as prefill_section

# "favour the naive path at every length": a whole prompt of T tokens (T new tokens over T positions), DeepSeek-V3.
assert all(latent_attention_flops(v3_config, 2**p, 2**p, "naive") < latent_attention_flops(v3_config, 2**p, 2**p, "absorbed")
           for p in range(18))
prefill_path, prefill_run = recorded("prefill")

# %% tags=["hide-input"]
show_markdown(prefill_section(prefill_path, prefill_run, decode_run))
