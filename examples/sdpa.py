# %% [markdown]
# # scaled_dot_product_attention
#
# Two registered classes hand the attention itself to PyTorch's
# `torch.nn.functional.scaled_dot_product_attention` (SDPA):
#
# * `SDPACausalAttention` (`attention/causal/sdpa_causal.py`, `sdpa_causal`) passes
#   `is_causal=True`;
# * `SDPAMaskAttention` (`attention/causal/sdpa_mask.py`, `sdpa_mask`) passes an explicit boolean
#   `attn_mask` (True = attend).
#
# ## The idea
#
# SDPA takes `q`, `k`, `v` as `(B, H, T, D)` and returns `softmax(q k^T / sqrt(D) + mask) v` as
# `(B, H, T, D)`. It dispatches to a fused kernel: on CUDA, FlashAttention-2, the
# memory-efficient kernel or cuDNN; on CPU, a flash-style kernel; and a plain "math"
# implementation as the fallback. The fused kernels never store the `(T, T)` score matrix: they
# walk over blocks of keys and keep a running softmax. With `is_causal=True` the kernel also
# knows that every block above the diagonal is masked and skips it. An explicit mask allows any
# pattern (windows, padding), but the kernel must read it, cannot skip blocks, and on CUDA the
# FlashAttention kernel does not accept one.
#
# The module around SDPA is the [split-heads](../split_heads/) shell: project, split heads,
# attend, merge heads, project.

# %%
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention.causal.sdpa_causal import SDPACausalAttention
from attention.causal.sdpa_mask import SDPAMaskAttention
from attention.display import show_shape, show_source
from attention.reference import reference_causal_self_attention

# %% [markdown]
# ## Shapes, step by step
#
# `B = 2`, `T = 4`, `d_in = 6`, `H = 2`, `D = 2`, `d_out = 4`. `SDPA` below is
# `F.scaled_dot_product_attention`.

# %%
torch.manual_seed(0)
B, T, d_in, d_out, H = 2, 4, 6, 4, 2
D = d_out // H
x = torch.randn(B, T, d_in)
module = SDPACausalAttention(d_in, d_out, context_length=8, dropout=0.0, num_heads=H).eval()
with torch.no_grad():
    show_shape("x", x, "(B, T, d_in)")
    q = module.query(x).view(B, T, H, D).transpose(1, 2)
    k = module.key(x).view(B, T, H, D).transpose(1, 2)
    v = module.value(x).view(B, T, H, D).transpose(1, 2)
    show_shape("q = query(x).view(B, T, H, D).transpose(1, 2)", q, "(B, H, T, D)")
    context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    show_shape("context = SDPA(q, k, v, is_causal=True)", context, "(B, H, T, D)")
    merged = context.transpose(1, 2).reshape(B, T, d_out)
    show_shape("context.transpose(1, 2).reshape(B, T, d_out)", merged, "(B, T, H*D)")
    show_shape("out = module.out(merged)", module.out(merged), "(B, T, d_out)")
    print("same as module(x):", torch.allclose(module.out(merged), module(x), atol=1e-6))

# %% [markdown]
# ## The code

# %%
show_source(SDPACausalAttention.forward)
show_source(SDPAMaskAttention.forward)

# %% [markdown]
# ## Checked against the float64 reference
#
# Both classes, with the same canonical weights; and the `is_causal` version once more with each
# CPU backend pinned by `torch.nn.attention.sdpa_kernel`, which makes PyTorch raise instead of
# silently falling back to another kernel.

# %%
x = torch.randn(2, 16, 32)
causal = SDPACausalAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
masked = SDPAMaskAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
state = causal.canonical_state_dict()
masked.load_canonical_state_dict(state)
expected, _ = reference_causal_self_attention(x, state, num_heads=4)
with torch.no_grad():
    for name, module in (("sdpa_causal", causal), ("sdpa_mask", masked)):
        error = (module(x).double() - expected).abs().max().item()
        print(f"{name:<28} max |out - reference| = {error:.2e}  (float32)")
        assert error < 1e-5, (name, error)
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        with sdpa_kernel(backend):
            error = (causal(x).double() - expected).abs().max().item()
        print(f"sdpa_causal, {backend.name:<15} max |out - reference| = {error:.2e}  (float32, CPU)")
        assert error < 1e-5, (backend, error)

# %% [markdown]
# ## Pitfalls
#
# **A boolean mask means "take part in attention".** For a boolean `attn_mask`, SDPA reads True as
# *attend* (the same convention as this package, and the opposite of `nn.MultiheadAttention`).
# A widely copied version passed `torch.triu(torch.ones(T, T), diagonal=1).bool()`, True *above*
# the diagonal, meaning to mask the future. SDPA read it as the only keys to attend to: every
# query looked at the future only, never at itself, and the last query at nothing.

# %%
T = 16
positions = torch.arange(T)
ours_mask = positions[:, None] >= positions[None, :]  # (T, T), as sdpa_mask builds it: True = attend
copied_mask = torch.triu(torch.ones(T, T), diagonal=1).bool()  # True above the diagonal
print("copied mask, first 4 x 4 (1 = attend, as SDPA reads it):")
print(copied_mask[:4, :4].int())
with torch.no_grad():
    q = causal.query(x).view(2, T, 4, 8).transpose(1, 2)  # (B, H, T, D)
    k = causal.key(x).view(2, T, 4, 8).transpose(1, 2)  # (B, H, T, D)
    v = causal.value(x).view(2, T, 4, 8).transpose(1, 2)  # (B, H, T, D)
    for label, mask in (("ours: tril", ours_mask), ("copied: triu(diagonal=1)", copied_mask)):
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, D)
        out = causal.out(context.transpose(1, 2).reshape(2, T, 32))
        error = (out.double() - expected).abs().max().item()
        print(f"{label}:\n    max |out - reference| = {error:.2e}, "
              f"last query's context[:3] = {context[0, 0, -1, :3].numpy().round(3)}")

# %% [markdown]
# (In PyTorch 2.13, a query with no key to attend to gets a zero context from SDPA; older
# releases and other paths, such as `nn.MultiheadAttention` with weights, give `NaN`.)
#
# **A float mask is added, not applied.** SDPA adds a floating-point `attn_mask` to the scores.
# Turning the boolean mask into 0/1 floats therefore adds 1 to the allowed scores and 0 to the
# future ones: nothing is masked.

# %%
with torch.no_grad():
    float_mask = ours_mask.float()  # 1.0 = "attend"?  No: +1.0 to the score
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask)
    out = causal.out(context.transpose(1, 2).reshape(2, T, 32))
print(f"0/1 float mask: max |out - reference| = {(out.double() - expected).abs().max().item():.2e}")
additive_mask = torch.zeros(T, T).masked_fill(~ours_mask, float("-inf"))
with torch.no_grad():
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask)
    out = causal.out(context.transpose(1, 2).reshape(2, T, 32))
print(f"0/-inf float mask: max |out - reference| = {(out.double() - expected).abs().max().item():.2e}")

# %% [markdown]
# **`is_causal=True` aligns the mask top-left.** With fewer queries than keys (decoding one token
# against a cache of earlier keys), `is_causal=True` still builds `tril(ones(Tq, Tk))`: the single
# new query may attend to key 0 only, not to the whole cache. For `Tq != Tk`, pass an explicit
# mask (bottom-right aligned: query `i` sees keys `j <= i + Tk - Tq`).

# %%
with torch.no_grad():
    last_query = q[:, :, -1:]  # (B, H, 1, D): the newest position, T - 1
    top_left = F.scaled_dot_product_attention(last_query, k, v, is_causal=True)
    attend_all = F.scaled_dot_product_attention(last_query, k, v)  # the last position sees every key
print("is_causal with Tq=1, Tk=16 equals attending to key 0 only:", torch.allclose(top_left, v[:, :, :1]))
print("... and differs from the right answer by", f"{(top_left - attend_all).abs().max().item():.2f}")

# %% [markdown]
# **Dropout is not switched off by `eval()`.** `F.scaled_dot_product_attention(dropout_p=0.1)`
# drops weights whenever it is called; the modules pass `dropout_p=self.dropout_p if self.training
# else 0.0`.
#
# **An fp32 run is not "FlashAttention".** On CUDA, PyTorch's FlashAttention kernel takes only
# fp16 and bf16 inputs. With fp32 inputs SDPA quietly picks the memory-efficient or the math
# kernel, so an fp32 benchmark of `sdpa_causal` measures one of those, and calling its numbers
# "FlashAttention" (as a widely shared benchmark did) is wrong. To know which kernel ran, pin it:
# `with sdpa_kernel(SDPBackend.FLASH_ATTENTION): ...` raises when that kernel cannot take the
# inputs. On CPU the flash-style kernel does accept fp32, as the check above shows.

# %%
if torch.cuda.is_available():
    q32 = torch.randn(1, 4, 128, 64, device="cuda")
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q32, q32, q32, is_causal=True)
        print("FlashAttention ran on fp32 inputs")
    except RuntimeError as error:
        print("fp32 + FlashAttention pinned:", str(error).splitlines()[0])
else:
    print("No CUDA device here: the fp32 FlashAttention check only runs on a GPU.")
