# %% [markdown]
# # Sparse attention
#
# A decoder's query attends to every past position: at 128k positions, 128k scores per head for each
# new token. **Sparse attention** lets each query attend to a few of them, chosen per query, so the
# attention itself stops growing with the context. What differs between the designs is what a query
# picks and how:
#
# | Design | A query picks | How it picks | It attends to |
# |---|---|---|---|
# | [NSA](https://arxiv.org/abs/2502.11089) (DeepSeek and PKU, 2025) | blocks of past tokens | the scores of its own attention over compressed blocks | compressed blocks, the chosen blocks and a sliding window, gated |
# | [MoBA](https://arxiv.org/abs/2502.13189) (Moonshot, 2025) | blocks of past tokens | its query against each block's mean key, top-k blocks, and its own block | the chosen blocks' tokens |
# | DSA ([DeepSeek-V3.2](https://github.com/deepseek-ai/DeepSeek-V3.2-Exp), 2025) | 2,048 single tokens | a *lightning indexer*: a few small ReLU heads, weighted per query | the chosen tokens, with MLA |
# | CSA and HCA ([DeepSeek-V4](https://huggingface.co/blog/deepseekv4), 2026) | entries that each compress a few tokens | CSA: an indexer's top-k over them; HCA: none, all of its more heavily compressed entries | those entries and a sliding window of recent tokens |
#
# This page builds DSA, DeepSeek-V3.2's attention (`attention.models.deepseek_v32`, API:
# [`deepseek_v32`](../../api/models/deepseek_v32/)), on the [multi-head latent attention](../mla/) of
# DeepSeek-V3, in the two forms that compute it, and measures where skipping pays on a CPU.

# %%
import torch

from attention.display import show, show_markdown, show_source, show_table
from attention.models import MODELS
from attention.models.deepseek_v3 import apply_rotary_interleaved, rotary_cos_sin
from attention.models.deepseek_v32 import index_scores, top_k_positions
from attention.plotting import plot_masks

# %% [markdown]
# ## The indexer: who gets attended to
#
# For each query `t` the indexer scores every position `s` it may see,
# `I(t, s) = Σ_j w(t, j) · ReLU(q(t, j) · k(s))`: `Hi` query heads `q(t, j)` from the layer's
# compressed query, **one** key `k(s)` per position shared by those heads, and a weight `w(t, j)` per
# head and query, both from the input. MLA then attends only to the `index_topk` positions of
# highest score. A small layer in float64 (DeepSeek-V3.2 has 64 indexer heads of 128 and keeps 2,048
# positions; here 4 heads of 32 keep 8):

# %%
torch.manual_seed(0)
config = {"model_type": "deepseek_v32", "hidden_size": 256, "num_attention_heads": 8, "q_lora_rank": 96,
          "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "rope_theta": 10000.0,
          "index_n_heads": 4, "index_head_dim": 32, "index_topk": 8}
layer = MODELS["deepseek_v32"].from_config(config, layer_idx=0).to(torch.float64).eval()
B, T = 1, 24
x = torch.randn(B, T, config["hidden_size"], dtype=torch.float64)
show_source(index_scores)
show_source(top_k_positions)

# %% [markdown]
# The queries, keys and weights, and the positions each query keeps:

# %%
with torch.no_grad():
    compressed_query = layer.q_a_layernorm(layer.q_a_proj(x))  # (B, T, q_lora_rank): MLA's c^Q, the indexer's too
    cos, sin = rotary_cos_sin(layer, 0, T, x)  # (T, Dr): the indexer's rotation
    index_q, index_k, index_w = layer.indexer.queries_keys_weights(x, compressed_query, cos, sin)
    scores = index_scores(index_q, index_k, index_w)  # (B, T, T)
causal = torch.ones(T, T, dtype=torch.bool).tril()
indices, valid = top_k_positions(scores, layer.index_topk, causal)  # (B, T, k) each
chosen = torch.zeros(B, T, T, dtype=torch.bool).scatter(-1, indices, valid)  # (B, T, T): True = attended
print(f"index_q {tuple(index_q.shape)} (B, Hi, T, Di), index_k {tuple(index_k.shape)} (B, T, Di), "
      f"index_w {tuple(index_w.shape)} (B, T, Hi)")
print(f"positions attended: {int(chosen.sum())} of the {int(causal.sum())} a causal layer attends to")

# %% tags=["hide-input"]
show(plot_masks({"causal: every past position": causal, f"DSA: the {layer.index_topk} best per query": chosen[0]},
                title="Which positions each query attends to (rows: queries, columns: positions)"))

# %% [markdown]
# The first eight queries see eight positions or fewer and keep them all; from there on each keeps
# its eight best, not necessarily the nearest. Two details are easy to get wrong:
#
# * **The rotary layout.** The indexer rotates its first `qk_rope_head_dim` features in halves,
#   pairs `(i, i + D/2)`, while MLA rotates its own interleaved, pairs `(2i, 2i + 1)` (DeepSeek's
#   inference code had it wrong until November 2025). The same weights rotated MLA's way choose other
#   positions:

# %%
def rotated_interleaved(x, cos, sin):  # MLA's layout, applied to the indexer's features (the mistake)
    half = cos.shape[-1] // 2
    return apply_rotary_interleaved(x, cos[..., :half], sin[..., :half])


with torch.no_grad():
    Dr, Hi, Di = layer.qk_rope_head_dim, config["index_n_heads"], config["index_head_dim"]
    q_raw = layer.indexer.wq_b(compressed_query).view(B, T, Hi, Di).transpose(1, 2)  # (B, Hi, T, Di), not yet rotated
    q_wrong = torch.cat([rotated_interleaved(q_raw[..., :Dr], cos, sin), q_raw[..., Dr:]], dim=-1)
    k_raw = layer.indexer.k_norm(layer.indexer.wk(x)).unsqueeze(1)
    k_wrong = torch.cat([rotated_interleaved(k_raw[..., :Dr], cos, sin), k_raw[..., Dr:]], dim=-1)[:, 0]
    wrong_indices, wrong_valid = top_k_positions(index_scores(q_wrong, k_wrong, index_w), layer.index_topk, causal)
wrong = torch.zeros_like(chosen).scatter(-1, wrong_indices, wrong_valid)
differ = int((wrong != chosen).any(-1).sum())
print(f"queries whose chosen positions change with the wrong layout: {differ} of {T}")

# %% [markdown]
# * **The per-head weights change the ranking.** With one indexer head a positive weight only scales
#   a query's scores. With several, each head's weight sets how much its ReLU scores count, so the
#   weights decide which positions win ([fla](https://github.com/fla-org/flash-linear-attention)'s DSA
#   reference says they do not). Head 0 prefers position 0, head 1 position 1:

# %%
q2 = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]])  # (B 1, Hi 2, T 1, Di 2)
k2 = torch.tensor([[[2.0, 0.0], [0.0, 1.0]]])  # (B 1, S 2, Di 2)
for weights in ([1.0, 1.0], [1.0, 3.0]):
    best = index_scores(q2, k2, torch.tensor([[weights]])).argmax(-1).item()
    print(f"head weights {weights}: position {best} wins")

# %% [markdown]
# ## Two forms of the same attention
#
# transformers (like fla and MaxText) applies DSA as a **mask**: it computes every score of dense
# attention, then masks all but the chosen positions. Correct, and it skips nothing. The **gather**
# form reads the chosen positions' latents and rotary keys by index and attends over those only, on
# MLA's absorbed path (the up-projections folded into the query and the output, so every head reads
# the latent itself), queries in blocks:

# %% tags=["hide-input"]
show_source(type(layer).attend_gathered)

# %% [markdown]
# The two forms, and the naive path (each head's keys and values expanded from the latent), with the
# same weights, in float64:

# %%
forms = {name: MODELS["deepseek_v32"].from_config(config, 0, **options).to(torch.float64).eval()
         for name, options in {"gather": {}, "mask": {"sparse": "mask"},
                               "mask, naive path": {"sparse": "mask", "path": "naive"}}.items()}
for module in forms.values():
    module.load_state_dict(layer.state_dict())
with torch.no_grad():
    outputs = {name: module(x) for name, module in forms.items()}
differences = {name: (out - outputs["gather"]).abs().max().item() for name, out in outputs.items()}
assert max(differences.values()) < 1e-12
print(", ".join(f"{name}: {difference:.1e}" for name, difference in differences.items()
                if name != "gather"), "(largest difference from the gather form)")

# %% [markdown]
# tests/test_dsa.py holds both forms equal to transformers' `DeepseekV32Attention` (fed what its tiny
# model feeds the layer), to a float64 reference that picks positions query by query, and, decoding,
# to the full forward at every step.
#
# ## What it keeps to decode
#
# A DSA layer decodes with MLA's latent cache plus the indexer's key of every position
# (`IndexedLatentCache`): per position 512 latent and 64 rotary values for MLA, 128 more for the
# indexer, the same for every head. The whole model's cache for one sequence, from
# `attention.models.published.kv_cache_bytes` (bfloat16):

# %%
from attention.models.published import kv_cache_bytes

GiB = 2**30
rows = [(name, *(f"{kv_cache_bytes(name, n) / GiB:.2f}" for n in (4096, 32768, 131072)))
        for name in ("DeepSeek-V3", "DeepSeek-V3.2")]
show_table("Cache of one sequence (GiB, bfloat16)", ["model", "4k", "32k", "128k"], rows)
extra = kv_cache_bytes("DeepSeek-V3.2", 131072) / kv_cache_bytes("DeepSeek-V3", 131072) - 1
show_markdown(f"The indexer's keys make DeepSeek-V3.2's cache {extra:.0%} larger than DeepSeek-V3's (DeepSeek's own "
              "kernels keep them in FP8, half of that); what it saves is reading: each new token's attention "
              "reads the latents of 2,048 positions, however long the context.")

# %% [markdown]
# ## DeepSeek-V4: compress, then choose
#
# DeepSeek-V4 (`attention.models.deepseek_v4`, API: [`deepseek_v4`](../../api/models/deepseek_v4/)) keeps one
# vector per position, read by every head as both key and value, but only for a sliding window of recent
# positions. Past the window a query sees **compressed entries**, each pooling `m` positions with softmax
# weights learned per feature. Its CSA layers (`m` = 4, windows overlapping) let an indexer choose
# `index_topk` entries per query, as DSA chooses positions; its HCA layers (`m` = 128) attend to every entry.
# The pooling of `m` positions into one entry:

# %%
from attention.models.deepseek_v4 import Compressor, entry_visible, rope_cos_sin, window_mask

show_source(Compressor.pool)
show_source(entry_visible)

# %% [markdown]
# Which positions a query reaches, in a tiny layer of each kind (a window of 6, CSA every 4 positions
# keeping its 2 best entries, HCA every 8), each entry drawn over the `m` positions it closes:

# %%
import functools

v4_config = {"model_type": "deepseek_v4", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 32,
             "q_lora_rank": 24, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 6, "index_n_heads": 2,
             "index_head_dim": 16, "index_topk": 2, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6,
             "rope_theta": 10000.0, "compress_rope_theta": 160000.0, "num_hidden_layers": 3,
             "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
             "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}}
T4 = 40
x4 = torch.randn(1, T4, 64, dtype=torch.float64)
positions = torch.arange(T4)
reach = {}  # layer kind -> (T, T): 2 = attended itself (window), 1 = through an entry, 0 = not at all
for layer_idx, kind in enumerate(v4_config["layer_types"]):
    v4 = MODELS["deepseek_v4"].from_config(v4_config, layer_idx).to(torch.float64).eval()
    seen = 2 * window_mask(positions, positions, v4.sliding_window).long()  # (T, T)
    if v4.compressor is not None:
        with torch.no_grad():
            q_residual = v4.q_a_norm(v4.q_a_proj(x4))  # (B, T, q_lora_rank)
            rope = functools.partial(rope_cos_sin, v4, like=x4)
            _, visible = v4.compressor(x4, q_residual, positions, rope)  # (1, 1, T, N): entries whose window closed
            if kind == "compressed_sparse_attention":
                visible = visible & v4.compressor.indexer.chosen(x4, q_residual, positions, rope, None, v4.index_topk)
        through_entry = visible[0, 0].repeat_interleave(v4.compress_rate, dim=-1)  # (T, N * m): entry -> its positions
        seen[:, :through_entry.shape[1]] = torch.maximum(seen[:, :through_entry.shape[1]], through_entry.long())
    reach[kind] = seen

# %% tags=["hide-input"]
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

fig = Figure(figsize=(11, 4.2), layout="constrained")
axes = fig.subplots(1, 3, sharey=True)
for ax, (kind, seen) in zip(axes, reach.items()):
    ax.imshow(seen, cmap=ListedColormap(["#f2f2f2", "#9ecae1", "#08519c"]), vmin=0, vmax=2)
    ax.set(title=kind.replace("_", " "), xlabel="position (key)")
axes[0].set_ylabel("query position")
axes[0].legend(handles=[Patch(color="#08519c", label="attended itself (the window)"),
                        Patch(color="#9ecae1", label="through a compressed entry")], loc="upper right", fontsize=8)
show(fig)

# %% [markdown]
# At DeepSeek-V4-Flash's sizes (a window of 128, CSA keeping 512 entries of 4 positions, HCA every 128),
# the keys one query attends to, against dense attention's, from the layers built from its published
# configuration:

# %%
from attention.models.published import published_layers

flash = {layer.layer_type: layer for layer in published_layers("DeepSeek-V4-Flash")}


def keys_per_query(layer, t):
    """Keys the query at position t attends to: its window, and the entries it may see (CSA: at most index_topk)."""
    window = min(t + 1, layer.sliding_window)
    if layer.compress_rate is None:
        return window
    entries = (t + 1) // layer.compress_rate
    return window + (min(entries, layer.index_topk) if layer.index_topk else entries)


contexts = (4096, 131072, 1048576)
show_table("Keys one query attends to, at its position",
           ["layer", *(f"{t // 2**20}M" if t >= 2**20 else f"{t // 1024}k" for t in contexts)],
           [[kind.replace("_", " "), *(f"{keys_per_query(layer, t - 1):,}" for t in contexts)]
            for kind, layer in flash.items()] + [["dense attention", *(f"{t:,}" for t in contexts)]])

# %% [markdown]
# tests/test_deepseek_v4.py holds each kind of layer equal to transformers' `DeepseekV4Attention` (fed what
# its tiny model feeds the layer, and while it decodes on its own cache), to a float64 reference composed
# from `attention.reference`, and, decoding, to the full forward at every step. Like transformers, CSA here
# scores every visible entry and masks the unchosen ones; what V4 saves in memory is on the
# [KV economies](../kv_economies/) page.

# %% [markdown]
# ## Measured: where skipping pays on a CPU
#
# The benchmark's sparse profile times one DeepSeek-V3.2 layer's attention after its projections
# (DeepSeek-V3.2's widths; the heads below) in each form, the indexer alone and dense latent attention,
# by prompt length and by cached context, each row checked against float64 first. Dense attention through
# SDPA runs each part the way it costs least, as DeepSeek's own code does: a prompt in MHA mode (every
# head's keys and values decompressed from the latent, narrow heads), a decode step in MQA mode (the
# absorbed query against the latent cache, never expanded); DSA's gather form works in MQA mode either way,
# as DeepSeek's sparse kernels do. The recorded run, read by `attention.report.sparse`; every run on the
# [Benchmarks](../../benchmarks/) page:

# %%
from attention.report.long import recorded
from attention.report.sparse import plot, sparse_section

sparse_path, sparse_run = recorded("sparse")  # float32

# %% tags=["hide-input"]
show(plot(sparse_run, "prefill"))
show(plot(sparse_run, "decode"))
show_markdown(sparse_section(sparse_path, sparse_run))
