# %% [markdown]
# # Attention in current open models
#
# Llama 3 and 4, Mistral, Qwen3, OLMo 2, Gemma 2 and 3 and gpt-oss all run grouped-query attention with
# rotary embeddings ([Grouped-query and multi-query attention](../gqa/), [Position encodings](../positional/)),
# and each changes it in a few lines: queries and keys normalised per head or over the whole projection,
# logits soft-capped, a query scale that is not `1 / sqrt(head_dim)`, local (sliding-window or chunked) layers
# between global ones, learned sinks that let a head attend to nothing, RoPE stretched for long contexts or
# dropped altogether. This page
# shows each change as the lines that differ, checks every family against the float64 reference, and
# draws what the changes do: to the weights, to the scores, across the layers, to the KV cache.
#
# Each family is one file of `attention/models/` ([API](../../api/models/)), built from a model's
# configuration with transformers' parameter names, so a real checkpoint's layer loads unchanged.
# The tests (`tests/test_models.py`) also prove every layer equal to transformers' own, on tiny random
# models whose hooks capture what the real model feeds each layer; transformers is a test-only
# dependency, so that check runs in the tests, not on this page.

# %%
import difflib
import inspect
import math
import os

import matplotlib
import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from attention.decoding import KVCache, SlidingWindowKVCache, grouped_scores, uses_grouped_matmuls
from attention.display import show, show_markdown, show_source, show_table
from attention.models import MODELS
from attention.models.flex import flex_forward
from attention.models.gemma2 import Gemma2Attention, softcapped_attention
from attention.models.gemma3 import Gemma3Attention, Gemma3RMSNorm
from attention.models.gpt_oss import GptOssAttention, attention_with_sinks
from attention.models.llama import LlamaAttention
from attention.models.llama4 import Llama4TextAttention, chunk_mask
from attention.models.olmo2 import Olmo2Attention
from attention.models.published import PUBLISHED
from attention.models.qwen3 import Qwen3Attention
from attention.reference import model_reference_kwargs, reference_kernel, reference_model_attention

torch.manual_seed(0)


def layers_of(config):
    """Every layer of a published model, built on the meta device: attributes and shapes, no weights allocated."""
    with torch.device("meta"):
        return [MODELS[config["model_type"]].from_config(config, i) for i in range(config["num_hidden_layers"])]


def span(layer):
    """The keys a local layer's query can see at most (its window, or Llama 4's chunk); None for a global layer."""
    return layer.sliding_window or getattr(layer, "attention_chunk_size", None)


MODEL_LAYERS = {name: layers_of(entry["config"]) for name, entry in PUBLISHED.items()}


# %% tags=["hide-input"]
def ordinal(n):
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def schedule_text(layers):
    """'4,096 keys on 21 of 42 layers (every 2nd layer global)' and the like, from the layers' kinds."""
    local = [layer for layer in layers if span(layer)]
    if not local:
        return f"none: all {len(layers)} global"
    spans = "/".join(f"{w:,}" for w in sorted({span(layer) for layer in local}))
    what = f"chunks of {spans}" if getattr(local[0], "attention_chunk_size", None) else f"{spans} keys"
    if len(local) == len(layers):
        return f"{what} on all {len(layers)} layers"
    global_at = [i for i, layer in enumerate(layers) if not span(layer)]
    step = global_at[1] - global_at[0] if len(global_at) > 1 else None
    periodic = step and global_at == list(range(step - 1, len(layers), step))
    rule = f"every {ordinal(step)} layer global" if periodic else f"global at {global_at}"
    return f"{what} on {len(local)} of {len(layers)} layers ({rule})"


def rope_text(layers):
    """RoPE variant and base per kind of layer, e.g. 'llama3 ×8, θ 500,000'."""
    texts = {}
    for layer in layers:
        parameters = layer.rope_parameters
        if parameters is None:
            text = "none (NoPE)"
        else:
            text = f"θ {parameters['rope_theta']:,.0f}"
            if parameters["rope_type"] != "default":
                text = f"{parameters['rope_type']} ×{parameters['factor']:g}, {text}"
        texts.setdefault(text, []).append("local" if span(layer) else "global")
    if len(texts) == 1:
        return next(iter(texts))
    return "; ".join(f"{sorted(set(kinds))[0]}: {text}" for text, kinds in texts.items())


def qk_norm_text(layers):
    kinds = {layer.qk_norm for layer in layers}
    if kinds == {None}:
        return "—"
    layer = next(layer for layer in layers if layer.qk_norm)
    if layer.qk_norm == "l2":
        return f"L2 (RMS, no weight), per head, after RoPE, on the {sum(1 for x in layers if x.qk_norm)} RoPE layers"
    gemma = isinstance(layer.q_norm, Gemma3RMSNorm)
    where = {"head": "per head", "projection": "whole projection"}[layer.qk_norm]
    return f"RMSNorm{' (1 + w)' if gemma else ''}, {where}, before RoPE"


def softcap_text(layer):
    cap = getattr(layer, "attn_logit_softcapping", None)
    return "—" if cap is None else f"{cap:g}"


def scale_text(layer):
    scalar = round(layer.scaling**-2)
    return "1/√D" if math.isclose(layer.scaling, layer.head_dim**-0.5) else f"1/√{scalar} (D = {layer.head_dim})"


# %% [markdown]
# ## The models at a glance
#
# Every cell below is read off a layer built from the model's published configuration
# (`attention/models/published.py` types the fields once, each entry linking its `config.json`): the
# layers are built on PyTorch's `meta` device, which gives them their shapes without allocating a weight.

# %% tags=["hide-input"]
rows = []
for name, layers in MODEL_LAYERS.items():
    first = layers[0]
    H, H_kv = first.num_attention_heads, first.num_key_value_heads
    rows.append((f"[{name}]({PUBLISHED[name]['source']})", f"{H} / {H_kv} = {H // H_kv}", first.head_dim,
                 scale_text(first), qk_norm_text(layers), softcap_text(first),
                 schedule_text(layers), "learned, 1 per head" if hasattr(first, "sinks") else "—", rope_text(layers)))
show_table("The attention of each model, from its published config.json",
           ["model", "query heads / K/V heads", "head dim D", "scale", "QK-norm", "soft-cap", "window and schedule",
            "sinks", "RoPE"], rows)

# %% [markdown]
# ## What each model changes, in lines
#
# `LlamaAttention` (`attention/models/llama.py`) is plain grouped-query attention with RoPE: project, split
# heads, rotate queries and keys, attend on `F.scaled_dot_product_attention`, project back. Mistral and Qwen2
# are the same class; their configurations switch on a window (Mistral 7B v0.1) or q/k/v biases (Qwen2).
# Each other family is a file of its own that repeats Llama's helpers as marked, machine-checked copies;
# the diffs below are generated from the files, against Llama's.

# %% tags=["hide-input"]
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

# %% tags=["hide-input"]
show_markdown(source_diff("Qwen3 against Llama: qkv (queries, keys and values of a chunk)", LlamaAttention.qkv, Qwen3Attention.qkv))
show_markdown(source_diff("OLMo 2 against Llama: qkv", LlamaAttention.qkv, Olmo2Attention.qkv))
show_markdown(source_diff("OLMo 2 against Llama: the constructor", LlamaAttention.__init__, Olmo2Attention.__init__))

# %% [markdown]
# ### Soft-capping and the query scale: Gemma 2
#
# Gemma 2 squashes every score through `cap * tanh(score / cap)` (cap 50) and scales queries by
# `query_pre_attn_scalar ** -0.5`. SDPA has no soft-cap, so the attention is written out:

# %% tags=["hide-input"]
show_markdown(source_diff("Gemma 2 against Llama: the constructor", LlamaAttention.__init__, Gemma2Attention.__init__))
show_markdown("**Gemma 2's attention**")
show_source(softcapped_attention)
show_markdown("Its scores take each K/V head's query heads as one matrix, so the keys and values are read where the "
              "cache holds them (a matmul broadcasting them over the query heads would copy the cache once per query "
              "head at every step), through `attention.decoding.grouped_scores`, which the grouped-query layers' "
              "decode kernel and gpt-oss's attention, below, share:")
show_source(grouped_scores)

# %% [markdown]
# ### Local layers, their RoPE base, QK-norm: Gemma 3
#
# Gemma 3 drops the soft-cap for a QK-norm in Gemma's form (weights stored as `scale - 1`), keeps five
# local layers for each global one, and rotates local layers with a base of 10,000, global ones with
# 1,000,000:

# %% tags=["hide-input"]
show_markdown(source_diff("Gemma 3 against Llama: the constructor", LlamaAttention.__init__, Gemma3Attention.__init__))
show_markdown("**Gemma's RMSNorm**")
show_source(Gemma3RMSNorm.forward)

# %% [markdown]
# ### Learned sinks: gpt-oss
#
# Each head of gpt-oss has one learned logit that every query's softmax includes, then drops:

# %% tags=["hide-input"]
show_markdown(source_diff("gpt-oss against Llama: the constructor", LlamaAttention.__init__, GptOssAttention.__init__))
show_markdown(source_diff("gpt-oss against Llama: forward", LlamaAttention.forward, GptOssAttention.forward))
show_markdown("**gpt-oss's attention**")
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
show_markdown("**Which keys a chunked layer's query sees**")
show_source(chunk_mask)

# %% [markdown]
# ### RoPE for long contexts: Llama 3.1, Gemma 3, gpt-oss
#
# Every family rotates queries and keys in the rotate-half layout (pair `i` with `i + D/2`). What
# differs is the frequencies: Llama 3.1 divides the slow ones by 8 (`"llama3"`), Gemma 3's global layers
# divide all of them by 8 (`"linear"`), gpt-oss's YaRN blends by pair index and scales cos and sin. One
# function, repeated in every file, reads them off the configuration:

# %% tags=["hide-input"]
show_source(inspect.getmodule(LlamaAttention).rope_frequencies)

# %% [markdown]
# ### Windows and their caches: every local layer
#
# A sliding layer's query at position `i` sees keys `i - window < j <= i`: the last `window` keys, itself
# included, as transformers' masks do (`kv_idx > q_idx - sliding_window`). Its cache keeps exactly those:
# `new_cache` returns the ring buffer of `attention/decoding/`, `SlidingWindowKVCache`, whatever the
# capacity asked for, so a local layer's memory stops growing at the window. (Llama 4's chunked layers
# keep the same ring, one chunk long, and mask it to the current chunk.)

# %% tags=["hide-input"]
show_markdown("**The cache of a layer (every family)**")
show_source(inspect.getmodule(LlamaAttention).make_cache)

# %% [markdown]
# ## Checked against the float64 reference
#
# `attention.reference.reference_model_attention` is the float64 layer written from the papers:
# project, normalise, rotate (`rope_frequencies`, `reference_rope`), mask (causal, window),
# attend (`reference_kernel`, with scale, soft-cap and sinks), project back; what it needs to know of a
# layer (scale, window, RoPE, norms...) it reads from the model's configuration (`model_reference_kwargs`),
# never from the layer, so a layer that reads its configuration wrongly differs from it. Each published model is
# shrunk here to 64 features in heads of 16 (its ratio of query heads to K/V heads, its schedule, its RoPE
# and norms kept; windows shortened to 8 keys so that 24 tokens run past them), its weights drawn at
# random, then one layer of each kind is compared, in float64 and float32; decoding with the layer's cache
# (a prompt of 9 tokens, then one token per step) against the same layer's full forward pass. The kernel
# column names what the profiler saw run.

# %%
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


def reference_of(config, layer_idx, module, x):
    """`reference_model_attention` of layer `layer_idx` of `config` on `x`, with `module`'s weights."""
    settings = model_reference_kwargs(config, layer_idx, torch.arange(x.shape[1]), type(module))
    return reference_model_attention(x, module.state_dict(), **settings)


# %% tags=["hide-input"]
os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # Kineto, the profiler's backend, would print two lines per call


def kernel_seen(fn):
    """What the profiler saw compute the attention of `fn()`: an SDPA backend, a compiled graph, or matmuls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = {event.name for event in prof.events()}
    sdpa = sorted(name.removeprefix("aten::_scaled_dot_product_") for name in names
                  if name.startswith("aten::_scaled_dot_product_"))
    if sdpa:
        return "SDPA: " + ", ".join(sdpa)
    if any(name.startswith("Torch-Compiled Region") for name in names):
        return "compiled graph (torch.compile, inductor)"
    if "aten::_softmax" in names and ("aten::matmul" in names or "aten::bmm" in names):
        return "matmul + softmax (eager)"
    return "other: " + ", ".join(sorted(names)[:5])


# %%
checks = []
for name, entry in PUBLISHED.items():
    config = shrunk(entry["config"])
    kinds = {}  # layer_type -> the first layer of that kind
    for i, layer in enumerate(layers_of(config)):
        kinds.setdefault(layer.layer_type, i)
    for layer_type, layer_idx in kinds.items():
        module = randomised(MODELS[config["model_type"]].from_config(config, layer_idx))
        x = torch.randn(2, T_CHECK, 64, dtype=torch.float64)
        expected, _ = reference_of(config, layer_idx, module, x)
        with torch.no_grad():
            error64 = (module(x) - expected).abs().max().item()
            kernel = kernel_seen(lambda: module(x))
            module32, x32 = module.to(torch.float32), x.to(torch.float32)
            error32 = (module32(x32).double() - expected).abs().max().item()
            cache = module32.new_cache(2, capacity=T_CHECK)
            steps = [module32(x32[:, :9], cache=cache)] + [module32(x32[:, t:t + 1], cache=cache) for t in range(9, T_CHECK)]
            decode_kernel = kernel_seen(lambda: (cache.rewind(T_CHECK - 1), module32(x32[:, -1:], cache=cache)))
            decode_error = (torch.cat(steps, dim=1).double() - expected).abs().max().item()
        checks.append({"model": name, "layer": f"{layer_idx} ({layer_type.split('_')[0]})", "kernel": kernel,
                       "decode_kernel": decode_kernel, "float64": error64, "float32": error32, "decode": decode_error,
                       "cache_positions": cache.keys.shape[2]})

# %% tags=["hide-input"]
show_table(f"Each model's layers (shrunk, random weights) against the float64 reference, {T_CHECK} tokens, batch 2",
           ["model", "layer", "kernel (prefill)", "max abs error, float64", "float32", "decoding (float32)",
            "kernel (decode step)", "cache holds (positions)"],
           [(c["model"], c["layer"], c["kernel"], f"{c['float64']:.1e}", f"{c['float32']:.1e}", f"{c['decode']:.1e}",
             c["decode_kernel"], c["cache_positions"]) for c in checks])
worst64, worst32 = max(checks, key=lambda c: c["float64"]), max(checks, key=lambda c: c["decode"])
local_caches = sorted({c["cache_positions"] for c in checks if "sliding" in c["layer"] or "chunked" in c["layer"]})
show_markdown(f"In float64 the largest difference from the reference is {worst64['float64']:.1e} "
              f"({worst64['model']}, layer {worst64['layer']}): the two compute the same function. Decoding in "
              f"float32 with the cache stays within {worst32['decode']:.1e} of the float64 full pass at every "
              f"position, local layers past their window included, where the cache holds "
              f"{' or '.join(str(p) for p in local_caches)} positions, not {T_CHECK}.")

# %% [markdown]
# ## Fused: soft-cap, sinks and windows on FlexAttention
#
# Gemma 2's and gpt-oss's own `forward` write the `(T, S)` scores out, since SDPA has neither a soft-cap
# nor sinks. `attention.models.flex.flex_forward(module, x)` runs the same layer on compiled
# FlexAttention: the soft-cap as a `score_mod`, the window as the block mask of
# `attention.masks.sliding_window`, and each sink as one more key whose score a `score_mod` sets to the
# head's sink logit and whose value is zero. (A kernel that returns each row's log-sum-exp `lse` could
# apply the sinks afterwards, `out * sigmoid(lse - sink)`; compiled FlexAttention on CPU does not return it.)

# %%
fused = []
for name, layer_type in (("Gemma 2 9B", "sliding_attention"), ("Gemma 2 9B", "full_attention"),
                         ("gpt-oss-20b", "sliding_attention"), ("Llama 3.1 8B", "full_attention")):
    config = shrunk(PUBLISHED[name]["config"])
    layer_idx = next(i for i, layer in enumerate(layers_of(config)) if layer.layer_type == layer_type)
    module = randomised(MODELS[config["model_type"]].from_config(config, layer_idx)).to(torch.float32)
    x = torch.randn(2, 256, 64)
    expected, _ = reference_of(config, layer_idx, module, x)
    with torch.no_grad():
        out = flex_forward(module, x)
        kernel = kernel_seen(lambda: flex_forward(module, x))
    fused.append((name, f"{layer_idx} ({layer_type.split('_')[0]})", kernel, f"{(out.double() - expected).abs().max().item():.1e}"))

# %% tags=["hide-input"]
show_table("flex_forward against the float64 reference, float32, 256 tokens, batch 2",
           ["model (shrunk)", "layer", "kernel", "max abs error"], fused)

# %% [markdown]
# ## What sinks do to the weights
#
# With a sink, a head's weights over the keys sum to `1 - sigmoid(sink - lse)`, where `lse` is the
# log-sum-exp of its scores: a head whose sink logit outweighs its scores attends to almost nothing, and
# the same sink takes less as the keys (and `lse`) grow. The weights below are the reference's, for a
# shrunk gpt-oss global layer with small random weights (so each row's `lse` stays near the log of the
# number of keys it sees) whose eight sink logits are set from -4 to 10; the learned ones live in the
# checkpoint, which this page does not download.

# %%
config = shrunk(PUBLISHED["gpt-oss-20b"]["config"])
module = randomised(MODELS["gpt_oss"].from_config(config, 1))  # layer 1: global
with torch.no_grad():
    for param in module.parameters():
        param.mul_(0.3)  # small scores: each row's log-sum-exp near log(keys seen), so the sinks span it
    module.sinks.copy_(torch.linspace(-4.0, 10.0, module.num_attention_heads))
    q, k, v = module.qkv(torch.randn(4, 64, 64, dtype=torch.float64), 0)  # (B, H, T, D), (B, H_kv, T, D) x2
causal = torch.ones(64, 64, dtype=torch.bool).tril()
_, weights = reference_kernel(q, k, v, causal, scale=module.scaling, sinks=module.sinks.detach())  # (B, H, T, T)
sink_mass = 1 - weights.sum(dim=-1)  # (B, H, T): the share of each query's attention the sink took
group = module.num_attention_heads // module.num_key_value_heads
scores = (q @ k.repeat_interleave(group, dim=1).transpose(-1, -2) * module.scaling).masked_fill(~causal, float("-inf"))
predicted = torch.sigmoid(module.sinks.detach().view(1, -1, 1) - torch.logsumexp(scores, dim=-1))
print(f"1 - row sum against sigmoid(sink - lse): max |difference| = {(sink_mass - predicted).abs().max().item():.1e}")

# %% tags=["hide-input"]
fig = Figure(figsize=(10, 3.6), layout="constrained")
left, right = fig.subplots(1, 2)
sinks = module.sinks.detach()
left.bar(range(len(sinks)), sink_mass.mean(dim=(0, 2)), color="tab:orange")
left.set_xticks(range(len(sinks)), [f"h{h}\n{s:.0f}" for h, s in enumerate(sinks.tolist())])
left.set(title="Mean share sent to the sink, per head", xlabel="head and its sink logit", ylabel="share of attention",
         ylim=(0, 1))
for h in (2, 4, 6):
    right.plot(sink_mass[:, h].mean(dim=0), label=f"head {h} (sink {sinks[h]:.0f})")
right.set(title="Share sent to the sink by query position", xlabel="query position (keys seen - 1)",
          ylabel="share of attention", ylim=(0, 1))
right.legend(loc="upper right")
show(fig)
per_head = sink_mass.mean(dim=(0, 2))


def share(value):
    return f"{value:.0%}" if value >= 0.095 else f"{value:.1%}"


middle = 4
show_markdown(f"Head {middle}, whose sink logit is {sinks[middle]:.1f}, sends {share(per_head[middle])} of its attention "
              f"to the sink on average: {share(sink_mass[:, middle, 0].mean())} at the first position, where one key "
              f"competes with it, {share(sink_mass[:, middle, -1].mean())} at the last, where 64 do. Head 0 (sink "
              f"{sinks[0]:.1f}) sends {share(per_head[0])}, head {len(sinks) - 1} (sink {sinks[-1]:.1f}) "
              f"{share(per_head[-1])}.")

# %% [markdown]
# ## What soft-capping does to the scores
#
# `cap * tanh(score / cap)` is the identity near zero (its slope at 0 is 1) and flattens towards `±cap`.
# Gemma 2's cap is 50: scores well inside it pass almost unchanged, outliers are pulled in. Below, a
# synthetic row of 4,096 scores with a heavy tail (Student's t with 2 degrees of freedom, times 15), before
# and after the cap.

# %%
cap = PUBLISHED["Gemma 2 9B"]["config"]["attn_logit_softcapping"]
row = torch.distributions.StudentT(2.0).sample((4096,)) * 15  # a heavy-tailed row of scores
capped = cap * torch.tanh(row / cap)
top, top_capped = torch.softmax(row, dim=0).max().item(), torch.softmax(capped, dim=0).max().item()

# %% tags=["hide-input"]
fig = Figure(figsize=(10, 3.6), layout="constrained")
left, right = fig.subplots(1, 2)
s = torch.linspace(-150, 150, 601)
left.plot(s, s, color="0.6", linestyle="--", label="no cap")
left.plot(s, cap * torch.tanh(s / cap), color="tab:blue", label=f"cap {cap:g}: {cap:g}·tanh(s/{cap:g})")
left.set(title="The soft-cap curve", xlabel="score before the cap", ylabel="score after the cap", ylim=(-160, 160))
left.legend(loc="upper left")
bins = torch.linspace(-150, 150, 61)
right.hist(row.clamp(-150, 150), bins=bins, alpha=0.6, label="before (clipped to ±150 to draw)", color="0.5")
right.hist(capped, bins=bins, alpha=0.7, label="after", color="tab:blue")
right.set(title="A row of 4,096 heavy-tailed scores", xlabel="score", ylabel="count (log)", yscale="log")
right.legend(loc="upper right")
show(fig)
show_markdown(f"The largest score of the row falls from {row.max():.0f} to {capped.max():.1f}; "
              f"{(row.abs() > cap).sum().item()} of 4,096 scores lay beyond ±{cap:g}. The largest softmax weight of "
              f"the row falls from {top:.3f} to {top_capped:.3f}: one outlier no longer takes "
              f"{'almost all' if top > 0.9 else 'most' if top > 0.5 else 'the largest share'} of the attention.")

# %% [markdown]
# ## Local and global layers, across the depth
#
# Which layers are local (a sliding window) and which global, for each model with a window, as its
# configuration makes them (`layer_types`, or the rule transformers applies where a published file has
# none):

# %% tags=["hide-input"]
windowed = {name: layers for name, layers in MODEL_LAYERS.items() if any(span(layer) for layer in layers)}
depth = max(len(layers) for layers in windowed.values())
fig = Figure(figsize=(10, 0.45 * len(windowed) + 1.4), layout="constrained")
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
lines = []
for name, layers in windowed.items():
    local = sum(1 for layer in layers if span(layer))
    lines.append(f"* {name}: {schedule_text(layers)}; {local / len(layers):.0%} of its layers local.")
show_markdown("\n".join(lines))

# %% [markdown]
# ## The KV cache at the published sizes
#
# A global layer caches `2 * H_kv * D` numbers per token (keys and values); a local layer never more than
# its window's worth. In bfloat16, batch 1, up to each model's `max_position_embeddings`:

# %%
BYTES = 2  # bfloat16


def kv_cache_bytes(layers, context):
    """Bytes of the KV cache of every layer at `context` positions, a local layer holding at most its window."""
    return sum(2 * layer.num_key_value_heads * layer.head_dim * BYTES * min(context, span(layer) or context)
               for layer in layers)


# Checked against allocated caches: one layer of each kind, a global one at 256 positions, a local one at its window.
SMALL = 256
for name, layers in MODEL_LAYERS.items():
    allocated = {}  # span (None: global) -> bytes of that layer's cache
    for layer in layers:
        if span(layer) not in allocated:
            sizes = dict(batch_size=1, num_kv_heads=layer.num_key_value_heads, head_dim=layer.head_dim,
                         dtype=torch.bfloat16)
            cache = SlidingWindowKVCache(window=span(layer), **sizes) if span(layer) else KVCache(capacity=SMALL, **sizes)
            allocated[span(layer)] = cache.nbytes
            del cache
    for context in (SMALL, max(span(layer) or SMALL for layer in layers) * 4):
        from_caches = sum(allocated[None] * context // SMALL if not span(layer)
                          else allocated[span(layer)] * min(context, span(layer)) // span(layer) for layer in layers)
        assert from_caches == kv_cache_bytes(layers, context), (name, context)

# %% tags=["hide-input"]
rows = []
for name, layers in MODEL_LAYERS.items():
    max_context = PUBLISHED[name]["config"]["max_position_embeddings"]
    per_token_all = kv_cache_bytes(layers, 1)
    per_token_past = kv_cache_bytes(layers, max_context) - kv_cache_bytes(layers, max_context - 1)
    at_32k = kv_cache_bytes(layers, min(32768, max_context))
    at_max = kv_cache_bytes(layers, max_context)
    all_global = sum(2 * layer.num_key_value_heads * layer.head_dim * BYTES * max_context for layer in layers)
    rows.append((name, f"{per_token_all / 1024:,.0f}", f"{per_token_past / 1024:,.0f}",
                 f"{at_32k / 2**30:,.2f}" + ("" if max_context >= 32768 else f" (at {max_context:,})"),
                 f"{max_context:,}", f"{at_max / 2**30:,.2f}", f"{at_max / all_global:.0%}"))
show_table("KV cache per sequence in bfloat16 (checked against allocated caches' nbytes)",
           ["model", "KiB per token (every layer)", "KiB per token past the windows", "GiB at 32k",
            "max context", "GiB at max context", "of all-global"], rows)

# %% tags=["hide-input"]
fig = Figure(figsize=(10, 5), layout="constrained")
ax = fig.subplots()
palette = matplotlib.colormaps["tab20"]
contexts = [2**p for p in range(10, 18)]
for index, (name, layers) in enumerate(MODEL_LAYERS.items()):
    max_context = PUBLISHED[name]["config"]["max_position_embeddings"]
    shown = [c for c in contexts if c <= max_context] + ([max_context] if max_context < contexts[-1] else [])
    shown = sorted(set(shown))
    windowed_model = any(span(layer) for layer in layers)
    ax.plot(shown, [kv_cache_bytes(layers, c) / 2**30 for c in shown], marker="o", markersize=3,
            linestyle="-" if windowed_model else "--", label=name + (" (local layers capped)" if windowed_model else ""),
            color=palette(index % 20))
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xticks(contexts, [f"{c // 1024}k" for c in contexts])
ax.set(title="KV cache per sequence against context, bfloat16, batch 1", xlabel="context (tokens)",
       ylabel="KV cache (GiB)")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="dashed: every layer global", title_fontsize=7)
show(fig)
at_max = {name: kv_cache_bytes(layers, PUBLISHED[name]["config"]["max_position_embeddings"])
          for name, layers in MODEL_LAYERS.items()}
gemma3, llama = MODEL_LAYERS["Gemma 3 27B"], MODEL_LAYERS["Llama 3.1 8B"]
oss = MODEL_LAYERS["gpt-oss-120b"]
show_markdown(
    f"At 128k tokens Gemma 3 27B caches {kv_cache_bytes(gemma3, 131072) / 2**30:.1f} GiB, where Llama 3.1 8B, "
    f"all {len(llama)} of its layers global, caches {kv_cache_bytes(llama, 131072) / 2**30:.1f} GiB; "
    f"with all its layers global Gemma 3 27B would cache "
    f"{sum(2 * layer.num_key_value_heads * layer.head_dim * BYTES * 131072 for layer in gemma3) / 2**30:.1f} GiB. "
    f"gpt-oss-120b caches {kv_cache_bytes(oss, 131072) / 2**30:.2f} GiB at 128k: its local layers hold "
    f"{max(span(layer) or 0 for layer in oss)} positions each.")

# %% [markdown]
# ## Decode step time per layer type
#
# The benchmark's decode sweep (`attention/bench/sweeps/decode.py`) times one decode step of one layer
# of each kind, built by `from_config` from the published configurations above at the sweep's head
# count and size, with each model's own query heads per K/V head, window, norms, scale, RoPE and
# sinks: Llama 3.1's global layer (`Llama-3`), Gemma 3 27B's local layer (`Gemma-3-local`), Gemma 2
# 27B's soft-capped local and global layers (`Gemma-2-local`, `Gemma-2-global`), gpt-oss-120b's local
# and global layers (`gpt-oss-local`, `gpt-oss-global`), both with sinks, and Llama 4 Scout's chunked
# RoPE layer and its NoPE global layer with the query temperature (`Llama-4-chunked`, `Llama-4-NoPE`;
# 4 query heads per K/V head, since Scout's 40:8 does not divide the sweep's query heads); beside
# them, the plain `GQA` layer. Each step is checked against `reference_model_attention` over what the
# cache holds. The runs recorded in `docs/results/decode/`:

# %% tags=["hide-input"]
from attention import report

LAYER_ROWS = ["Llama-3", "Gemma-3-local", "Gemma-2-local", "Gemma-2-global", "gpt-oss-local", "gpt-oss-global",
              "Llama-4-chunked", "Llama-4-NoPE"]  # the decode sweep's names
decode_runs = [(path, report.load_result(path)) for path in report.find_results(report.RESULTS_DIR / "decode")]
layer_runs = [(path, result) for path, result in decode_runs
              if any(report.decode_rows(result, model=model) for model in LAYER_ROWS)]
if not layer_runs:
    held = "; ".join(f"`{path.name}` holds rows of {', '.join(sorted({r['model'] for r in result['decode']['rows']}))}"
                     for path, result in decode_runs) or "no decode results file is recorded"
    show_markdown(f"**Not recorded yet.** No recorded decode run has rows of these layers ({held}), so this page "
                  "shows no timing for them: speed is measured, not asserted. The decode profile records them: "
                  "`python -m attention.bench --profile decode --out docs/results/decode/<device>-decode.json`.")
for path, result in layer_runs:
    show_markdown(f"`docs/results/decode/{path.name}`: {report.run_line(result)} One attention layer of "
                  f"{result['decode']['num_heads']} query heads of {result['decode']['head_dim']} (windows: Gemma 3 "
                  f"{PUBLISHED['Gemma 3 27B']['config']['sliding_window']:,} positions, Gemma 2 "
                  f"{PUBLISHED['Gemma 2 27B']['config']['sliding_window']:,}, gpt-oss "
                  f"{PUBLISHED['gpt-oss-120b']['config']['sliding_window']:,}; Llama 4's chunks "
                  f"{PUBLISHED['Llama 4 Scout']['config']['attention_chunk_size']:,}), the fastest "
                  "kernel per layer (the layers on SDPA run two: `sdpa`, and `matmul`, the grouped matmuls of "
                  "`attention.decoding.cached_attention`; Gemma 2's and gpt-oss's run their written-out softmax, "
                  "`matmul`, which the soft-cap and the sinks need); each cell: tokens per second and the share of "
                  f"{report.share_words(result)}."
                  "\n\n"
                  + report.decode_summary_table(result, contexts=[1024, 4096, 16384, 32768], models=["GQA", *LAYER_ROWS]))
    show(report.plot_decode(result, "tokens_per_s", models=["GQA", *LAYER_ROWS]))
    at_16k = {model: report.decode_best(result, model, 1, 16384) for model in LAYER_ROWS}
    measured = {model: row for model, row in at_16k.items() if row}
    if measured:
        show_markdown("At a 16,384-position context and batch 1: " + "; ".join(
            f"{model} {row['ms_median']:.2f} ms per step ({row['tokens_per_s']:,.0f} tokens/s, reading "
            f"{row['positions_read']:,} positions, {row[report.shown_share(result)]:.0%} of {report.share_words(result)})"
            for model, row in measured.items()) + ".")
    two_kernels = []  # the layers on SDPA, which run both kernels
    default_kernel = inspect.signature(LlamaAttention).parameters["decode_kernel"].default
    for model in LAYER_ROWS:
        sdpa, matmul = (report.decode_rows(result, 1, model, kernel, 16384) for kernel in ("sdpa", "matmul"))
        if sdpa and matmul:
            two_kernels.append(f"{model} `sdpa` {sdpa[0]['tokens_per_s']:,.1f} tokens/s, `matmul` "
                               f"{matmul[0]['tokens_per_s']:,.1f} ({matmul[0]['tokens_per_s'] / sdpa[0]['tokens_per_s']:.2f}x)")
    if two_kernels:
        show_markdown("The two kernels of the layers on SDPA, at a 16,384-position context and batch 1: "
                      + "; ".join(two_kernels) + ". "
                      "SDPA's CPU kernel takes one query head at a time and so reads each K/V head once per query head "
                      "of its group; the grouped matmuls read it once for the group ([KV cache and "
                      "decoding](../kv_cache/)). "
                      f"`decode_kernel=\"{default_kernel}\"`, `from_config`'s default, takes "
                      f"`{'matmul' if uses_grouped_matmuls(default_kernel, torch.device('cpu'), 1) else 'sdpa'}` "
                      "for one new token on CPU.")
    local, full = at_16k["gpt-oss-local"], at_16k["gpt-oss-global"]
    if local and full:
        show_markdown(f"gpt-oss's local layer reads {local['cache_bytes_read'] / 2**20:,.1f} MiB of cache per step "
                      f"where its global layer reads {full['cache_bytes_read'] / 2**20:,.1f} MiB, and runs "
                      f"{local['tokens_per_s'] / full['tokens_per_s']:.1f}x its tokens per second: the weights, "
                      f"{local['weight_bytes'] / 2**20:,.0f} MiB read at every step, do not shrink with the window.")
    # A local layer's ring holds its window's slots from the first step, empty ones masked: read whole below the window.
    shortest = min(row["context"] for row in result["decode"]["rows"])
    slower = []
    for local_name, global_name, published in (("Gemma-2-local", "Gemma-2-global", "Gemma 2 27B"),
                                               ("gpt-oss-local", "gpt-oss-global", "gpt-oss-120b")):
        window = PUBLISHED[published]["config"]["sliding_window"]
        local, full = (report.decode_best(result, name, 1, shortest) for name in (local_name, global_name))
        if local and full and shortest < window and local["tokens_per_s"] < full["tokens_per_s"]:
            slower.append(f"{local_name} runs {local['tokens_per_s']:,.0f} tokens/s against {global_name}'s "
                          f"{full['tokens_per_s']:,.0f} at {shortest:,} cached positions, below its window of {window:,}")
    if slower:
        show_markdown("A local layer is not faster than its global twin below its window: its cache is a ring of the "
                      "window's slots, allocated and read whole from the first step, the empty ones masked out, where "
                      "a global layer's cache reads only the positions it holds. At batch 1, " + "; ".join(slower) + ".")
