# %% [markdown]
# # The general module
#
# This page shows the package's general-purpose attention module: self- and cross-attention,
# masks of any broadcastable shape (padding, causal, chunked decoding), returned weights and rotary
# embeddings. It assumes the [split-heads](../split_heads/) page (the same shell), the
# [SDPA page](../sdpa/) (the kernel it calls) and the [masks](../masks/) page.
#
# `attention.MultiHeadAttention` (`attention/general.py`) has the signature `(d_model, num_heads,
# dropout=0.0, bias=True, *, rope=False, rope_base=10000.0)`. Where the causal family is fixed to
# self-attention with a [causal mask](../../glossary/#causal-mask), it takes separate `query`, `key`
# and `value` inputs:
#
# * self-attention (`key` and `value` default to `query`) and cross-attention (queries from one
#   sequence, keys and values from another, of another length);
# * an optional boolean `mask`, True = attend, of any shape that broadcasts to `(B, H, Tq, Tk)`,
#   as in SDPA: `(Tq, Tk)`, `(B, 1, Tq, Tk)`, a [padding mask](../../glossary/#padding-mask)
#   `(B, 1, 1, Tk)`...;
# * the attention weights on request (`need_weights=True`);
# * optional rotary position embeddings on queries and keys (`rope=True`).
#
# ## The idea
#
# The same shell as the [split-heads](../split_heads/) version, with `Tq` query positions and
# `Tk` key positions instead of one `T`. Without `need_weights` the attention runs through
# [`F.scaled_dot_product_attention`](../../glossary/#sdpa) ([its page](../sdpa/)), which picks a
# fused kernel; with it, the `(B, H, Tq, Tk)` weights are computed explicitly so they can be
# returned.
#
# API reference: [`attention.general`](../../api/general/).

# %%
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from attention import MultiHeadAttention, masks
from attention.display import show, show_shape, show_source
from attention.general import apply_rotary, rotary_cos_sin
from attention.plotting import plot_attention_weights
from attention.reference import reference_attention

# %% [markdown]
# ## Shapes, step by step
#
# Cross-attention from `Tq = 3` query positions to `Tk = 5` key/value positions, `d_model = 8`,
# `H = 2` heads of `D = 4`, with the weights returned.

# %%
torch.manual_seed(0)
B, Tq, Tk, d_model, H = 2, 3, 5, 8, 2
D = d_model // H
queries, memory = torch.randn(B, Tq, d_model), torch.randn(B, Tk, d_model)
mha = MultiHeadAttention(d_model, H).eval()
with torch.no_grad():
    show_shape("query input", queries, "(B, Tq, d_model)")
    show_shape("key = value input", memory, "(B, Tk, d_model)")
    q = mha.query(queries).view(B, Tq, H, D).transpose(1, 2)
    k = mha.key(memory).view(B, Tk, H, D).transpose(1, 2)
    show_shape("q", q, "(B, H, Tq, D)")
    show_shape("k (v alike)", k, "(B, H, Tk, D)")
    show_shape("scores = q @ k^T / sqrt(D)", q @ k.transpose(-2, -1), "(B, H, Tq, Tk)")
    out, weights = mha(queries, memory, need_weights=True)
    show_shape("out", out, "(B, Tq, d_model)")
    show_shape("weights", weights, "(B, H, Tq, Tk)")

# %% [markdown]
# ## The weights, token by token
#
# `need_weights=True` returns the `(B, H, Tq, Tk)` weights the module computed. Here a module with
# `d_model = 32` and 4 heads reads a six-word sentence padded to 8 tokens, under the mask a decoder
# uses for a padded batch: causal, and no padded key (`and_masks(causal, key_padding(lengths))` from
# [`attention.masks`](../masks/)). The first panel is that mask; then one panel per head, a row per
# query token: each row is a distribution over the key tokens, zero wherever the mask is False.
# The weights of this module are random, not trained, so the patterns show what the mask allows and
# how differently four heads spread their weight, not what a language model learns.

# %%
tokens = ["the", "cat", "sat", "on", "the", "mat", "<pad>", "<pad>"]
vocabulary = sorted(set(tokens))
token_ids = torch.tensor([[vocabulary.index(token) for token in tokens]])  # (B, T) = (1, 8)
T, d_model, H = len(tokens), 32, 4
embedding = torch.nn.Embedding(len(vocabulary), d_model)
mha = MultiHeadAttention(d_model, H).eval()
lengths = torch.tensor([6])  # real tokens per sequence; the rest is padding
mask = masks.dense_mask(masks.and_masks(masks.causal, masks.key_padding(lengths)), T, T, batch=1)  # (1, 1, T, T)
with torch.no_grad():
    x = embedding(token_ids)  # (B, T, d_model)
    out, weights = mha(x, mask=mask, need_weights=True)  # weights: (B, H, T, T)
show(plot_attention_weights(weights[0], tokens=tokens, mask=mask[0, 0], ncols=2,
                            title="MultiHeadAttention(32, 4) weights, causal + key padding (random weights)"))

# %% [markdown]
# With no position encoding, attention cannot tell the two "the" tokens apart: they have the same
# embedding, hence the same key, so every query that sees both gives them exactly the same weight
# (the [position encodings page](../positional/) shows how RoPE and ALiBi break that tie):

# %%
print("weights of 'mat' (query 5) on 'the' at 0 and 'the' at 4, per head:")
print(weights[0, :, 5, [0, 4]])
print("identical:", torch.equal(weights[0, :, 5, 0], weights[0, :, 5, 4]))

# %% [markdown]
# ## The code

# %% tags=["hide-input"]
show_source(MultiHeadAttention.forward)
show_source(rotary_cos_sin)
show_source(apply_rotary)

# %% [markdown]
# ## Masks: any shape that broadcasts
#
# The mask broadcasts to `(B, H, Tq, Tk)` as in SDPA, so each mask takes only the dimensions it
# varies over. A causal mask is the same for every sequence and head: `(Tq, Tk)`. A padding mask
# differs per sequence and is the same for every head and query: `(B, 1, 1, Tk)`. A padding mask
# often comes as a `(B, Tk)` tensor, the layout of `nn.MultiheadAttention`'s `key_padding_mask`;
# one indexing turns it into the broadcastable shape (for `key_padding_mask` itself, where True
# means padding, invert it first: `~key_padding_mask[:, None, None, :]`). The second sequence
# below has only 3 real keys:

# %%
B, Tq, Tk, d_model, H = 2, 12, 20, 32, 4
valid_keys = torch.tensor([Tk, 3])  # real keys per sequence; the rest is padding
key_is_real = torch.arange(Tk)[None, :] < valid_keys[:, None]  # (B, Tk), True = attend
padding_mask = key_is_real[:, None, None, :]  # (B, 1, 1, Tk): the same for every head and query
show_shape("key_is_real", key_is_real, "(B, Tk)")
show_shape("padding_mask = key_is_real[:, None, None, :]", padding_mask, "(B, 1, 1, Tk)")
positions = torch.arange(Tq)
causal_mask = positions[:, None] >= positions[None, :]  # (Tq, Tq), True = attend
show_shape("causal_mask", causal_mask, "(Tq, Tq)")

# %% [markdown]
# ## Checked against the float64 reference
#
# Four cases, each against `attention.reference.reference_attention` with the module's
# [canonical weights](../../glossary/#canonical-state-dict): causal self-attention,
# cross-attention with the padding mask above, the returned weights, and rotary embeddings.

# %%
def report(label, actual, expected, tolerance=1e-5):
    error = (actual.double() - expected).abs().max().item()
    print(f"{label:<44} max error = {error:.2e}")
    assert error < tolerance, (label, error)


# %%
mha = MultiHeadAttention(d_model, H).eval()
state = mha.canonical_state_dict()
x, memory = torch.randn(B, Tq, d_model), torch.randn(B, Tk, d_model)

with torch.no_grad():
    expected, expected_weights = reference_attention(x, x, x, state, H, mask=causal_mask)
    out, _ = mha(x, mask=causal_mask)
    report("self-attention, causal mask (Tq, Tq)", out, expected)

    expected, expected_weights = reference_attention(x, memory, memory, state, H, mask=padding_mask)
    out, weights = mha(x, memory, mask=padding_mask, need_weights=True)
    report("cross-attention, padding mask (B, 1, 1, Tk)", out, expected)
    report("cross-attention, padding mask: weights", weights, expected_weights)
    out_fused, _ = mha(x, memory, mask=padding_mask)  # need_weights=False: the SDPA path
    report("... same through SDPA (need_weights=False)", out_fused, expected)

    rotary = MultiHeadAttention(d_model, H, rope=True).eval()
    rotary.load_canonical_state_dict(state)
    expected, _ = reference_attention(x, x, x, state, H, mask=causal_mask, rope_base=10000.0)
    out, _ = rotary(x, mask=causal_mask)
    report("self-attention, causal mask, RoPE", out, expected)

# %% [markdown]
# ## Pitfalls
#
# **A query with nothing to attend to.** If a mask row is all False (a padding query, or a window
# that excludes everything), a plain masked softmax is `0 / 0 = NaN`, and the NaN spreads into the
# gradients of every parameter. The module lets such a row attend everywhere, then multiplies its
# attention output by zero: the row's context is 0 (so the module's output there is just the
# output projection's bias), and the gradients stay finite. The reference defines the same.

# %%
empty_rows = torch.ones(Tq, Tq, dtype=torch.bool).tril()
empty_rows[:4] = False  # the first 4 queries may attend to nothing
x_grad = x.clone().requires_grad_()
out, weights = mha(x_grad, mask=empty_rows, need_weights=True)
out.sum().backward()
expected, _ = reference_attention(x, x, x, state, H, mask=empty_rows)
print("outputs of the empty rows equal the output bias:", torch.allclose(out[:, :4], mha.out.bias.expand(B, 4, -1)))
print("weights of the empty rows are all zero:", bool((weights[:, :, :4] == 0).all()))
print("gradients finite:", bool(x_grad.grad.isfinite().all()))
report("empty rows", out.detach(), expected)

# %% [markdown]
# **Mask conventions differ.** Here, in SDPA and in the reference, a boolean mask means True =
# attend; `nn.MultiheadAttention` means True = *masked* (see [its page](../torch_mha/)). A
# floating-point mask is added to the scores in SDPA; this module accepts only boolean masks and
# raises a `TypeError` for anything else:

# %%
try:
    mha(x, mask=causal_mask.float())
except TypeError as error:
    print("TypeError:", error)

# %% [markdown]
# **A `(B, Tk)` padding mask must be converted.** Passed as it is, it is read like any 2-D mask,
# as `(Tq, Tk)`. When `B != Tq` that is a `ValueError`; when `B == Tq` it is silently wrong: query
# `i` gets the padding of sequence `i`. Broadcasting cannot tell the two apart (SDPA neither), so
# always write `[:, None, None, :]`:

# %%
try:
    mha(x, memory, mask=key_is_real)  # (B, Tk) with B = 2, Tq = 12
except ValueError as error:
    print("ValueError:", error)
square = MultiHeadAttention(d_model, H).eval()  # here B == Tq == 2
queries_2 = torch.randn(2, 2, d_model)  # (B, Tq, d_model)
with torch.no_grad():
    wrong, _ = square(queries_2, memory, mask=key_is_real)  # read as (Tq, Tk)
    right, _ = square(queries_2, memory, mask=key_is_real[:, None, None, :])  # (B, 1, 1, Tk)
print(f"B == Tq: no error, and max |wrong - right| = {(wrong - right).abs().max().item():.2f}")

# %% [markdown]
# **Causal attention with fewer queries than keys needs a bottom-right mask.** When the queries are
# the last `Tq` of `Tk` positions (chunked decoding: a chunk of new tokens attends to the keys of
# everything so far), query `i` sits at position `Tk - Tq + i` and must see keys up to there. SDPA's
# `is_causal=True` aligns the mask top-left instead (`tril(ones(Tq, Tk))`), which is wrong here
# (see the [SDPA page](../sdpa/)); this module has no `is_causal` flag. Build the mask from the
# positions. For SDPA itself, `torch.nn.attention.bias.causal_lower_right(Tq, Tk)` is the same
# mask; it is a float tensor subclass, so this module, which takes boolean masks only, refuses it.
# Here the last 4 of 12 positions, against every position computed at once:

# %%
T_all, T_new = 12, 4
x_all = torch.randn(B, T_all, d_model)
kv_positions = torch.arange(T_all)  # (Tk,)
q_positions = kv_positions[-T_new:]  # (Tq,): the chunk's positions in the sequence
bottom_right = q_positions[:, None] >= kv_positions[None, :]  # (Tq, Tk), True = attend
top_left = torch.ones(T_new, T_all, dtype=torch.bool).tril()  # (Tq, Tk): what is_causal=True uses
with torch.no_grad():
    full, _ = mha(x_all, mask=kv_positions[:, None] >= kv_positions[None, :])  # (B, Tk, d_model)
    for label, mask in (("top-left mask (is_causal=True's)", top_left), ("bottom-right mask", bottom_right)):
        chunk, _ = mha(x_all[:, -T_new:], x_all, mask=mask)  # (B, Tq, d_model)
        print(f"{label:<34} max |chunk - full[:, -Tq:]| = {(chunk - full[:, -T_new:]).abs().max().item():.2e}")
q, k, v = torch.randn(1, H, T_new, 8), torch.randn(1, H, T_all, 8), torch.randn(1, H, T_all, 8)  # (B, H, T, D)
same = torch.allclose(F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right),
                      F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T_new, T_all)))
print("SDPA: bottom_right and causal_lower_right(Tq, Tk) give the same output:", same)

# %% [markdown]
# **RoPE positions start at 0 for queries and keys alike.** That is right for self-attention over a
# whole sequence. For decoding with a cache of earlier keys, the new queries' positions must
# continue where the cache ends; this module computes the angles from 0 on every call, so it does
# not support that use. RoPE also needs an even head size:

# %%
try:
    MultiHeadAttention(d_model=12, num_heads=4, rope=True)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# **Weights cost speed.** `need_weights=True` rules out the fused kernels and materialises the
# `(B, H, Tq, Tk)` weights; ask for them only when you use them.
