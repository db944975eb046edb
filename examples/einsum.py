# %% [markdown]
# # einsum and sequence-first
#
# Two registered classes that write the contractions with `torch.einsum`, so every index has a
# name on the page:
#
# * `EinsumAttention` (`attention/causal/einsum.py`, `einsum`): batch-first, einsum throughout,
#   including the projections;
# * `SeqFirstAttention` (`attention/causal/seq_first.py`, `seq_first`): after labml.ai's annotated
#   implementation (https://nn.labml.ai/transformers/mha.html), computed sequence-first with a
#   `PrepareForMultiHeadAttention` layer that projects and splits heads in one step.
#
# ## The idea
#
# An einsum string lists the indices of each input and of the output; indices missing from the
# output are summed over. With `b` batch, `h` head, `t` query position, `s` key position, `d` head
# feature and `c` input feature:
#
# | Step | einsum | Shapes |
# |------|--------|--------|
# | project into heads | `btc,hdc->bhtd` | `(B, T, C)`, `(H, D, C)` -> `(B, H, T, D)` |
# | scores | `bhtd,bhsd->bhts` | `(B, H, T, D)`, `(B, H, S, D)` -> `(B, H, T, S)` |
# | weighted values | `bhts,bhsd->bthd` | `(B, H, T, S)`, `(B, H, S, D)` -> `(B, T, H, D)` |
# | output projection | `bthd,ohd->bto` | `(B, T, H, D)`, `(d_out, H, D)` -> `(B, T, d_out)` |
#
# The softmax turns the scores of each query into weights over the keys, so it runs over `s`.
# The sequence-first version does the same with `i` (query) and `j` (key) on `(T, B, ...)`
# tensors; its scores are `(T, S, B, H)` and its softmax runs over dimension 1.

# %%
import torch

from attention.causal.einsum import EinsumAttention
from attention.causal.seq_first import PrepareForMultiHeadAttention, SeqFirstAttention
from attention.display import show_shape, show_source
from attention.reference import reference_causal_self_attention

# %% [markdown]
# ## Shapes, step by step
#
# `B = 2`, `T = 4`, `d_in = 6`, `H = 2`, `D = 2`, `d_out = 4`; first batch-first:

# %%
torch.manual_seed(0)
B, T, d_in, d_out, H = 2, 4, 6, 4, 2
D = d_out // H
x = torch.randn(B, T, d_in)
module = EinsumAttention(d_in, d_out, context_length=8, dropout=0.0, num_heads=H).eval()

with torch.no_grad():
    show_shape("x", x, "(B, T, C)")
    weight = module.query.weight.view(H, D, d_in)
    show_shape("query.weight.view(H, D, d_in)", weight, "(H, D, C)")
    q = torch.einsum("btc,hdc->bhtd", x, weight)
    k, v = module.project_heads(x, module.key), module.project_heads(x, module.value)
    show_shape('q = einsum("btc,hdc->bhtd") (k, v alike)', q, "(B, H, T, D)")
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / D**0.5
    show_shape('scores = einsum("bhtd,bhsd->bhts") / sqrt(D)', scores, "(B, H, T, S)")
    weights = torch.softmax(scores.masked_fill(~module.causal_mask[:T, :T], float("-inf")), dim=-1)
    show_shape("weights = softmax(masked scores, dim=-1)", weights, "(B, H, T, S)")
    context = torch.einsum("bhts,bhsd->bthd", weights, v)
    show_shape('context = einsum("bhts,bhsd->bthd")', context, "(B, T, H, D)")
    out = torch.einsum("bthd,ohd->bto", context, module.out.weight.view(d_out, H, D)) + module.out.bias
    show_shape('out = einsum("bthd,ohd->bto") + bias', out, "(B, T, d_out)")
    print("same as module(x):", torch.allclose(out, module(x), atol=1e-6))

# %% [markdown]
# Then sequence-first: the input is transposed to `(T, B, C)` and stays that way until the end.

# %%
seq_first = SeqFirstAttention(d_in, d_out, context_length=8, dropout=0.0, num_heads=H).eval()
with torch.no_grad():
    x_tb = x.transpose(0, 1)
    show_shape("x.transpose(0, 1)", x_tb, "(T, B, C)")
    q, k, v = seq_first.query(x_tb), seq_first.key(x_tb), seq_first.value(x_tb)
    show_shape("q = PrepareForMultiHeadAttention(x) (k, v)", q, "(T, B, H, D)")
    scores = torch.einsum("ibhd,jbhd->ijbh", q, k) * seq_first.scale
    show_shape('scores = einsum("ibhd,jbhd->ijbh") * scale', scores, "(T, S, B, H)")
    keep = seq_first.causal_mask[:T, :T, None, None]
    show_shape("causal_mask[:T, :T, None, None]", keep, "(T, S, 1, 1)")
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=1)
    show_shape("weights = softmax(masked scores, dim=1)", weights, "(T, S, B, H)")
    context = torch.einsum("ijbh,jbhd->ibhd", weights, v).reshape(T, B, d_out)
    show_shape('einsum("ijbh,jbhd->ibhd").reshape(T, B, d_out)', context, "(T, B, H*D)")
    out = seq_first.out(context).transpose(0, 1)
    show_shape("out(context).transpose(0, 1)", out, "(B, T, d_out)")
    print("same as seq_first(x):", torch.allclose(out, seq_first(x), atol=1e-6))

# %% [markdown]
# ## The code

# %%
show_source(EinsumAttention.project_heads)
show_source(EinsumAttention.forward)

# %%
show_source(PrepareForMultiHeadAttention)
show_source(SeqFirstAttention.forward)

# %% [markdown]
# ## Checked against the float64 reference

# %%
x = torch.randn(2, 16, 32)
einsum_module = EinsumAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
seq_first = SeqFirstAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
state = einsum_module.canonical_state_dict()
seq_first.load_canonical_state_dict(state)
expected, expected_weights = reference_causal_self_attention(x, state, num_heads=4)
with torch.no_grad():
    for name, module in (("einsum", einsum_module), ("seq_first", seq_first)):
        error = (module(x).double() - expected).abs().max().item()
        print(f"{name:<10} max |out - reference| = {error:.2e}  (float32)")
        assert error < 1e-5, (name, error)

# %% [markdown]
# ## Pitfalls
#
# **The softmax must run over the keys.** The widely copied einsum version computed the
# `(B, H, T, S)` scores correctly and then called `softmax(scores, dim=1)`: dimension 1 is the
# *heads*. Each weight was then normalised across heads instead of across keys. Nothing fails,
# the shapes are all right, and the output is wrong:

# %%
with torch.no_grad():
    q = einsum_module.project_heads(x, einsum_module.query)  # (B, H, T, D)
    k = einsum_module.project_heads(x, einsum_module.key)  # (B, H, S, D)
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / 8**0.5  # (B, H, T, S)
    allowed = einsum_module.causal_mask[:16, :16]  # (T, S), True = attend
    scores = scores.masked_fill(~allowed, float("-inf"))
    for dim, label in ((-1, "dim=-1 (keys s), ours"), (1, "dim=1 (heads h), copied")):
        weights = torch.softmax(scores, dim=dim)  # (B, H, T, S)
        nan_count = weights.isnan().sum().item()
        over_keys = weights.nan_to_num(0.0).sum(dim=-1)  # should be 1 for every (b, h, t)
        error = (weights.double() - expected_weights)[..., allowed].abs().max().item()
        print(f"softmax {label}:\n    NaN weights: {nan_count}, sum over keys in "
              f"[{over_keys.min():.2f}, {over_keys.max():.2f}], max error on allowed keys = {error:.2e}")

# %% [markdown]
# With `dim=1`, the weights of one query no longer sum to 1 over the keys: each is a share of a
# softmax across the `H` heads. And every future key, `-inf` in all heads alike, becomes
# `0 / 0 = NaN`. Without a causal mask the same bug yields no NaN at all, only wrong numbers. The
# safe habit: normalise over the index that the next einsum sums away (`s` here, `j`
# sequence-first), and say so in a comment.
#
# **`dim=1` is right sequence-first, wrong batch-first.** In `SeqFirstAttention` the scores are
# `(T, S, B, H)` and `softmax(dim=1)` *is* the key axis. Porting that line to a batch-first
# layout without changing the axis gives exactly the bug above. Using `dim=-1` with the keys last
# (batch-first) or naming the axis in a comment (`# softmax over keys j`) keeps it visible.
#
# **einsum speed.** `torch.einsum` lowers each contraction to a batched matmul, so these versions
# run about as fast as the [split-heads](../split_heads/) one, but the output-projection einsum
# and the transposes it implies can cost extra copies. For speed, use [SDPA](../sdpa/).
