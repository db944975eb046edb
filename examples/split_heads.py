# %% [markdown]
# # Split heads and fused QKV
#
# Two registered classes that compute causal multi-head self-attention with one batched matmul
# for all heads:
#
# * `SplitHeadsAttention` (`attention/causal/split_heads.py`, `split_heads`): separate query, key
#   and value projections, the form of nanoGPT's ancestors and of *Build a Large Language Model
#   (From Scratch)*;
# * `FusedQKVAttention` (`attention/causal/fused_qkv.py`, `fused_qkv`): one `Linear(d_in, 3 * d_out)`
#   for all three, as GPT-2 and nanoGPT do (`c_attn`).
#
# ## The idea
#
# The [stacked-heads version](../stacked_heads/) runs `H` small heads in a loop. But `H` query
# projections of `D` features each are one projection of `H * D = d_out` features, cut into `H`
# slices. So: project once to `d_out` features, *view* the last dimension as `(H, D)`, move the
# head dimension in front of the sequence dimension, and one batched matmul computes every head's
# `(T, T)` score matrix at once (batch dimensions `B` and `H`). Fusing the three projections
# into one `Linear` goes one step further: one larger matmul instead of three.
# ("Attention Is All You Need", section 3.2.2, https://arxiv.org/abs/1706.03762.)

# %%
import math

import torch

from attention.causal.fused_qkv import FusedQKVAttention
from attention.causal.split_heads import SplitHeadsAttention, init_family, project_heads
from attention.display import show_shape, show_source
from attention.reference import reference_causal_self_attention

# %% [markdown]
# ## Shapes, step by step
#
# `B = 2` sequences of `T = 4` positions, `d_in = 6` input features, `H = 2` heads of `D = 2`
# features (`d_out = 4`). First the split-heads module:

# %%
torch.manual_seed(0)
B, T, d_in, d_out, H = 2, 4, 6, 4, 2
D = d_out // H
x = torch.randn(B, T, d_in)
split = SplitHeadsAttention(d_in, d_out, context_length=8, dropout=0.0, num_heads=H).eval()

show_shape("x", x, "(B, T, d_in)")
show_shape("split.query(x)", split.query(x), "(B, T, d_out)")
show_shape(".view(B, T, H, D)", split.query(x).view(B, T, H, D), "(B, T, H, D)")
q = split.query(x).view(B, T, H, D).transpose(1, 2)
k = split.key(x).view(B, T, H, D).transpose(1, 2)
v = split.value(x).view(B, T, H, D).transpose(1, 2)
show_shape(".transpose(1, 2) = q (k, v alike)", q, "(B, H, T, D)")
scores = q @ k.transpose(-2, -1) / math.sqrt(D)
show_shape("scores = q @ k^T / sqrt(D)", scores, "(B, H, T, T)")
weights = torch.softmax(scores.masked_fill(~split.causal_mask[:T, :T], float("-inf")), dim=-1)
show_shape("weights = softmax(masked scores, -1)", weights, "(B, H, T, T)")
context = weights @ v
show_shape("context = weights @ v", context, "(B, H, T, D)")
merged = context.transpose(1, 2).reshape(B, T, d_out)
show_shape(".transpose(1, 2).reshape(B, T, d_out)", merged, "(B, T, H*D)")
show_shape("out = split.out(merged)", split.out(merged), "(B, T, d_out)")
with torch.no_grad():
    print("same as split(x):", torch.allclose(split.out(merged), split(x)))

# %% [markdown]
# The fused module differs only in how `q`, `k` and `v` come out of the projection: one matmul
# produces `3 * d_out` features per position, ordered query block, key block, value block, and one
# `view` + `permute` separates them and the heads.

# %%
fused = FusedQKVAttention(d_in, d_out, context_length=8, dropout=0.0, num_heads=H).eval()
show_shape("fused.qkv(x)", fused.qkv(x), "(B, T, 3*d_out)")
qkv = fused.qkv(x).view(B, T, 3, H, D)
show_shape(".view(B, T, 3, H, D)", qkv, "(B, T, 3, H, D)")
q, k, v = qkv.permute(2, 0, 3, 1, 4)
show_shape(".permute(2, 0, 3, 1, 4) -> q, k, v", q, "3 x (B, H, T, D)")
print("fused.qkv.weight:", tuple(fused.qkv.weight.shape), "= query, key and value weights stacked: (3*d_out, d_in)")

# %% [markdown]
# ## The code
#
# Both classes, from the installed package. The projections and the head split are two small
# functions below the class; the other implementation files repeat them as marked copies
# (`# Same as attention/causal/split_heads.py::project_heads`, kept identical by a test), so each
# file stays a single file that imports only torch.

# %%
show_source(SplitHeadsAttention.__init__)
show_source(SplitHeadsAttention.forward)
show_source(init_family)
show_source(project_heads)

# %%
show_source(FusedQKVAttention.__init__)
show_source(FusedQKVAttention.forward)

# %% [markdown]
# ## Checked against the float64 reference
#
# The same canonical weights go into both modules; both are compared with the reference.

# %%
x = torch.randn(2, 16, 32)
split = SplitHeadsAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
fused = FusedQKVAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
state = split.canonical_state_dict()
fused.load_canonical_state_dict(state)
expected, _ = reference_causal_self_attention(x, state, num_heads=4)
with torch.no_grad():
    for name, module in (("split_heads", split), ("fused_qkv", fused)):
        error = (module(x).double() - expected).abs().max().item()
        print(f"{name:<12} max |out - reference| = {error:.2e}  (float32)")
        assert error < 1e-5, (name, error)

# %% [markdown]
# ## Pitfalls
#
# **View first, then transpose.** The projection's features are laid out as `H` consecutive
# blocks of `D`, per position. `.view(B, T, H, D)` cuts along exactly those blocks; the transpose
# then moves the head dimension forward. Viewing straight to `(B, H, T, D)` runs without an error,
# because the element count matches, but mixes positions and heads:

# %%
with torch.no_grad():
    projected = split.query(x)  # (B, T, d_out)
    right = projected.view(2, 16, 4, 8).transpose(1, 2)  # (B, H, T, D)
    wrong = projected.view(2, 4, 16, 8)  # (B, H, T, D) by shape only
print("same shape:", right.shape == wrong.shape, "| same values:", torch.equal(right, wrong))

# %% [markdown]
# **`reshape` (or `.contiguous().view`) when merging.** After the transpose the context tensor is
# no longer contiguous, and `view` refuses it:

# %%
context = torch.randn(2, 4, 16, 8).transpose(1, 2)  # (B, T, H, D), not contiguous
try:
    context.view(2, 16, 32)
except RuntimeError as error:
    print("RuntimeError:", str(error).splitlines()[0])
print("reshape works:", tuple(context.reshape(2, 16, 32).shape))

# %% [markdown]
# **Fused weights have a layout.** `FusedQKVAttention` orders the `3 * d_out` output features as
# query block, key block, value block, and splits them with `.view(B, T, 3, H, D)`. Viewing them
# as `(B, T, H, 3, D)` instead (a per-head interleaved layout, which some checkpoints use) also
# runs, and silently uses key weights as query weights. Loading a GPT-2 style checkpoint requires
# the first layout; the canonical state dict spells it out as separate `query`, `key`, `value`.
#
# **Scale by the head size.** The scores are divided by `sqrt(D)`, the size of the vectors in
# each dot product, not by `sqrt(d_out)`. With `H` heads the wrong choice shrinks every score by
# `sqrt(H)` and flattens the softmax:

# %%
with torch.no_grad():
    scale_error = {}
    for divisor_name, divisor in (("sqrt(D)", math.sqrt(8)), ("sqrt(d_out)", math.sqrt(32))):
        q = split.query(x).view(2, 16, 4, 8).transpose(1, 2)
        k = split.key(x).view(2, 16, 4, 8).transpose(1, 2)
        v = split.value(x).view(2, 16, 4, 8).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1) / divisor).masked_fill(~split.causal_mask[:16, :16], float("-inf"))
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(2, 16, 32)
        scale_error[divisor_name] = (split.out(context).double() - expected).abs().max().item()
for divisor_name, error in scale_error.items():
    print(f"divide by {divisor_name:<12} max |out - reference| = {error:.2e}")

# %% [markdown]
# **The mask buffer caps the length.** Both classes keep a `(context_length, context_length)`
# boolean buffer `causal_mask` (True = attend, `persistent=False`, so not in the state dict) and
# raise a `ValueError` for longer inputs. The [SDPA version](../sdpa/) with `is_causal=True`
# needs no buffer at all.
