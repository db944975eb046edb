# %% [markdown]
# # Attention in five minutes
#
# One causal multi-head attention layer, built by hand on five tokens: scores, scaling, softmax,
# the weighted sum of values, the [causal mask](../../glossary/#causal-mask) and heads; then
# checked against PyTorch and the float64 reference. It assumes matrix products and the softmax;
# the letters (`B`, `T`, `H`, `D`) are on the [notation page](../../notation/) and the terms in
# the [glossary](../../glossary/).
#
# ## Queries, keys and scores
#
# Each token's vector `x` is projected three ways: a *query* (what this token looks for), a
# *key* (what it offers to be found by) and a *value* (what it passes on). The score of query `i`
# against key `j` is their dot product; all of them at once are the matrix `q @ k^T`. Below, five
# tokens whose embeddings are random vectors of `d_model = 8` features, and one head of `D = 4`.

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn

from attention import IMPLEMENTATIONS
from attention.display import show, show_markdown, show_shape, show_table
from attention.plotting import plot_attention_weights
from attention.reference import reference_causal_self_attention

torch.manual_seed(0)
tokens = ["the", "cat", "sat", "on", "mats"]
B, T, d_model, D = 1, len(tokens), 8, 4
x = torch.randn(B, T, d_model)  # stand-ins for the tokens' embeddings
query, key, value = (nn.Linear(d_model, D, bias=False) for _ in range(3))

with torch.no_grad():
    q, k, v = query(x), key(x), value(x)  # each (B, T, D)
    scores = q @ k.transpose(-2, -1)  # (B, T, T): scores[b, i, j] = q[b, i] . k[b, j]
show_shape("x", x, "(B, T, d_model)")
show_shape("q = query(x) (k, v alike)", q, "(B, T, D)")
show_shape("scores = q @ k^T", scores, "(B, T, T)")

# %% [markdown]
# ## Why divide by sqrt(D)
#
# If the `D` features of a query and a key are independent with mean 0 and variance 1, their dot
# product is a sum of `D` such products: its variance is `D`, its standard deviation `sqrt(D)`.
# Large heads therefore produce large scores, and the softmax turns large score differences into
# weights of almost exactly 0 and 1: it *saturates*, and a saturated softmax passes almost no
# gradient back to the scores, so learning slows down. Dividing by `sqrt(D)` brings the standard
# deviation back to 1 whatever the head size. Measured on random vectors:

# %%
num_queries, num_keys = 4096, 16
saturated = 0.99  # a row whose largest weight exceeds this ignores every other key
scaling_rows = []
for head_dim in (4, 16, 64, 256):
    q_sample = torch.randn(num_queries, 1, head_dim)  # (N, 1, D): one query per row
    k_sample = torch.randn(num_queries, num_keys, head_dim)  # (N, keys, D)
    raw = (q_sample @ k_sample.transpose(-2, -1)).squeeze(1)  # (N, keys): q . k
    scaled = raw / math.sqrt(head_dim)  # (N, keys)
    largest_raw = torch.softmax(raw, dim=-1).amax(dim=-1)  # (N,): each row's largest weight
    largest_scaled = torch.softmax(scaled, dim=-1).amax(dim=-1)  # (N,)
    scaling_rows.append({
        "D": head_dim,
        "std, raw": raw.std().item(),
        "std, scaled": scaled.std().item(),
        "mean largest weight, raw": largest_raw.mean().item(),
        "mean largest weight, scaled": largest_scaled.mean().item(),
        f"rows with a weight > {saturated}, raw": (largest_raw > saturated).float().mean().item(),
        f"rows with a weight > {saturated}, scaled": (largest_scaled > saturated).float().mean().item(),
    })

# %% tags=["hide-input"]
header = list(scaling_rows[0])
show_table(f"Scores of random unit-variance vectors, {num_keys} keys per query: raw (q.k) and scaled (q.k / sqrt(D))",
           header, [[row["D"]] + [f"{row[name]:.2f}" if "std" in name or "mean" in name else f"{row[name]:.1%}"
                                  for name in header[1:]] for row in scaling_rows])
largest = scaling_rows[-1]
show_markdown(f"At `D = {largest['D']}` the raw scores have a standard deviation of {largest['std, raw']:.2f}, and "
              f"{largest[f'rows with a weight > {saturated}, raw']:.0%} of the rows put more than {saturated} of "
              f"their weight on a single key; scaled, the largest weight of a row is "
              f"{largest['mean largest weight, scaled']:.2f} on average, against {1 / num_keys:.4g} for a uniform row.")

# %% [markdown]
# ## Softmax over the keys, under the causal mask
#
# A language model predicts token `i + 1` from tokens `0..i`, so query `i` must not see later
# keys. The causal mask says which pairs may attend: True where key `j <= i` (True = attend,
# everywhere in this package). Masked scores become `-inf` before the softmax, whose
# `exp(-inf) = 0` gives them weight 0. The softmax runs along each row, over the keys: every
# query gets weights that are at least 0 and sum to 1.

# %%
positions = torch.arange(T)
causal_mask = positions[:, None] >= positions[None, :]  # (T, T): query i may see key j <= i
print("causal mask (1 = attend):")
print(causal_mask.int())
masked_scores = (scores / math.sqrt(D)).masked_fill(~causal_mask, float("-inf"))  # (B, T, T)
weights = torch.softmax(masked_scores, dim=-1)  # (B, T, T)
print("weights (row i: how query i spreads its attention over keys 0..i):")
print(weights[0].numpy().round(2))
print("row sums:", weights[0].sum(dim=-1).numpy().round(6))

# %% [markdown]
# ## The weighted sum of values
#
# Each query's output is the average of the values, weighted by its row of weights: a `(T, T)`
# matrix times a `(T, D)` matrix. The first token can only see itself, so its output is its own
# value.

# %%
context = weights @ v  # (B, T, D)
show_shape("context = weights @ v", context, "(B, T, D)")
print("first output equals the first value:", torch.allclose(context[0, 0], v[0, 0]))

# %% [markdown]
# The four steps in one function, on any leading dimensions (`(B, T, D)` here, `(B, H, T, D)`
# below):

# %%
def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(D), causal) v for q, k, v of shape (..., T, D)."""
    T, D = q.shape[-2], q.shape[-1]
    positions = torch.arange(T)
    causal_mask = positions[:, None] >= positions[None, :]  # (T, T), True = attend
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (..., T, T)
    weights = torch.softmax(scores.masked_fill(~causal_mask, float("-inf")), dim=-1)  # (..., T, T)
    return weights @ v, weights  # (..., T, D), (..., T, T)


print("same as above:", torch.allclose(causal_attention(q, k, v)[0], context))

# %% [markdown]
# ## Several heads
#
# One head gives each query one weighted average. *Multi-head* attention runs `H` heads side by
# side, each with its own queries, keys and values of `D` features, so each head can learn its
# own pattern of attention. In practice the three projections produce `H * D = d_model` features
# each, *viewed* as `H` heads of `D`; each head attends separately, the heads' outputs are
# concatenated back to `d_model` features, and a last `Linear` mixes them.
# (Some models share keys and values among heads; see [KV heads](../../glossary/#kv-heads).)

# %%
H = 2
D = d_model // H  # features per head
query, key, value = (nn.Linear(d_model, H * D, bias=False) for _ in range(3))
out_proj = nn.Linear(H * D, d_model)

with torch.no_grad():
    q = query(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = key(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    v = value(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    context, weights = causal_attention(q, k, v)  # (B, H, T, D), (B, H, T, T)
    merged = context.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D): heads side by side
    out = out_proj(merged)  # (B, T, d_model)
show_shape("q = query(x).view(B, T, H, D).transpose(1, 2)", q, "(B, H, T, D)")
show_shape("context, weights = causal_attention(q, k, v)", context, "(B, H, T, D)")
show_shape("weights", weights, "(B, H, T, T)")
show_shape("merged = context.transpose(1, 2).reshape(...)", merged, "(B, T, H*D)")
show_shape("out = out_proj(merged)", out, "(B, T, d_model)")

# %% [markdown]
# The weights of both heads, next to the mask they were computed under: each row sums to 1, and
# nothing lies above the diagonal. (The projections are random, so the patterns mean nothing
# yet; training is what makes heads look for something.)

# %% tags=["hide-input"]
show(plot_attention_weights(weights[0], tokens=tokens, mask=causal_mask,
                            title=f"Causal attention weights of {H} heads on {T} tokens (random weights)"))

# %% [markdown]
# ## Checked against PyTorch and the reference
#
# PyTorch computes the same thing in one call,
# [`F.scaled_dot_product_attention`](../../glossary/#sdpa) (SDPA), which with `is_causal=True`
# builds the causal mask itself. The float64 reference of this package, `attention.reference`,
# takes the weights in the [canonical form](../../glossary/#canonical-state-dict) every
# implementation exports, and so does every registered class, such as `sdpa_causal`:

# %%
state = {"query.weight": query.weight, "key.weight": key.weight, "value.weight": value.weight,
         "out.weight": out_proj.weight, "out.bias": out_proj.bias}
expected, expected_weights = reference_causal_self_attention(x, state, num_heads=H)  # float64
module = IMPLEMENTATIONS["sdpa_causal"](d_model, d_model, context_length=T, dropout=0.0, num_heads=H).eval()
module.load_canonical_state_dict(state)
with torch.no_grad():
    sdpa_context = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
    module_out = module(x)  # (B, T, d_model)
checks = {
    "context vs F.scaled_dot_product_attention": (context, sdpa_context),
    "weights vs the reference": (weights, expected_weights),
    "out vs the reference": (out, expected),
    "IMPLEMENTATIONS['sdpa_causal'] vs the reference": (module_out, expected),
}
for label, (ours, theirs) in checks.items():
    error = (ours.double() - theirs.double()).abs().max().item()
    print(f"{label:<48} max |difference| = {error:.1e}  (float32)")
    assert error < 1e-5, (label, error)

# %% [markdown]
# That is the whole computation. The rest of this site is about doing it fast, with other masks,
# and with positions:
#
# * [Stacked single heads](../stacked_heads/) and [split heads](../split_heads/): the two classic
#   ways to write multi-head attention, shape by shape;
# * [scaled_dot_product_attention](../sdpa/): the one call above, and the fused kernels behind it
#   (such as [FlashAttention](../../glossary/#flashattention)) that never store the `(T, T)`
#   weights;
# * [Masks](../masks/): sliding windows, [padding](../../glossary/#padding-mask), packed documents,
#   each written once as a predicate;
# * [Position encodings](../positional/): nothing above tells a score where its tokens sit,
#   apart from the mask; sinusoidal, learned, RoPE and ALiBi encodings add it;
# * [Benchmarks](../../benchmarks/): how fast each implementation runs on each device.
