# %% [markdown]
# # KV-cache economies
#
# A decoder keeps, for every layer and every past position, what its attention will read again: a key and
# a value per K/V head. At long contexts this cache, not the weights, decides how many sequences fit on a
# device. Since 2019 designs have found ways to keep less per position:
#
# | Economy | What a layer keeps per position | Seen in |
# |---|---|---|
# | multi-query and grouped-query attention | a key and a value per K/V head, fewer heads than queries | [MQA](https://arxiv.org/abs/1911.02150) (2019), [GQA](https://arxiv.org/abs/2305.13245) (2023) |
# | multi-head latent attention (MLA) | one latent and one rotary key, shared by every head | [DeepSeek-V2](https://arxiv.org/abs/2405.04434) (2024) |
# | sliding windows | keys and values of the last few positions only, on local layers | Mistral 7B, Gemma 2 and 3, gpt-oss |
# | K = V | one projection for key and value, on global layers | Gemma 4 (2026) |
# | cross-layer sharing | nothing: a layer reads an earlier layer's keys and values | Gemma 4's E2B and E4B (2026) |
# | compression | a short window, then one entry per 4 or 128 positions | [DeepSeek-V4](https://huggingface.co/blog/deepseekv4) (2026) |
#
# This page builds one model's cache each way with this package's layers and counts it, shows Gemma 4's
# two economies in its layer's code, and compares the published models. Any model, context, batch and
# element type: the [KV-cache calculator](../../kv-calculator/).

# %%
import torch

from attention.display import show, show_markdown, show_source, show_table
from attention.models import MODELS
from attention.models.published import (PUBLISHED, kv_cache_bytes, layer_cache_bytes, published_entries,
                                        published_layers)

# %% [markdown]
# ## One model, eight caches
#
# Llama 3.1 8B's attention (32 layers, 32 query heads of 128, 8 K/V heads) built eight ways: each
# configuration below is a model family's own, its layers built on PyTorch's `meta` device (shapes, no
# weights), each layer's cache counted by `layer_cache_bytes`, which the tests hold equal to the caches
# the layers allocate. Bytes per position are averaged over the context, since windows and compressed
# entries make the cache grow slower than the context:

# %%
llama = PUBLISHED["Llama 3.1 8B"]["config"]  # 32 layers, hidden 4,096
local_then_global = (["sliding_attention"] * 5 + ["full_attention"]) * 5 + ["sliding_attention", "full_attention"]
gemma4_like = {"model_type": "gemma4_text", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "head_dim": 128, "global_head_dim": 128, "sliding_window": 1024,
               "layer_types": local_then_global, "rms_norm_eps": 1e-6}
designs = {
    "MHA: 32 K/V heads": {**llama, "num_key_value_heads": 32},
    "GQA: 8 K/V heads (Llama 3.1 8B)": llama,
    "MQA: 1 K/V head": {**llama, "num_key_value_heads": 1},
    "MLA: a latent of 512 + 64 (DeepSeek's)": {
        "model_type": "deepseek_v3", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "rope_theta": 10000.0},
    "GQA + windows of 1,024 on 5 of 6 layers": gemma4_like,
    "+ 2 K/V heads on global layers (K = V)": {**gemma4_like, "attention_k_eq_v": True, "num_global_key_value_heads": 2},
    "+ the last 16 layers sharing": {**gemma4_like, "attention_k_eq_v": True, "num_global_key_value_heads": 2,
                                     "num_kv_shared_layers": 16},
    "compression: window 128, CSA and HCA (DeepSeek-V4's)": {
        "model_type": "deepseek_v4", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "head_dim": 512, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "qk_rope_head_dim": 64,
        "sliding_window": 128, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0, "rms_norm_eps": 1e-6, "compress_ratios": [0, 0] + [4, 128] * 15},
}


def layers_of(config):
    """Every layer of `config`, built on the meta device: attributes and shapes, no weight allocated."""
    with torch.device("meta"):
        return [MODELS[config["model_type"]].from_config(config, i) for i in range(config["num_hidden_layers"])]


def bytes_per_position(layers, context, dtype=torch.bfloat16):
    """One sequence's cache over every layer after `context` positions, divided by `context`."""
    return sum(layer_cache_bytes(layer, context, dtype) for layer in layers) / context


CONTEXTS = (8192, 131072, 1048576)
per_position = {name: [bytes_per_position(layers_of(config), n) for n in CONTEXTS] for name, config in designs.items()}
show_table("Cache per position, bfloat16, one sequence (KiB)",
           ["design", *(f"at {n // 2**20}M" if n >= 2**20 else f"at {n // 1024}k" for n in CONTEXTS)],
           [[name, *(f"{value / 1024:,.2f}" for value in values)] for name, values in per_position.items()])

# %% tags=["hide-input"]
from matplotlib.figure import Figure

fig = Figure(figsize=(9, 4.2), layout="constrained")
ax = fig.add_subplot()
names = list(per_position)[::-1]
for offset, (context, colour) in zip((-0.2, 0.2), ((CONTEXTS[0], "#9ecae1"), (CONTEXTS[-1], "#08519c"))):
    column = CONTEXTS.index(context)
    ax.barh([i + offset for i in range(len(names))], [per_position[name][column] / 1024 for name in names],
            height=0.4, color=colour, label=f"{context // 1024:,}k positions" if context < 2**20 else "1M positions")
    for i, name in enumerate(names):  # the value at the end of each bar
        value = per_position[name][column] / 1024
        ax.text(value * 1.05, i + offset, f"{value:,.1f}", va="center", fontsize=7)
ax.set_yticks(range(len(names)), names)
ax.set_xscale("log")
ax.set_xlim(right=3 * max(max(values) for values in per_position.values()) / 1024)  # room for the last label
ax.set(xlabel="KiB per position (log scale)", title=f"One model's cache per position, {len(designs)} ways")
ax.legend(loc="lower right")
show(fig)

# %%
ratio = {name: per_position["MHA: 32 K/V heads"][2] / values[2] for name, values in per_position.items()}
windowed = layers_of(designs["GQA + windows of 1,024 on 5 of 6 layers"])
global_share = sum(layer_cache_bytes(layer, CONTEXTS[2], torch.bfloat16) for layer in windowed
                   if layer.sliding_window is None) / (per_position["GQA + windows of 1,024 on 5 of 6 layers"][2] * CONTEXTS[2])
show_markdown(
    f"At 1M positions, against multi-head attention's cache: grouping K/V heads saves "
    f"{ratio['GQA: 8 K/V heads (Llama 3.1 8B)']:.0f}x, MLA {ratio[list(designs)[3]]:.1f}x, grouped heads with "
    f"windows on five layers in six {ratio['GQA + windows of 1,024 on 5 of 6 layers']:.1f}x, and DeepSeek-V4's "
    f"compression {ratio[list(designs)[-1]]:.0f}x. With windows, {global_share:.1%} of what is left at 1M is the "
    f"{sum(layer.sliding_window is None for layer in windowed)} global layers' cache, which is where Gemma 4 cuts "
    f"next: 2 K/V heads on them instead of 8 leave {per_position[list(designs)[5]][2] / 1024:,.2f} KiB per position.")

# %% [markdown]
# ## Gemma 4: K = V and layers that share
#
# Gemma 4's global layers have no `v_proj`: one projection gives the key (normed with `k_norm`'s weight,
# then rotated) and the value (the same projection normed without a weight, not rotated). Its E2B and E4B
# models go further: their last 20 and 18 layers compute queries only, and attend to the keys and values
# of the last earlier layer of their kind, which stores them for the step
# (`attention.models.gemma4`, API: [`gemma4`](../../api/models/gemma4/)):

# %%
from attention.models.gemma4 import Gemma4Attention, kv_sharing_modes

show_source(Gemma4Attention.qkv)
show_source(Gemma4Attention.forward)

# %% [markdown]
# A tiny model with both: 6 layers alternating local and global, K = V on the global ones, and the last two
# reusing layers 2 and 3. A `shared_kv` dict goes through the layers of one step, as transformers' does;
# the reusing layers have no K/V weights and no cache:

# %%
torch.manual_seed(0)
tiny = {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
        "attention_k_eq_v": True, "num_kv_shared_layers": 2, "sliding_window": 8, "rms_norm_eps": 1e-6,
        "layer_types": ["sliding_attention", "full_attention"] * 3}
layers = [Gemma4Attention.from_config(tiny, i).to(torch.float64).eval() for i in range(6)]
caches = [layer.new_cache(batch_size=1, capacity=32) for layer in layers]
show_table("The tiny model's layers", ["layer", "kind", "sharing", "K/V heads × size", "K/V weights", "cache (bytes)"],
           [[i, layer.layer_type, layer.kv_sharing or "—", f"{layer.num_key_value_heads} × {layer.head_dim}",
             ", ".join(name for name in ("k_proj", "v_proj") if getattr(layer, name, None) is not None) or "none",
             "none" if cache is None else f"{cache.nbytes:,}"] for i, (layer, cache) in enumerate(zip(layers, caches))])

# %% [markdown]
# Decoding: a prompt of 20 positions, then single tokens, each step one `shared_kv`; every step's outputs
# equal the full forward's (tests/test_gemma4.py holds every layer equal to transformers' too):

# %%
xs = [torch.randn(1, 26, 64, dtype=torch.float64) for _ in layers]  # one input per layer, for the check


def run(step_inputs, caches=None):
    shared_kv = {}
    return [layer(x, cache=cache, shared_kv=shared_kv)
            for layer, x, cache in zip(layers, step_inputs, caches or [None] * len(layers))]


with torch.no_grad():
    full = run(xs)
    worst = 0.0
    for start, stop in [(0, 20)] + [(t, t + 1) for t in range(20, 26)]:
        steps = run([x[:, start:stop] for x in xs], caches)
        worst = max(worst, max((out - ref[:, start:stop]).abs().max().item() for out, ref in zip(steps, full)))
assert worst < 1e-12
print(f"largest difference from the full forward over 26 positions: {worst:.1e}")

# %% [markdown]
# K = V saves a projection's weights; Gemma 4 pairs it with fewer K/V heads on its global layers (4 of the
# local layers' 16 in the 31B), which is where its cache shrinks. The cache still holds a key and a value, as
# transformers' does, because they differ after the norms and the rotation.
#
# ## DeepSeek-V4: a window and compressed entries
#
# DeepSeek-V4 keeps one vector per position for all heads (key and value at once), for its last 128
# positions only; beyond them its CSA layers keep one entry per 4 positions (and the indexer's key for it),
# its HCA layers one per 128. How a query uses them is on the [Sparse attention](../sparse_attention/)
# page; what the cache holds (`attention.models.published`):

# %%
from attention.models.published import compressed_cache_values

show_source(compressed_cache_values)
flash = {layer.layer_type: layer for layer in published_layers("DeepSeek-V4-Flash")}
show_table("One DeepSeek-V4-Flash layer's cache, one sequence, bfloat16 (MiB)",
           ["layer", *(f"{n // 2**20}M" if n >= 2**20 else f"{n // 1024}k" for n in CONTEXTS)],
           [[kind.replace("_", " "), *(f"{layer_cache_bytes(layer, n, torch.bfloat16) / 2**20:,.2f}" for n in CONTEXTS)]
            for kind, layer in flash.items()])

# %% [markdown]
# ## The published models
#
# The same count over each model's published configuration (`attention.models.published.kv_cache_bytes`,
# one sequence, bfloat16); every model, at any size, in the [calculator](../../kv-calculator/):

# %%
economies = {"Llama 3.1 8B": "GQA", "gpt-oss-120b": "GQA, windows", "Gemma 3 27B": "GQA, windows",
             "Gemma 4 31B": "GQA, windows, K = V, 4 global K/V heads", "Gemma 4 E2B": "MQA, windows, sharing", "DeepSeek-V3": "MLA",
             "DeepSeek-V3.2": "MLA and the indexer's keys", "DeepSeek-V4-Flash": "one K=V head, window, compression"}
show_table("Cache of one sequence, bfloat16 (GiB)", ["model", "economies", "8k", "128k", "1M"],
           [[name, words, *(f"{kv_cache_bytes(name, n) / 2**30:,.2f}" for n in CONTEXTS)]
            for name, words in economies.items()])
v3, v4 = kv_cache_bytes("DeepSeek-V3.2", 2**20), kv_cache_bytes("DeepSeek-V4-Flash", 2**20)
entries = published_entries()
shorter = [name for name in economies if entries[name]["config"].get("max_position_embeddings", 0) < 2**20]
show_markdown(f"At 1M positions DeepSeek-V4-Flash's cache is {v4 / v3:.0%} of DeepSeek-V3.2's ({v4 / 2**30:.1f} "
              f"against {v3 / 2**30:.1f} GiB). {len(shorter)} of these {len(economies)} models take fewer positions "
              f"than 1M (`max_position_embeddings`): the table counts memory, not what a model can use.")
