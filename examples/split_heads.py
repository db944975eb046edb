# %% [markdown]
# # Split heads and fused QKV
#
# This page shows how one batched matmul replaces the loop over heads, how the three projections
# fuse into one, and what follows from it: heads are interchangeable, GPT-2's sizes, the
# initialisation and dropout the package uses. It builds on the [stacked-heads](../stacked_heads/)
# page; the letters are on the [notation page](../../notation/).
#
# Two registered classes compute causal multi-head self-attention with one batched matmul for all
# heads:
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
# `(T, T)` score matrix at once (batch dimensions `B` and `H`); one `(T, T)`
# [causal mask](../../glossary/#causal-mask) broadcasts over both. Fusing the three projections
# into one `Linear` goes one step further: one larger matmul instead of three.
# ("Attention Is All You Need", section 3.2.2, https://arxiv.org/abs/1706.03762.)
#
# ![The projection's H·D features are H blocks of D; view and transpose give one (T, D) block per head;
# after attention, transpose and reshape put the heads side by side again](../../diagrams/head-split-merge.svg)
#
# API reference: [`attention.causal.split_heads`](../../api/causal/split_heads/), [`attention.causal.fused_qkv`](../../api/causal/fused_qkv/).

# %%
import math

import torch
from torch import nn

from attention import IMPLEMENTATIONS
from attention.causal.fused_qkv import FusedQKVAttention
from attention.causal.split_heads import SplitHeadsAttention, init_family, project_heads
from attention.display import show_markdown, show_shape, show_source, show_table
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

# %% tags=["hide-input"]
show_source(SplitHeadsAttention.__init__)
show_source(SplitHeadsAttention.forward)
show_source(init_family)
show_source(project_heads)

# %% tags=["hide-input"]
show_source(FusedQKVAttention.__init__)
show_source(FusedQKVAttention.forward)

# %% [markdown]
# ## Checked against the float64 reference
#
# The same weights, in the [canonical state dict](../../glossary/#canonical-state-dict) form every
# class exports, go into both modules; both are compared with the reference.

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
# ## The heads have no order
#
# Each head computes its own softmax over its own `D` features; the heads meet only in the output
# projection, which sees their outputs side by side. So relabelling the heads changes nothing:
# move head `h`'s block of `D` rows in the query, key and value weights (and biases) to a new
# place, move the matching block of `D` *columns* of the output weight with it, and the module
# computes the same function. The heads are told apart only by their weights, which start out
# different because they are drawn at random. (ALiBi is the exception: it gives each head index
# its own slope, so there reordering the heads changes the model; see
# [Position encodings](../positional/).)

# %%
torch.manual_seed(0)
H, D = 4, 8
module = SplitHeadsAttention(32, H * D, context_length=16, dropout=0.0, num_heads=H, qkv_bias=True).eval()
state = module.canonical_state_dict()
head_order = torch.tensor([2, 0, 3, 1])  # new head h is old head head_order[h]
rows = (head_order[:, None] * D + torch.arange(D)).reshape(H * D)  # (H*D,): old index of each new row
permuted = {name: state[name][rows] for name in state if not name.startswith("out.")}  # q/k/v weights, biases
permuted["out.weight"] = state["out.weight"][:, rows]  # (d_out, H*D): the matching input columns
permuted["out.bias"] = state["out.bias"]
relabelled = SplitHeadsAttention(32, H * D, context_length=16, dropout=0.0, num_heads=H, qkv_bias=True).eval()
relabelled.load_canonical_state_dict(permuted)

with torch.no_grad():
    q_before, _, _ = project_heads(module, x)  # (B, H, T, D)
    q_after, _, _ = project_heads(relabelled, x)  # (B, H, T, D)
    print("new head h = old head head_order[h]:", torch.equal(q_after, q_before[:, head_order]))
    print(f"max |output difference| = {(relabelled(x) - module(x)).abs().max().item():.1e}")
    permuted["out.weight"] = state["out.weight"]  # forget to move the output columns
    relabelled.load_canonical_state_dict(permuted)
    difference = (relabelled(x) - module(x)).abs().max().item()
    print(f"without moving out.weight's columns: max |output difference| = {difference:.1e}")

# %% [markdown]
# The first difference is float32 rounding (the output projection sums its terms in another
# order); the second is a different function.
#
# ## GPT-2 small, counted
#
# GPT-2 small's sizes; its `c_attn` has biases, so the count that matches it is the one with
# `qkv_bias=True`:

# %%
d_model, num_heads, context_length = 768, 12, 1024  # GPT-2 small's attention
n_layer, vocab_size, mlp_width = 12, 50257, 4 * d_model  # the rest of GPT-2 small, for its total

# %% [markdown]
# Every registered class built with these sizes, against `torch.nn.MultiheadAttention(d_model,
# num_heads)` and the count of GPT-2's own `c_attn` and `c_proj` layers:

# %% tags=["hide-input"]
def parameter_count(module):
    return sum(p.numel() for p in module.parameters())


torch_mha_count = {bias: parameter_count(nn.MultiheadAttention(d_model, num_heads, bias=bias)) for bias in (True, False)}
gpt2_attention = (d_model * 3 * d_model + 3 * d_model) + (d_model * d_model + d_model)  # c_attn + c_proj, with biases
counts = {}
for name, cls in IMPLEMENTATIONS.items():
    modules = {bias: cls(d_model, d_model, context_length, 0.0, num_heads, qkv_bias=bias) for bias in (True, False)}
    buffer_bytes = sum(b.numel() * b.element_size() for b in modules[True].buffers())
    counts[name] = (parameter_count(modules[True]), parameter_count(modules[False]), buffer_bytes)
show_table(
    f"Parameters at d_in = d_out = {d_model}, {num_heads} heads, context_length = {context_length}",
    ["class", "qkv_bias=True", "= nn.MultiheadAttention(bias=True)", "qkv_bias=False", "buffers (MiB)"],
    [[f"`{name}`", f"{with_bias:,}", with_bias == torch_mha_count[True], f"{without_bias:,}", f"{buffer_bytes / 2**20:.2f}"]
     for name, (with_bias, without_bias, buffer_bytes) in counts.items()]
    + [[f"`nn.MultiheadAttention({d_model}, {num_heads}, bias=...)`", f"{torch_mha_count[True]:,}", "—",
        f"{torch_mha_count[False]:,}", "—"],
       ["GPT-2 `c_attn` + `c_proj`", f"{gpt2_attention:,}", gpt2_attention == torch_mha_count[True], "—", "—"]])

# Grouped-query classes (fewer K/V heads than query heads) are another model, with smaller key and value projections.
grouped = {name: cls(d_model, d_model, context_length, 0.0, num_heads).num_kv_heads for name, cls in IMPLEMENTATIONS.items()
           if getattr(cls(d_model, d_model, context_length, 0.0, num_heads), "num_kv_heads", num_heads) != num_heads}
multi_head = {name: count for name, count in counts.items() if name not in grouped}
matching = [name for name, (with_bias, _, _) in multi_head.items() if with_bias == torch_mha_count[True]]
without_bias = {without for _, without, _ in multi_head.values()}
assert len(without_bias) == 1, f"the multi-head classes differ in parameters without biases: {without_bias}"
per_layer = gpt2_attention + 2 * 2 * d_model + (d_model * mlp_width + mlp_width) + (mlp_width * d_model + d_model)  # + 2 LayerNorms, MLP
gpt2_total = vocab_size * d_model + context_length * d_model + n_layer * per_layer + 2 * d_model  # + embeddings, final LayerNorm
show_markdown(
    f"With `qkv_bias=True`, {len(matching)} of the {len(multi_head)} registered multi-head classes have exactly the "
    f"{torch_mha_count[True]:,} parameters of `nn.MultiheadAttention({d_model}, {num_heads})` (whose `bias` "
    f"defaults to True) and of GPT-2's "
    f"`c_attn` + `c_proj`: `3 * {d_model}²` query, key and value weights, `{d_model}²` output weights and "
    f"`4 * {d_model}` biases. The position encodings add none (RoPE and ALiBi are computed, not learned). "
    f"With `qkv_bias=False` every multi-head class has {min(without_bias):,}: "
    f"`nn.MultiheadAttention(bias=False)` has {torch_mha_count[False]:,}, {torch_mha_count[True] - torch_mha_count[False]:,} fewer "
    f"than with `bias=True`, because its one `bias` switch drops the output bias as well, while every class here "
    f"keeps `out.bias` ({min(without_bias) - torch_mha_count[False]:,} parameters). The buffers, not parameters "
    f"and not in the state dict, are the boolean `(context_length, context_length)` causal masks (one per head in "
    f"`stacked_heads`) and the slopes of `alibi_flex`. Across GPT-2 small's {n_layer} layers the attention holds {n_layer * gpt2_attention:,} of "
    f"the model's {gpt2_total:,} parameters ({n_layer * gpt2_attention / gpt2_total:.0%}). "
    + ("The grouped-query classes, " + ", ".join(f"`{name}` ({kv} K/V heads: {counts[name][0]:,} with biases)"
                                                  for name, kv in grouped.items())
       + ", have fewer: their key and value projections have fewer heads than their queries "
       "([Grouped-query and multi-query attention](../gqa/))." if grouped else ""))

# %% [markdown]
# ## Initialisation and dropout
#
# **Initialisation.** Every class here, except the two built on `nn.MultiheadAttention`, keeps
# `nn.Linear`'s default initialisation (`kaiming_uniform_(a=sqrt(5))`, that is uniform in
# `±1/sqrt(fan_in)`, for the weights and the biases) instead of Xavier's. The reasons:
#
# * Tests and benchmarks never depend on it: they load one set of weights into every class through
#   the canonical state dict.
# * The default depends on `fan_in = d_in` only, so it draws from the same distribution whatever
#   the layout: three `(d_out, d_in)` matrices, one fused `(3 * d_out, d_in)` matrix or `H`
#   per-head `(D, d_in)` matrices. Xavier's bound `sqrt(6 / (fan_in + fan_out))` depends on the
#   layout, so the "same" module would start differently in each implementation.
# * A model usually initialises its own weights: Hugging Face's GPT-2 and nanoGPT redraw every
#   `Linear` from `N(0, 0.02)` (the residual projections with a smaller deviation), overwriting
#   the module's own choice. *Build a Large Language Model (From Scratch)* keeps PyTorch's
#   defaults, which is what these classes start with.
#
# `nn.MultiheadAttention` itself uses `xavier_uniform_` on its `(3 * E, E)` `in_proj_weight` as one
# matrix (so `fan_out = 3 * E`), zeros for `in_proj_bias` and `out_proj.bias`, and `nn.Linear`'s
# default for `out_proj.weight`. The `torch_mha` and `torch_mha_weights` wrappers keep that
# initialisation; only the output bias they add back for `qkv_bias=False` is drawn like
# `nn.Linear`'s. The largest absolute values drawn, against each rule's bound:

# %% tags=["hide-input"]
torch.manual_seed(0)
layouts = {
    "`split_heads` `query.weight` (d_out, d_in)": IMPLEMENTATIONS["split_heads"](d_model, d_model, 8, 0.0, num_heads).query.weight,
    "`fused_qkv` `qkv.weight` (3 d_out, d_in)": IMPLEMENTATIONS["fused_qkv"](d_model, d_model, 8, 0.0, num_heads).qkv.weight,
    "`stacked_heads` head 0 `query.weight` (D, d_in)": IMPLEMENTATIONS["stacked_heads"](d_model, d_model, 8, 0.0, num_heads).heads[0].query.weight,
}
default_bound = 1 / math.sqrt(d_model)
rows = [[name, f"{weight.abs().max().item():.4f}", f"{default_bound:.4f}",
         f"{math.sqrt(6 / (weight.shape[1] + weight.shape[0])):.4f}"] for name, weight in layouts.items()]
torch_mha_module = nn.MultiheadAttention(d_model, num_heads)
rows.append(["`nn.MultiheadAttention` `in_proj_weight` (3 E, E)", f"{torch_mha_module.in_proj_weight.abs().max().item():.4f}",
             f"{default_bound:.4f}", f"{math.sqrt(6 / (4 * d_model)):.4f}"])
rows.append(["`nn.MultiheadAttention` `in_proj_bias`, `out_proj.bias`",
             f"{max(torch_mha_module.in_proj_bias.abs().max().item(), torch_mha_module.out_proj.bias.abs().max().item()):.4f}", "— (zeros)", "— (zeros)"])
show_table(f"Initial weights at d_model = {d_model}, {num_heads} heads",
           ["tensor", "max abs value", "nn.Linear default bound 1/sqrt(fan_in)", "Xavier bound sqrt(6/(fan_in+fan_out))"], rows)

# %% [markdown]
# **Dropout.** `dropout` acts on the attention weights only, in training mode: right after the
# softmax, before they multiply the values, so each query sees a random subset of its keys
# (rescaled by `1 / (1 - p)`). The classes that call [SDPA](../../glossary/#sdpa) pass it as
# `dropout_p`, `nn.MultiheadAttention` applies it to the weights too, and the FlexAttention
# classes, which have no such dropout, refuse `dropout > 0`. None of the classes drops anything
# from its output: the output (residual) dropout that some attention modules include (nanoGPT's
# `resid_dropout`) belongs to the surrounding block here. Checked below in training mode with
# `dropout=0.5`: the shape of the tensor each class's `nn.Dropout` receives, and how many output
# elements are exactly zero (a dropout on the output would zero about half of them):

# %%
torch.manual_seed(0)
x_train = torch.randn(2, 16, 32)  # (B, T, d_in)
rows = []
for name, cls in IMPLEMENTATIONS.items():
    try:
        module = cls(32, 32, 16, 0.5, 4).train()
    except ValueError as error:
        rows.append([f"`{name}`", f"— (refuses dropout > 0: `{type(error).__name__}`)", "—"])
        continue
    seen = []
    hooks = [m.register_forward_hook(lambda m, args, out, seen=seen: seen.append(tuple(args[0].shape)))
             for m in module.modules() if isinstance(m, nn.Dropout)]
    out = module(x_train)
    for hook in hooks:
        hook.remove()
    where = ", ".join(f"{shape}" + (f" × {seen.count(shape)}" if seen.count(shape) > 1 else "")
                      for shape in sorted(set(seen))) or ("inside SDPA (`dropout_p`)" if hasattr(module, "dropout_p")
                                                       else "inside `nn.MultiheadAttention`")
    rows.append([f"`{name}`", where, int((out == 0).sum())])

# %% tags=["hide-input"]
show_table("dropout=0.5, training mode, x of shape (B, T, d_in) = (2, 16, 32), 4 heads",
           ["class", "nn.Dropout input shape", "output elements exactly 0"], rows)

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
# as `(B, T, H, 3, D)` instead (a per-head interleaved layout, the one of GPT-NeoX's
# `query_key_value` in Hugging Face's `GPTNeoXAttention`) also
# runs, and silently uses key weights as query weights. Loading a GPT-2 style checkpoint requires
# the first layout; the canonical state dict spells it out as separate `query`, `key`, `value`.
#
# **GPT-2's `c_attn` is stored transposed.** Hugging Face's GPT-2 builds `c_attn` and `c_proj` as
# `Conv1D` layers (`transformers.pytorch_utils.Conv1D`), which compute `x @ weight + bias` with a
# weight of shape `(d_in, d_out)`: the transpose of `nn.Linear`'s `(d_out, d_in)`. Its `c_attn`
# weight is `(d_model, 3 * d_model)`, query, key and value blocks side by side along the last
# dimension. Loading it takes a `.T` before the split, or every projection silently uses the
# wrong numbers (for a square block the shapes even match). Here with a random weight in `Conv1D`'s
# layout, checked against `Conv1D`'s own formula:
#
# %%
torch.manual_seed(0)
conv1d_weight, conv1d_bias = torch.randn(32, 3 * 32), torch.randn(3 * 32)  # c_attn: (d_in, 3 * d_out), as Conv1D stores it
qkv_weight, qkv_bias = conv1d_weight.T, conv1d_bias  # (3 * d_out, d_in): nn.Linear's layout
gpt2_style = {f"{name}.weight": block for name, block in zip(("query", "key", "value"), qkv_weight.split(32))}
gpt2_style.update({f"{name}.bias": block for name, block in zip(("query", "key", "value"), qkv_bias.split(32))})
gpt2_style.update({"out.weight": torch.randn(32, 32), "out.bias": torch.randn(32)})
loaded = FusedQKVAttention(32, 32, 16, 0.0, 4, qkv_bias=True).eval()
loaded.load_canonical_state_dict(gpt2_style)
with torch.no_grad():
    conv1d_out = x @ conv1d_weight + conv1d_bias  # (B, T, 3 * d_out): what GPT-2's c_attn computes
    print(f"fused_qkv's qkv(x) against Conv1D's x @ W + b: max |difference| = "
          f"{(loaded.qkv(x) - conv1d_out).abs().max().item():.1e}")
    torch.testing.assert_close(loaded.qkv(x), conv1d_out)

# %% [markdown]
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
