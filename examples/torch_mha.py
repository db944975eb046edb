# %% [markdown]
# # nn.MultiheadAttention
#
# This page shows what PyTorch's built-in attention module computes, which of its three internal
# paths a call takes, and where its conventions differ from this package's. It assumes the
# [split-heads](../split_heads/) page (the same computation, written out) and the
# [SDPA page](../sdpa/) (the fused kernels and their masks).
#
# `TorchMultiheadAttention` (`attention/causal/torch_mha.py`, registered as `torch_mha`) wraps
# PyTorch's own `torch.nn.MultiheadAttention` in this package's causal self-attention interface;
# `TorchMultiheadAttentionWithWeights` (`torch_mha_weights`) is the same module asking PyTorch
# for the attention weights too.
#
# ## The idea
#
# `nn.MultiheadAttention(embed_dim, num_heads)` holds the query, key and value projections as one
# `in_proj_weight` of shape `(3 * embed_dim, embed_dim)` and the output projection as `out_proj`.
# Called as `mha(query, key, value, attn_mask=..., need_weights=...)` it projects, splits heads,
# attends and projects back, on one of three paths (PyTorch 2.13, `nn.MultiheadAttention.forward`
# and `F.multi_head_attention_forward`):
#
# * **the fast path**, `torch._native_multi_head_attention`, one fused operator. Only in eval mode
#   when autograd records nothing (under `torch.no_grad()`, or when neither the input nor any
#   parameter requires grad), and only for self-attention with one tensor as query, key and
#   value, `batch_first=True`, an even number of heads, an `in_proj_bias` (`bias=True`), no
#   `add_bias_kv` or `add_zero_attn`, no float mask and no autocast.
# * **SDPA**, for every other call with `need_weights=False`, training included: the boolean mask
#   becomes a float 0/-inf mask, `(T, T)` is reshaped to `(1, 1, T, T)`, and
#   [`F.scaled_dot_product_attention`](../../glossary/#sdpa) picks a kernel (on CPU, that 4-D mask
#   is one the flash kernel takes; dropout in training sends it to the
#   [math kernel](../../glossary/#math-kernel), see the [SDPA page](../sdpa/)).
# * **explicit weights**, for every other call with `need_weights=True`: `baddbmm` of the scores
#   onto the mask, softmax, dropout and `bmm`, so that the `(T, T)` weights can be returned.
#
# The wrapper builds `nn.MultiheadAttention(bias=qkv_bias)`. With the family's default
# `qkv_bias=False` there is no `in_proj_bias`, so `torch_mha` never takes the fast path: it always
# runs the SDPA path, and `torch_mha_weights` the explicit one. Registering both shows the price
# of asking for weights in the benchmark.
#
# API reference: [`attention.causal.torch_mha`](../../api/causal/torch_mha/).

# %%
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

from attention.causal.torch_mha import TorchMultiheadAttention, TorchMultiheadAttentionWithWeights
from attention.display import show_shape, show_source, show_table
from attention.reference import reference_causal_self_attention

# %% [markdown]
# Which path a call takes shows in the Python functions it calls: the fast path calls none, the
# others call `F.multi_head_attention_forward`, and the SDPA path calls SDPA from there.

# %%
def mha_path(mha, x, attn_mask, need_weights):
    """Which path `mha(x, x, x, ...)` takes: no Python call at all is the fast path."""
    with mock.patch.object(F, "multi_head_attention_forward", wraps=F.multi_head_attention_forward) as regular, \
            mock.patch.object(F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention) as sdpa:
        mha(x, x, x, attn_mask=attn_mask, need_weights=need_weights)
    if regular.call_count == 0:
        return "fast path"
    return "SDPA" if sdpa.call_count else "explicit weights"


# %% tags=["hide-input"]
torch.manual_seed(0)
x = torch.randn(2, 16, 32)
causal_masked = ~torch.ones(16, 16, dtype=torch.bool).tril()  # (T, T), True = masked
plain = nn.MultiheadAttention(32, 4, batch_first=True)  # bias=True: has in_proj_bias
wrappers = {"torch_mha": TorchMultiheadAttention(32, 32, 16, 0.0, 4).eval(),
            "torch_mha, qkv_bias=True": TorchMultiheadAttention(32, 32, 16, 0.0, 4, qkv_bias=True).eval()}
rows = []
for mode in ("train", "eval"):
    plain.train(mode == "train")
    for grad in (True, False):
        for need_weights in (False, True):
            with torch.set_grad_enabled(grad):
                path = mha_path(plain, x, causal_masked, need_weights)
            rows.append(("`nn.MultiheadAttention(32, 4)`", mode, "enabled" if grad else "`no_grad`", need_weights, path))
for name, wrapper in wrappers.items():
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            path = mha_path(wrapper.mha, x, causal_masked, need_weights=False)
        rows.append((f"`{name}`", "eval", "enabled" if grad else "`no_grad`", False, path))
show_table("The path each call takes (PyTorch 2.13)", ["module", "mode", "autograd", "need_weights", "path"], rows)

# %% [markdown]
# ## Shapes, step by step
#
# `nn.MultiheadAttention` needs `d_in == d_out` (its query input has `embed_dim` features), so
# here `d_in = d_out = 4`, with `H = 2` heads of `D = 2`.

# %%
torch.manual_seed(0)
B, T, d_model, H = 2, 4, 4, 2
x = torch.randn(B, T, d_model)
module = TorchMultiheadAttention(d_model, d_model, context_length=8, dropout=0.0, num_heads=H).eval()
mha = module.mha
show_shape("x", x, "(B, T, d_model)")
show_shape("mha.in_proj_weight", mha.in_proj_weight, "(3*d_model, d_model)")
show_shape("mha.out_proj.weight", mha.out_proj.weight, "(d_model, d_model)")
masked = ~module.causal_mask[:T, :T]
show_shape("attn_mask = ~causal_mask (True = masked)", masked, "(T, T)")
print(masked.int())
with torch.no_grad():
    out, weights = mha(x, x, x, attn_mask=masked, need_weights=True)
    show_shape("out", out, "(B, T, d_model)")
    show_shape("weights (need_weights=True, head average)", weights, "(B, T, T)")
    _, per_head = mha(x, x, x, attn_mask=masked, need_weights=True, average_attn_weights=False)
    show_shape("weights (average_attn_weights=False)", per_head, "(B, H, T, T)")
    print("same as module(x):", torch.allclose(out, module(x), atol=1e-6))

# %% [markdown]
# ## The code

# %% tags=["hide-input"]
show_source(TorchMultiheadAttention.__init__)
show_source(TorchMultiheadAttention.forward)
show_source(TorchMultiheadAttentionWithWeights)

# %% [markdown]
# ## Checked against the float64 reference
#
# The [canonical state dict](../../glossary/#canonical-state-dict) cuts `in_proj_weight` into its
# query, key and value blocks.

# %%
x = torch.randn(2, 16, 32)
fast = TorchMultiheadAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
with_weights = TorchMultiheadAttentionWithWeights(32, 32, context_length=16, dropout=0.0, num_heads=4).eval()
state = fast.canonical_state_dict()
with_weights.load_canonical_state_dict(state)
expected, expected_weights = reference_causal_self_attention(x, state, num_heads=4)
with torch.no_grad():
    for name, module in (("torch_mha", fast), ("torch_mha_weights", with_weights)):
        error = (module(x).double() - expected).abs().max().item()
        print(f"{name:<18} max |out - reference| = {error:.2e}  (float32)")
        assert error < 1e-5, (name, error)
    _, weights = fast.mha(x, x, x, attn_mask=~fast.causal_mask[:16, :16], average_attn_weights=False)
error = (weights.double() - expected_weights).abs().max().item()
print(f"per-head weights   max |weights - reference| = {error:.2e}")

# %% [markdown]
# ## Pitfalls
#
# **Two output projections.** `nn.MultiheadAttention` already ends in `out_proj`. A wrapper that
# adds its own `nn.Linear(d_out, d_out)` after it applies two output projections: an extra `d_out * (d_out + 1)` parameters, a different function from every
# other implementation, and weights that could not be exchanged with them. (The copy below also
# keeps `nn.MultiheadAttention`'s default query/key/value biases, `3 * d_out` more parameters than
# ours built with `qkv_bias=False`.) With the same canonical weights:

# %%
class CopiedWrapper(nn.Module):
    """The copied pattern: nn.MultiheadAttention followed by a second output projection."""

    def __init__(self, d_model, num_heads, context_length):
        super().__init__()
        self.mha = nn.MultiheadAttention(d_model, num_heads, batch_first=True)
        self.out_proj = nn.Linear(d_model, d_model)  # the second one
        mask = torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask)  # True = masked, nn.MultiheadAttention's convention

    def forward(self, x):
        T = x.shape[1]
        out, _ = self.mha(x, x, x, attn_mask=self.mask[:T, :T], need_weights=False)
        return self.out_proj(out)


copied = CopiedWrapper(32, 4, context_length=16).eval()
# The same attention weights (this copy has q/k/v biases: zero them), plus its extra projection.
copied.mha.load_state_dict({**fast.mha.state_dict(), "in_proj_bias": torch.zeros(3 * 32)})
with torch.no_grad():
    error = (copied(x).double() - expected).abs().max().item()
parameters = {name: sum(p.numel() for p in m.parameters()) for name, m in (("ours", fast), ("copied", copied))}
print(f"copied wrapper: max |out - reference| = {error:.2e}")
print(f"parameters: {parameters}")

# %% [markdown]
# **`add_bias_kv` is not a projection bias.** The same wrapper passed `add_bias_kv=qkv_bias`,
# reading it as "bias on the key and value projections". Those biases are `bias=True`
# (`in_proj_bias`). `add_bias_kv=True` adds two learned vectors, `bias_k` and `bias_v`, and appends
# them to the key and value *sequences*: every query attends to one extra key, whatever the mask
# (PyTorch appends a column of "attend" to it), and the weights get one extra column. It also
# rules out the fast path. With the same projection weights as above:

# %%
kv_bias = nn.MultiheadAttention(32, 4, add_bias_kv=True, batch_first=True).eval()  # as add_bias_kv=qkv_bias=True
kv_bias.load_state_dict({**kv_bias.state_dict(), **fast.mha.state_dict(), "in_proj_bias": torch.zeros(3 * 32)})
with torch.no_grad():
    out, weights = kv_bias(x, x, x, attn_mask=~fast.causal_mask[:16, :16])
show_shape("kv_bias.bias_k (bias_v alike)", kv_bias.bias_k, "(1, 1, E): one extra key")
show_shape("weights", weights, "(B, T, T + 1)")
print(f"weight of query 0 on the appended key, averaged over heads: {weights[0, 0, -1].item():.2f}")
print(f"max |out - reference| = {(out.double() - expected).abs().max().item():.2e}")
with torch.no_grad():
    print("path in eval mode under no_grad:", mha_path(kv_bias, x, ~fast.causal_mask[:16, :16], need_weights=False))

# %% [markdown]
# **True means *masked* here.** For a boolean `attn_mask`, `nn.MultiheadAttention` reads True as
# "not allowed to attend", the opposite of SDPA and of this package (its `key_padding_mask`, the
# [padding mask](../../glossary/#padding-mask), too: True = padding). The wrapper keeps our
# convention in `causal_mask` (True = attend) and inverts it at the call. Passing our
# [causal mask](../../glossary/#causal-mask) unchanged hides the past and the present: every query
# sees only the future, and the last query sees nothing, which gives `NaN` on the path that
# computes weights.

# %%
ours = fast.causal_mask[:16, :16]  # True = attend
with torch.no_grad():
    for label, attn_mask in (("~causal_mask (converted)", ~ours), ("causal_mask (unconverted)", ours)):
        out, _ = fast.mha(x, x, x, attn_mask=attn_mask, need_weights=True)
        error = (out.double() - expected).abs().max().item()  # NaN if any output is NaN
        print(f"{label:<26} max |out - reference| = {error:.2e}; NaN outputs: {out.isnan().sum().item()}")

# %% [markdown]
# Whether a query with nothing to attend to gives `NaN` depends on the path: SDPA gives it a zero
# context (so the output is `out_proj.bias`), the explicit-weights path and the fast path give
# `NaN`. So the same module in eval mode gives `NaN` under `torch.no_grad()` (the fast path) and
# finite outputs with gradients enabled (the SDPA path). Here the first 4 queries may attend to
# nothing:

# %%
plain = nn.MultiheadAttention(32, 4, batch_first=True).eval()  # bias=True: the fast path is open
empty_rows = ~torch.ones(16, 16, dtype=torch.bool).tril()  # (T, T), True = masked
empty_rows[:4] = True  # queries 0..3: every key masked
for label, grad, need_weights in (("eval, no_grad, need_weights=False", False, False),
                                  ("eval, grad enabled, need_weights=False", True, False),
                                  ("eval, grad enabled, need_weights=True", True, True)):
    with torch.set_grad_enabled(grad):
        path = mha_path(plain, x, empty_rows, need_weights)
        out, _ = plain(x, x, x, attn_mask=empty_rows, need_weights=need_weights)
    nan_rows = out.isnan().any(dim=-1).sum().item()  # out: (B, T, E)
    print(f"{label:<40} {path:<17} rows with NaN: {nan_rows} of {out.shape[0] * out.shape[1]}")

# %% [markdown]
# **`is_causal=True` is only a hint.** `mha(..., attn_mask=mask, is_causal=True)` promises that
# `mask` is the causal mask, and PyTorch 2.13 then uses either one, depending on the path
# (`F.multi_head_attention_forward`):
#
# * with `need_weights=False` and no `key_padding_mask`, it drops `attn_mask` and calls SDPA with
#   `is_causal=True`;
# * with `need_weights=True` or a `key_padding_mask`, it uses `attn_mask` and ignores the hint;
# * the fast path never sees the hint and uses `attn_mask`;
# * without `attn_mask`, the hint raises a `RuntimeError`, except on the fast path, which then
#   attends to every key.
#
# So a wrong hint gives answers that depend on the path. Here the hint comes with a mask that masks
# nothing:

# %%
no_mask = torch.zeros(16, 16, dtype=torch.bool)  # True = masked: nothing masked
plain_train = nn.MultiheadAttention(32, 4, batch_first=True)  # training mode, dropout 0
plain_train.load_state_dict(plain.state_dict())
with torch.no_grad():
    causal_out, _ = plain(x, x, x, attn_mask=~torch.ones(16, 16, dtype=torch.bool).tril())
    everything_out, _ = plain(x, x, x)
rows = []
for label, mha, grad, attn_mask, need_weights in (
        ("train, need_weights=False", plain_train, True, no_mask, False),
        ("train, need_weights=True", plain_train, True, no_mask, True),
        ("eval, no_grad (fast path)", plain, False, no_mask, False),
        ("train, no attn_mask", plain_train, True, None, False),
        ("eval, no_grad (fast path), no attn_mask", plain, False, None, False)):
    try:
        with torch.set_grad_enabled(grad):
            out, _ = mha(x, x, x, attn_mask=attn_mask, need_weights=need_weights, is_causal=True)
        result = "causal" if torch.allclose(out, causal_out, atol=1e-6) else (
            "every key" if torch.allclose(out, everything_out, atol=1e-6) else "other")
    except RuntimeError as error:
        result = f"RuntimeError: {str(error).split('. ')[0]}"
    rows.append((label, "`no_mask`" if attn_mask is not None else "None", result))

# %% tags=["hide-input"]
show_table("is_causal=True: what each call attends to", ["call", "attn_mask", "attends to"], rows)

# %% [markdown]
# **`batch_first=False` is the default.** Without `batch_first=True`, `nn.MultiheadAttention`
# reads `(T, B, E)`. A `(B, T, E)` batch then runs without complaint whenever the shapes allow,
# attending across the batch instead of across the sequence. The wrapper sets
# `batch_first=True`.
#
# **The weights are averaged over heads by default.** `need_weights=True` returns `(B, T, T)`, the
# mean over heads, unless `average_attn_weights=False` (then `(B, H, T, T)`, as above). And asking
# for weights rules out SDPA's fused kernels: compare `torch_mha` and `torch_mha_weights` in the
# benchmark.
#
# **`bias=False` removes the output bias too.** `nn.MultiheadAttention(bias=...)` switches
# `in_proj_bias` and `out_proj.bias` together. Every implementation here has an output bias and
# only makes the query/key/value biases optional (`qkv_bias`), so the wrapper adds `out_proj.bias`
# back with `nn.Linear`'s initialisation when `qkv_bias=False`.
#
# **`d_in` must equal `d_out`.** `kdim` and `vdim` only change the key and value inputs; the query
# input always has `embed_dim` features. The wrapper raises a `ValueError` for `d_in != d_out`.

# %%
try:
    TorchMultiheadAttention(d_in=16, d_out=32, context_length=16, dropout=0.0, num_heads=4)
except ValueError as error:
    print("ValueError:", error)
