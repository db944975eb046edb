# %% [markdown]
# # Stacked single heads
#
# This page builds multi-head attention the most literal way, as `num_heads` separate single-head
# modules, and measures what that costs. It assumes single-head causal attention as built on
# [Attention in five minutes](../five_minutes/); the letters (`B`, `T`, `H`, `D`, ...) are on the
# [notation page](../../notation/).
#
# `StackedHeadsAttention` (`attention/causal/stacked_heads.py`, registered as `stacked_heads`)
# builds `num_heads` independent single-head attention modules, runs them one after another,
# concatenates what they return, and projects.
#
# ## The idea
#
# One head turns each position's features into a query, a key and a value (three `Linear`
# layers of `head_dim` outputs), scores every query against every key, hides the keys that lie in
# the future (the [causal mask](../../glossary/#causal-mask)), turns each row of scores into
# weights with a softmax, and returns the weighted sum of the values. `H` such heads, each with its
# own weights, look at the sequence in `H` different ways; their outputs, side by side, form a
# vector of `H * D = d_out` features, and a last `Linear` mixes them.
#
# It is the easiest version to read: every head is its own small matmul, launched in a Python
# loop. The [split-heads version](../split_heads/) computes the same thing with one batched matmul
# for all heads. The stacked one holds the scores of one head at a time instead of all heads', and
# its loop costs time per head; how the two compare at each sequence length, the section *Speed
# and memory* below reads from a recorded benchmark run.
#
# This is the `MultiHeadAttentionWrapper` of *Build a Large Language Model (From Scratch)*
# (chapter 3) with two changes. **`d_out` means the total width here.** In the wrapper, `d_out` is
# the size of *each* head and the output is `num_heads * d_out` wide; here `d_out` is the output
# width, split into `num_heads` heads of `d_out // num_heads`, as in every class of the package. A
# wrapper built as `MultiHeadAttentionWrapper(d_in, d_head, context_length, dropout, num_heads)`
# corresponds to `StackedHeadsAttention(d_in, num_heads * d_head, context_length, dropout,
# num_heads)`. **This class ends in an output projection**, which the wrapper lacks (see
# *Pitfalls* at the end of the page).
#
# API reference: [`attention.causal.stacked_heads`](../../api/causal/stacked_heads/).

# %%
import torch

from attention import IMPLEMENTATIONS
from attention.causal.stacked_heads import CausalHead, StackedHeadsAttention
from attention.display import show_markdown, show_shape, show_source
from attention.reference import reference_causal_self_attention
from attention.report.long import recorded, stacked_section

torch.manual_seed(0)

print("registered as 'stacked_heads':", IMPLEMENTATIONS["stacked_heads"] is StackedHeadsAttention)

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
# The weights of the last head for the first sequence: row `i` is query position `i`, column `j`
# key position `j`. Every row sums to 1 and has zeros above the diagonal: no position looks ahead.

# %%
print(weights[0].detach().numpy().round(3))

# %% [markdown]
# ## The code
#
# Shown from the installed package at build time, so this page cannot drift from it.

# %% tags=["hide-input"]
show_source(CausalHead)
show_source(StackedHeadsAttention)

# %% [markdown]
# ## Checked against the float64 reference
#
# Every implementation exports its weights in one shared form, the
# [canonical state dict](../../glossary/#canonical-state-dict) that `attention.reference` reads.
# Head `h`'s query rows become rows `h*D:(h+1)*D` of one `(d_out, d_in)` query matrix, and
# likewise for keys and values.

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
# ## Speed and memory, from a recorded run
#
# The numbers below are read at build time from the newest recorded float32 CPU run of the
# benchmark's default profile (how it is measured: the [Benchmarks](../../benchmarks/) page). "peak
# MiB" is the tensor memory of one call at its worst moment. A row is called faster or slower only
# when the two [interquartile ranges](../../glossary/#iqr) of time do not overlap; otherwise the run
# cannot tell the two apart ("tied"). `sdpa_causal`, the [SDPA](../../glossary/#sdpa) version, is
# listed for scale.

# %%
path, run = recorded("")
show_markdown(stacked_section(path, run))

# %% [markdown]
# Both classes do the same arithmetic; what differs is how the work is cut up.
#
# * **Memory.** Without gradients, `stacked_heads` computes one head's `(B, T, T)` scores,
#   weights and output, and frees them before the next head starts. `split_heads` holds the
#   `(B, H, T, T)` scores of all heads at once, and at its peak more than one tensor of that size
#   (scaled scores, masked scores, weights), so its peak is larger by a factor of the order of
#   `H`. With gradients (forward + backward) both must keep every head's attention weights for
#   the backward pass, so the gap narrows.
# * **A fixed price per head.** `stacked_heads` runs `3H` projection matmuls `d_in -> D` instead
#   of 3 of `d_in -> d_out` (small matmuls keep the cores less busy), `2H` attention matmuls and a
#   Python loop. This costs most, relative to the rest, at short lengths. The view and transposes
#   of `split_heads` cost little by comparison: they copy tensors of `(B, T, d_out)` size, never
#   `(T, T)`.
# * **Passes over score-sized tensors.** The attention core is a few passes over `(T, T)`-sized
#   data: scale, mask, softmax, weighted sum. `split_heads` makes each pass over all `H` heads at
#   once, on tensors too large for the CPU caches and freshly allocated on every call.
#   `stacked_heads` makes the same passes one head at a time, on tensors `H` times smaller, which
#   helps as long as one head's `(T, T)` is small enough to stay in cache between passes. This part
#   grows like `T²`; which effect wins at which length is the table's verdict, and it differs
#   between machines.

# %% [markdown]
# ## Pitfalls
#
# * **No output projection.** The book's wrapper concatenates the heads and stops there. The
#   original Transformer and every other class here end with an output projection `W^O`, so the
#   wrapper's weights cannot move to or from the other classes. This class adds `self.out`.
# * **A mask buffer used whole.** Each head keeps a `(context_length, context_length)` causal mask.
#   Copies of the wrapper that apply it whole, without cutting it to the input's length
#   (`causal_mask[:T, :T]`, as `CausalHead.forward` does), work only when `T == context_length`
#   exactly. Below, a wrapper built that way (`d_out` per head, no output projection, the mask
#   applied whole) next to this class, converted as above. With the
#   same head weights and an identity output projection, both agree at `T = context_length`; at a
#   shorter `T` the wrapper fails:

# %%
from torch import nn


class UnslicedMaskHead(CausalHead):
    """A `CausalHead` whose forward applies the whole `(context_length, context_length)` mask."""

    def forward(self, x):
        q, k, v = self.query(x), self.key(x), self.value(x)  # (B, T, D) each
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5  # (B, T, T)
        scores = scores.masked_fill(~self.causal_mask, float("-inf"))  # works only if T == context_length
        return torch.softmax(scores, dim=-1) @ v  # (B, T, D)


class UnslicedMaskWrapper(nn.Module):
    """The wrapper: `d_out` is each head's size, the output `num_heads * d_out` wide, no projection."""

    def __init__(self, d_in, d_out, context_length, num_heads):
        super().__init__()
        self.heads = nn.ModuleList(UnslicedMaskHead(d_in, d_out, context_length, 0.0) for _ in range(num_heads))

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)  # (B, T, num_heads * d_out)


d_in, d_head, context_length, num_heads = 6, 2, 8, 2
wrapper = UnslicedMaskWrapper(d_in, d_head, context_length, num_heads).eval()
ours = StackedHeadsAttention(d_in, num_heads * d_head, context_length, 0.0, num_heads).eval()  # total width
with torch.no_grad():
    for wrapper_head, our_head in zip(wrapper.heads, ours.heads):
        our_head.load_state_dict(wrapper_head.state_dict())  # the same q, k, v weights per head
    ours.out.weight.copy_(torch.eye(num_heads * d_head))  # an identity output projection
    ours.out.bias.zero_()
    for T in (context_length, 4):
        x = torch.randn(1, T, d_in)
        try:
            wrapper_out = wrapper(x)
            print(f"T = {T}: wrapper {tuple(wrapper_out.shape)}, ours {tuple(ours(x).shape)}, "
                  f"same values: {torch.allclose(wrapper_out, ours(x))}")
        except RuntimeError as error:
            print(f"T = {T}: wrapper raises RuntimeError: {error}")
            print(f"T = {T}: ours {tuple(ours(x).shape)}")

# %% [markdown]
# * **A mask buffer per head.** Each `CausalHead` keeps its own causal mask, registered with
#   `persistent=False`, so it stays out of the state dict. A sequence longer than `context_length`
#   raises a clear error instead of failing inside the mask indexing:

# %%
try:
    module(torch.randn(1, 17, 32))
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# * **Speed depends on the length and the machine.** The loop over heads is a fixed cost per
#   call, the all-heads score tensors of the batched versions a cost growing like `T²`: measure at
#   the lengths you use (`python -m attention.bench`). For speed, use the [SDPA](../sdpa/)
#   versions, whose fused kernels never store the `(T, T)` scores.
