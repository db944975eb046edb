# %% [markdown]
# # nn.MultiheadAttention
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
# attends and projects back. With `need_weights=False` (and no other obstacle) it takes a fast
# path through the fused SDPA kernels; with `need_weights=True` it computes the `(T, T)` weights
# explicitly so that it can return them. Registering both shows the price of asking for weights in
# the benchmark.

# %%
import torch
from torch import nn

from attention.causal.torch_mha import TorchMultiheadAttention, TorchMultiheadAttentionWithWeights
from attention.display import show_shape, show_source
from attention.reference import reference_causal_self_attention

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

# %%
show_source(TorchMultiheadAttention.__init__)
show_source(TorchMultiheadAttention.forward)
show_source(TorchMultiheadAttentionWithWeights)

# %% [markdown]
# ## Checked against the float64 reference
#
# The canonical state dict cuts `in_proj_weight` into its query, key and value blocks.

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
# **Two output projections.** `nn.MultiheadAttention` already ends in `out_proj`. A widely
# copied wrapper added its own `nn.Linear(d_out, d_out)` after it, so the module applied two
# output projections: an extra `d_out * (d_out + 1)` parameters, a different function from every
# other implementation, and weights that could not be exchanged with them. With the same
# canonical weights:

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
# **True means *masked* here.** For a boolean `attn_mask`, `nn.MultiheadAttention` reads True as
# "not allowed to attend", the opposite of SDPA and of this package. The wrapper keeps our
# convention in `causal_mask` (True = attend) and inverts it at the call. Passing our mask
# unchanged hides the past and the present: every query sees only the future, and the last
# query sees nothing, which gives `NaN` on the path that computes weights.

# %%
ours = fast.causal_mask[:16, :16]  # True = attend
with torch.no_grad():
    for label, attn_mask in (("~causal_mask (converted)", ~ours), ("causal_mask (unconverted)", ours)):
        out, _ = fast.mha(x, x, x, attn_mask=attn_mask, need_weights=True)
        error = (out.double() - expected).abs().max().item()  # NaN if any output is NaN
        print(f"{label:<26} max |out - reference| = {error:.2e}; NaN outputs: {out.isnan().sum().item()}")

# %% [markdown]
# **`batch_first=False` is the default.** Without `batch_first=True`, `nn.MultiheadAttention`
# reads `(T, B, E)`. A `(B, T, E)` batch then runs without complaint whenever the shapes allow,
# attending across the batch instead of across the sequence. The wrapper sets
# `batch_first=True`.
#
# **The weights are averaged over heads by default.** `need_weights=True` returns `(B, T, T)`, the
# mean over heads, unless `average_attn_weights=False` (then `(B, H, T, T)`, as above). And asking
# for weights rules out the fused kernels: compare `torch_mha` and `torch_mha_weights` in the
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
