# %% [markdown]
# # Stacked single heads
#
# `StackedHeadsAttention` (`attention/causal/stacked_heads.py`, registered as `stacked_heads`) is
# the most literal reading of "multi-head": build `num_heads` independent single-head attention
# modules, run them one after another, concatenate what they return, and project.
#
# ## The idea
#
# One head turns each position's features into a query, a key and a value (three `Linear`
# layers of `head_dim` outputs), scores every query against every key, hides the keys that lie in
# the future (the causal mask), turns each row of scores into weights with a softmax, and returns
# the weighted sum of the values. `H` such heads, each with its own weights, look at the sequence
# in `H` different ways; their outputs, side by side, form a vector of `H * D = d_out` features,
# and a last `Linear` mixes them.
#
# It is the easiest version to read and the slowest to run: every head is its own small matmul,
# launched in a Python loop. The [split-heads version](../split_heads/) computes the same thing
# with one matmul for all heads. The letters (`B`, `T`, `H`, `D`, ...) are explained on the
# [notation page](../../notation/).

# %%
import torch

from attention import IMPLEMENTATIONS
from attention.causal.stacked_heads import CausalHead, StackedHeadsAttention
from attention.display import show_shape, show_source
from attention.reference import reference_causal_self_attention

torch.manual_seed(0)

print(IMPLEMENTATIONS["stacked_heads"] is StackedHeadsAttention)

# %% [markdown]
# ## Shapes, step by step
#
# A batch of `B = 2` sequences of `T = 4` positions with `d_in = 6` features, and two heads of
# `D = 2` features each (`d_out = 4`). The steps below repeat what `forward` does, with the
# module's own weights, and print every intermediate shape.

# %%
B, T, d_in, d_out, H = 2, 4, 6, 4, 2
x = torch.randn(B, T, d_in)
module = StackedHeadsAttention(d_in, d_out, context_length=8, dropout=0.0, num_heads=H).eval()

show_shape("x", x, "(B, T, d_in)")
head_outputs = []
for h, head in enumerate(module.heads):
    q, k, v = head.query(x), head.key(x), head.value(x)
    scores = q @ k.transpose(1, 2) / head.query.out_features**0.5
    scores = scores.masked_fill(~head.causal_mask[:T, :T], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    head_outputs.append(weights @ v)
    if h == 0:
        show_shape("q = head.query(x) (k, v alike)", q, "(B, T, D)")
        show_shape("scores = q @ k^T / sqrt(D)", scores, "(B, T, T)")
        show_shape("weights = softmax(scores, -1)", weights, "(B, T, T)")
        show_shape("head output = weights @ v", head_outputs[-1], "(B, T, D)")
context = torch.cat(head_outputs, dim=-1)
show_shape(f"concatenate the {H} heads", context, "(B, T, H*D)")
out = module.out(context)
show_shape("out = module.out(context)", out, "(B, T, d_out)")

with torch.no_grad():
    print("same as module(x):", torch.allclose(out, module(x)))
print("causal mask of the first head (True = attend):")
print(module.heads[0].causal_mask[:T, :T].int())

# %% [markdown]
# The weights of one head for the first sequence: row `i` is query position `i`, column `j` key
# position `j`. Every row sums to 1 and has zeros above the diagonal: no position looks ahead.

# %%
print(weights[0].detach().numpy().round(3))

# %% [markdown]
# ## The code
#
# Shown from the installed package at build time, so this page cannot drift from it.

# %%
show_source(CausalHead)
show_source(StackedHeadsAttention)

# %% [markdown]
# ## Checked against the float64 reference
#
# Every implementation exports its weights in one shared ("canonical") form, the one
# `attention.reference` reads. Head `h`'s query rows become rows `h*D:(h+1)*D` of one
# `(d_out, d_in)` query matrix, and likewise for keys and values.

# %%
x = torch.randn(2, 16, 32)
module = StackedHeadsAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
state = module.canonical_state_dict()
for name, tensor in state.items():
    print(f"{name:<14} {tuple(tensor.shape)}")

expected, _ = reference_causal_self_attention(x, state, num_heads=4, position_encoding=module.position_encoding)
with torch.no_grad():
    out = module(x)
error = (out.double() - expected).abs().max().item()
print(f"max |out - reference| = {error:.2e}  (float32)")
assert error < 1e-5, error

# %% [markdown]
# ## Pitfalls
#
# * **No output projection.** The widely copied version of this class concatenated the heads and
#   stopped there. Every other implementation (and the original Transformer) ends with an output
#   projection, so weights could not move between that class and the others, and the model had
#   one `Linear` fewer than it claimed. This one adds `self.out`.
# * **A mask buffer per head.** Each `CausalHead` keeps its own `(context_length, context_length)`
#   causal mask; it is registered with `persistent=False`, so it stays out of the state dict. A
#   sequence longer than `context_length` raises a clear error instead of failing inside the
#   mask indexing:

# %%
try:
    module(torch.randn(1, 17, 32))
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# * **Speed.** `H` heads mean `3H + 1` small matmuls for the projections and `2H` for the
#   attention, in a Python loop. Use it to read, and the [split-heads](../split_heads/) or
#   [SDPA](../sdpa/) versions to run.
