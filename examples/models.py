# %% [markdown]
# # Attention in current open models
#
# Llama 3 and 4, Mistral, Qwen3, OLMo 2, Gemma 2 and 3 and gpt-oss all run grouped-query attention with
# rotary embeddings ([Grouped-query and multi-query attention](../gqa/), [Position encodings](../positional/)),
# and each changes it in a few lines: queries and keys normalised, logits soft-capped, a query scale that is
# not `1 / sqrt(head_dim)`, local (sliding-window or chunked) layers between global ones, learned sinks that
# let a head attend to nothing, RoPE stretched for long contexts or dropped altogether. This page shows
# Llama's layer whole, then each other family as the lines that differ from it, checks every family against
# the float64 reference, and measures what their KV caches and decode steps cost. Each family is a file of
# `attention/models/` ([API](../../api/models/)), built from a model's configuration with transformers'
# parameter names (a real checkpoint's layer loads unchanged; `tests/test_models.py` proves each equal to
# transformers' own). Gemma 4 and DeepSeek-V4, which change what the cache holds, have pages of their own:
# [KV-cache economies](../kv_economies/) and [Sparse attention](../sparse_attention/).

# %%
import difflib
import inspect

import torch
import torch.nn.functional as F

from attention.display import show, show_markdown, show_source, show_table
from attention.models import MODELS
from attention.models.llama import LlamaAttention
from attention.models.published import PUBLISHED

torch.manual_seed(0)


def layers_of(config):
    """Every layer of a published model, built on the meta device: attributes and shapes, no weights allocated."""
    with torch.device("meta"):
        return [MODELS[config["model_type"]].from_config(config, i) for i in range(config["num_hidden_layers"])]


def span(layer):
    """The keys a local layer's query can see at most (its window, or Llama 4's chunk); None for a global layer."""
    return layer.sliding_window or getattr(layer, "attention_chunk_size", None)


MODEL_LAYERS = {name: layers_of(entry["config"]) for name, entry in PUBLISHED.items()}

# %% [markdown]
# ## The models at a glance
#
# Every cell below is read off the layers built from each model's published configuration
# (`attention/models/published.py` types the fields once, each entry linking its `config.json`), on
# PyTorch's `meta` device, which gives the layers their attributes and shapes without allocating a weight:

# %%
def rope_words(parameters):
    """A layer's RoPE in words: its kind and factor where it stretches the frequencies, and its base θ."""
    if parameters is None:
        return "none (NoPE)"
    kind = "" if parameters["rope_type"] == "default" else f"{parameters['rope_type']} ×{parameters['factor']:g}, "
    return f"{kind}θ {parameters['rope_theta']:,.0f}"


rows = []
for name, layers in MODEL_LAYERS.items():
    first, local = layers[0], [layer for layer in layers if span(layer)]
    windows = "/".join(f"{size:,}" for size in sorted({span(layer) for layer in local}))
    rows.append((f"[{name}]({PUBLISHED[name]['source']})",
                 f"{first.num_attention_heads}/{first.num_key_value_heads} × {first.head_dim}", f"1/\u2060√{round(first.scaling**-2)}",  # a word joiner: no line break
                 ", ".join(sorted({layer.qk_norm for layer in layers} - {None})) or "—",
                 f"cap {first.attn_logit_softcapping:g}" if getattr(first, "attn_logit_softcapping", None)
                 else "sinks" if hasattr(first, "sinks") else "—",
                 f"{windows}: {len(local)}/{len(layers)}" if local else f"0/{len(layers)}",
                 "; ".join(dict.fromkeys(rope_words(layer.rope_parameters) for layer in layers))))

# %% tags=["hide-input"]
show_table("The attention of each model, from its published config.json",
           ["model", "query/K/V heads × dim", "scale", "QK-norm", "soft-cap or sinks", "local layers: keys, how many", "RoPE"], rows)

# %% [markdown]
# ## The base: Llama's layer
#
# `LlamaAttention` (`attention/models/llama.py`) is plain grouped-query attention with RoPE: project,
# split heads, rotate queries and keys by their positions, attend, project back. Mistral and Qwen2 are the
# same class; their configurations switch on a window (Mistral 7B v0.1) or q/k/v biases (Qwen2). `start`
# is the position of the chunk's first token: 0 without a cache, the cache's length with one. The
# rotation itself (`rotary_cos_sin`, [API](../../api/models/llama/)) is the [Position
# encodings](../positional/) page's rotate-half RoPE.

# %% tags=["hide-input"]
show_source(LlamaAttention.forward)
show_source(LlamaAttention.qkv)

# %% [markdown]
# ### Pitfall: a cached step rotated at position 0
#
# The classic decode bug: the new token's query and key rotated as if the token were the first
# (`qkv(x, 0)`) instead of at the cache's length. Its key is then cached at the wrong angle, and its query
# meets every cached key at the wrong distance. Failing, then as `forward` does it:

# %%
tiny = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "rope_theta": 10000.0}
layer = LlamaAttention(tiny, layer_idx=0).eval()
x = torch.randn(1, 12, 64)
with torch.no_grad():
    expected = layer(x)[:, -1:]  # the last token's output in the full forward pass: (B, 1, C)
    cache = layer.new_cache(batch_size=1, capacity=12)
    layer(x[:, :11], cache=cache)  # 11 tokens cached, their keys rotated at positions 0 .. 10
    errors = {}
    for label, start in (("rotated at position 0", 0), (f"rotated at cache.length = {cache.length}", cache.length)):
        q, k, v = layer.qkv(x[:, 11:], start)  # (B, H, 1, D), (B, H_kv, 1, D), (B, H_kv, 1, D)
        keys, values, _ = cache.update(k, v)  # (B, H_kv, 12, D) each
        out = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)  # (B, H, 1, D)
        out = layer.o_proj(out.transpose(1, 2).reshape(1, 1, -1))  # (B, 1, C)
        cache.rewind(11)  # forget the step, to take it again
        errors[label] = (out - expected).abs().max().item()
        print(f"{label:30} max |error| = {errors[label]:.1e}")
assert errors["rotated at position 0"] > 1e-2 and errors[f"rotated at cache.length = {cache.length}"] < 1e-5

# %% [markdown]
# ## What each model changes, in lines
#
# Each diff below is generated from a family's file, against Llama's functions above.

# %% tags=["hide-input"]
from attention.models.gemma2 import softcapped_attention
from attention.models.gpt_oss import attention_with_sinks
from attention.models.llama4 import Llama4TextAttention, chunk_mask
from attention.models.olmo2 import Olmo2Attention
from attention.models.qwen3 import Qwen3Attention


def source_diff(title, before, after):
    """Markdown: a title line over the unified diff of two functions' sources (without the file headers)."""
    lines = difflib.unified_diff(inspect.getsource(before).splitlines(), inspect.getsource(after).splitlines(),
                                 lineterm="", n=1)
    return f"**{title}**\n\n```diff\n" + "\n".join(list(lines)[2:]) + "\n```"


# %% [markdown]
# ### QK-norm: Qwen3, OLMo 2, Gemma 3
#
# Normalising queries and keys bounds the logits `q · k` that otherwise grow during training
# (Dehghani et al., <https://arxiv.org/abs/2302.05442>). Qwen3 normalises each head over its `head_dim`
# features, one weight vector shared by all heads; OLMo 2 normalises the whole projection, `H * D`
# features, each with its own weight; both before RoPE, so the rotation still encodes the position.
# Gemma 3 does as Qwen3, with Gemma's RMSNorm (weights stored as `scale - 1`). Qwen3's and OLMo 2's
# lines against Llama's:

# %% tags=["hide-input"]
show_markdown(source_diff("Qwen3 against Llama: qkv", LlamaAttention.qkv, Qwen3Attention.qkv))
show_markdown(source_diff("OLMo 2 against Llama: qkv", LlamaAttention.qkv, Olmo2Attention.qkv))

# %% [markdown]
# ### Soft-capping and the query scale: Gemma 2
#
# Gemma 2 squashes every score through `cap * tanh(score / cap)`, the identity near zero and flat towards
# `±cap` (its cap, 50, pulls outliers in and leaves ordinary scores alone), and scales queries by
# `query_pre_attn_scalar ** -0.5`. SDPA has no soft-cap, so the attention is written out; its scores take
# each K/V head's query heads as one matrix (`attention.decoding.grouped_scores`), so a cached K/V head is
# read once for its group:

# %% tags=["hide-input"]
show_source(softcapped_attention)

# %% [markdown]
# ### Learned sinks: gpt-oss
#
# Each head of gpt-oss has one learned logit that every query's softmax includes, then drops: a head's
# weights over the keys then sum to `1 - sigmoid(sink - lse)`, `lse` the log-sum-exp of its scores, so a
# head whose sink outweighs its scores attends to almost nothing. Its `forward` is Llama's with this
# function in place of SDPA:

# %% tags=["hide-input"]
show_source(attention_with_sinks)

# %% [markdown]
# ### Chunks, NoPE and an L2 norm: Llama 4
#
# Llama 4's text model has two kinds of layer. Three in four rotate their queries and keys (in Meta's
# interleaved layout, pairs `(2i, 2i + 1)`), then L2-normalise them per head, and attend only within their
# chunk of 8,192 positions; every fourth has no position encoding at all (NoPE) and sees every earlier key,
# its queries scaled up with the position so that attention stays sharp over millions of keys
# (<https://arxiv.org/abs/2501.19399>):

# %% tags=["hide-input"]
show_markdown(source_diff("Llama 4 against Llama: qkv", LlamaAttention.qkv, Llama4TextAttention.qkv))
show_source(chunk_mask)

# %% [markdown]
# ### RoPE for long contexts: Llama 3.1, Gemma 3, gpt-oss
#
# Every family here but Llama 4 (interleaved pairs, above) rotates in the rotate-half layout, pairing
# feature `i` with `i + D/2` (DeepSeek-V3, on the [MLA page](../mla/), interleaves too). The frequencies
# differ: Llama 3.1 divides the slow ones by 8 (`"llama3"`), Gemma 3's global layers all of them
# (`"linear"`), gpt-oss's YaRN blends by pair index (`rope_frequencies`, [API](../../api/models/llama/)).
#
# ### Windows and their caches: every local layer
#
# A sliding layer's query at `i` sees keys `i - window < j <= i`, as transformers' masks do; its
# `new_cache` returns the [KV cache page's](../kv_cache/#pitfall-3-a-cache-that-must-stay-bounded) ring
# buffer, so its memory stops growing at the window (Llama 4's chunks: the same ring, masked to the chunk).

# %% [markdown]
# ## Checked against the float64 reference
#
# `attention.reference.reference_model_attention` is the float64 layer written from the papers; what it
# needs to know of a layer it reads from the model's configuration (`model_reference_kwargs`), never from
# the layer. Each published model is shrunk here to 64 features in heads of 16 (its grouping, schedule,
# RoPE and norms kept; windows of 8 keys, so that 24 tokens run past them), its weights drawn at random;
# one layer of each kind is compared in float64 and float32, and so is decoding with the layer's cache (a
# prompt of 9 tokens, then one token per step):

# %%
from attention.reference import model_reference_kwargs, reference_model_attention

T_CHECK, WINDOW_CHECK = 24, 8


def shrunk(config):
    """`config` at 64 features, heads of 16, windows and chunks of at most 8 keys: the same mechanisms, tiny."""
    group = config["num_attention_heads"] // (config.get("num_key_value_heads") or config["num_attention_heads"])
    num_kv_heads = max(1, 8 // group)
    small = {**config, "hidden_size": 64, "head_dim": 16, "num_attention_heads": num_kv_heads * group,
             "num_key_value_heads": num_kv_heads}
    if config.get("sliding_window"):
        small["sliding_window"] = min(config["sliding_window"], WINDOW_CHECK)
    if config.get("attention_chunk_size"):  # Llama 4: chunks of 8, and a temperature that grows every 4 positions
        small.update(attention_chunk_size=min(config["attention_chunk_size"], WINDOW_CHECK), floor_scale=4)
    if config["model_type"] in ("gemma2", "gemma3_text"):  # keep the scale's ratio to head_dim
        small["query_pre_attn_scalar"] = config["query_pre_attn_scalar"] * 16 // (config.get("head_dim") or 256)
    return small


def randomised(module):
    """`module` with every parameter drawn at random (norm weights and sinks too), float64, eval mode."""
    module = module.to(torch.float64).eval()
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.normal_(0.0, 2.0 if name == "sinks" else 0.3)
    return module


checks = {}  # model -> a tuple per kind of layer checked
for name, entry in PUBLISHED.items():
    config = shrunk(entry["config"])
    kinds = {}  # layer_type -> the first layer of that kind
    for i, layer in enumerate(layers_of(config)):
        kinds.setdefault(layer.layer_type, i)
    for layer_type, layer_idx in kinds.items():
        module = randomised(MODELS[config["model_type"]].from_config(config, layer_idx))
        x = torch.randn(2, T_CHECK, 64, dtype=torch.float64)
        settings = model_reference_kwargs(config, layer_idx, torch.arange(T_CHECK), type(module))
        expected, _ = reference_model_attention(x, module.state_dict(), **settings)  # (B, T, C), float64
        with torch.no_grad():
            error64 = (module(x) - expected).abs().max().item()
            module32, x32 = module.to(torch.float32), x.to(torch.float32)
            error32 = (module32(x32).double() - expected).abs().max().item()
            cache = module32.new_cache(2, capacity=T_CHECK)
            steps = [module32(x32[:, :9], cache=cache)] + [module32(x32[:, t:t + 1], cache=cache) for t in range(9, T_CHECK)]
            decode_error = (torch.cat(steps, dim=1).double() - expected).abs().max().item()
        assert error64 < 1e-10 and error32 < 1e-4 and decode_error < 1e-4, (name, layer_type)
        checks.setdefault(name, []).append((layer_type.split("_")[0], error64, error32, decode_error, cache.keys.shape[2]))

# %% tags=["hide-input"]
show_table(f"Each model's layers (shrunk, random weights) against the float64 reference, {T_CHECK} tokens, batch 2: "
           "largest |error|", ["model", "layers checked", "float64", "float32", "decoding", "cache slots"],
           [(name, " / ".join(layer[0] for layer in found), *(f"{max(layer[i] for layer in found):.0e}" for i in (1, 2, 3)),
             " / ".join(str(layer[4]) for layer in found)) for name, found in checks.items()])

# %% [markdown]
# Decoding in float32 with the cache stays as close to the float64 full pass as the full float32 pass,
# local layers past their window included, where the cache holds the window's 8 slots, not 24.
#
# ## Local and global layers, across the depth
#
# Which layers are local (a sliding window or a chunk) and which global, for each model with local
# layers, as its configuration makes them (`layer_types`, or the rule transformers applies where a
# published file has none):

# %% tags=["hide-input"]
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

windowed = {name: layers for name, layers in MODEL_LAYERS.items() if any(span(layer) for layer in layers)}
depth = max(len(layers) for layers in windowed.values())
fig = Figure(figsize=(10, 0.42 * len(windowed) + 1.3), layout="constrained")
ax = fig.subplots()
grid = torch.full((len(windowed), depth), float("nan"))
for row_index, layers in enumerate(windowed.values()):
    grid[row_index, :len(layers)] = torch.tensor([0.0 if span(layer) else 1.0 for layer in layers])
ax.imshow(grid, cmap=ListedColormap(["#9ecae1", "#08306b"]), aspect="auto", interpolation="nearest", vmin=0, vmax=1)
ax.set_yticks(range(len(windowed)), [f"{name} ({'chunk' if getattr(layers[0], 'attention_chunk_size', None) else 'window'} "
                                     f"{max(span(layer) or 0 for layer in layers):,})" for name, layers in windowed.items()])
ax.set_xticks(range(0, depth, 4))
ax.set_xticks([i + 0.5 for i in range(depth - 1)], minor=True)
ax.grid(which="minor", axis="x", color="white", linewidth=0.5)
ax.tick_params(which="minor", length=0)
ax.set(title="Local (light: sliding window or chunk) and global (dark) layers", xlabel="layer index")
show(fig)

# %% [markdown]
# ## The KV cache at the published sizes
#
# A global layer caches `2 * H_kv * D` numbers per token (keys and values); a local layer never more than
# its window's worth. `attention.models.published.layer_cache_bytes` counts one layer's cache
# ([API](../../api/models/#attention.models.published.layer_cache_bytes)); in bfloat16, batch 1, each count
# checked against a cache allocated for one layer of each kind:

# %%
from attention.decoding import KVCache, SlidingWindowKVCache
from attention.models.published import layer_cache_bytes

BYTES = 2  # bfloat16


def model_cache_bytes(layers, context):
    """Bytes of the KV cache of every layer at `context` positions, a local layer holding at most its window."""
    return sum(layer_cache_bytes(layer, context, torch.bfloat16) for layer in layers)


rows = []
for name, layers in MODEL_LAYERS.items():
    for layer in {span(layer): layer for layer in layers}.values():  # one layer of each span (None: global)
        sizes = dict(batch_size=1, num_kv_heads=layer.num_key_value_heads, head_dim=layer.head_dim, dtype=torch.bfloat16)
        cache = SlidingWindowKVCache(window=span(layer), **sizes) if span(layer) else KVCache(capacity=256, **sizes)
        assert cache.nbytes == model_cache_bytes([layer], span(layer) or 256)
    max_context = PUBLISHED[name]["config"]["max_position_embeddings"]
    all_global = sum(2 * layer.num_key_value_heads * layer.head_dim * BYTES * max_context for layer in layers)
    rows.append((name, f"{model_cache_bytes(layers, 1) / 1024:,.0f}",
                 f"{model_cache_bytes(layers, min(32768, max_context)) / 2**30:,.2f}", f"{max_context:,}",
                 f"{model_cache_bytes(layers, max_context) / 2**30:,.2f}",
                 f"{model_cache_bytes(layers, max_context) / all_global:.0%}"))

# %% tags=["hide-input"]
all_global_rows = [row for row in rows if row[-1] == "100%"]
show_table("KV cache per sequence in bfloat16 (checked against allocated caches' nbytes)",
           ["model", "KiB per token", "GiB at 32k (or max)", "max context", "GiB at max context", "of all-global"],
           [row for row in rows if row[-1] != "100%" or row is all_global_rows[0]])
gemma3, llama = MODEL_LAYERS["Gemma 3 27B"], MODEL_LAYERS["Llama 3.1 8B"]
show_markdown(
    f"At 128k tokens Gemma 3 27B caches {model_cache_bytes(gemma3, 131072) / 2**30:.1f} GiB, where Llama 3.1 8B, "
    f"all {len(llama)} of its layers global, caches {model_cache_bytes(llama, 131072) / 2**30:.1f} GiB; "
    f"with all its layers global Gemma 3 27B would cache "
    f"{sum(2 * layer.num_key_value_heads * layer.head_dim * BYTES * 131072 for layer in gemma3) / 2**30:.1f} GiB. "
    f"Of the {len(all_global_rows)} models whose layers are all global ("
    + ", ".join(row[0] for row in all_global_rows) + "), the table shows the first.")

# %% [markdown]
# ## Decode step time per layer type
#
# The benchmark's decode profile times one decode step of one layer of each kind, built by `from_config`
# at the profile's head count and size with each model's own grouping, window, norms, scale, RoPE and
# sinks (Llama 4 Scout's with 4 query heads per K/V head, as its 40:8 does not divide the profile's heads),
# each step checked against `reference_model_attention`. Llama 3.1's global layer and the local and global
# layers of Gemma 2 27B and gpt-oss-120b, from the recorded run, read by `attention.report.decode` (Gemma 3's
# and Llama 4's layers too on the Benchmarks page):

# %%
from attention.report.decode import layers_section
from attention.report.long import recorded

LAYER_ROWS = ["Llama-3", "Gemma-2-local", "Gemma-2-global", "gpt-oss-local", "gpt-oss-global"]  # the profile's names
path, decode_run = recorded("decode")  # float32

# %% tags=["hide-input"]
show_markdown(layers_section(path, decode_run, LAYER_ROWS))
