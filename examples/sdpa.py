# %% [markdown]
# # scaled_dot_product_attention
#
# This page shows how to hand the attention to PyTorch's fused function, which kernel it then runs
# and which masks silently give wrong answers. It assumes the [split-heads](../split_heads/) page
# (the module shell and the `(B, H, T, D)` layout) and the [notation](../../notation/).
#
# Two registered classes call `torch.nn.functional.scaled_dot_product_attention`
# ([SDPA](../../glossary/#sdpa)):
#
# * `SDPACausalAttention` (`attention/causal/sdpa_causal.py`, `sdpa_causal`) passes
#   `is_causal=True`;
# * `SDPAMaskAttention` (`attention/causal/sdpa_mask.py`, `sdpa_mask`) passes an explicit boolean
#   `attn_mask` (True = attend).
#
# ## The idea
#
# SDPA takes `q`, `k`, `v` as `(B, H, T, D)` and returns `softmax(q k^T / sqrt(D) + mask) v` as
# `(B, H, T, D)`. It dispatches to a fused kernel: on CUDA,
# [FlashAttention-2](../../glossary/#flashattention), the
# [memory-efficient kernel](../../glossary/#memory-efficient-kernel) or
# [cuDNN](../../glossary/#cudnn); on CPU, a flash-style kernel; and the plain
# [math kernel](../../glossary/#math-kernel) as the fallback. The fused kernels never store the
# `(T, T)` score matrix: they walk over blocks of keys and keep a running softmax (the
# [online softmax](../tiled/#the-online-softmax-one-row-at-a-time), written out step by step on the
# previous page). With
# `is_causal=True` the kernel also knows that every block above the diagonal is masked by the
# [causal mask](../../glossary/#causal-mask) and skips it. An explicit mask allows any pattern
# (windows, [padding](../../glossary/#padding-mask)), but the kernel must read it and cannot skip
# blocks; CUDA's FlashAttention kernel refuses any mask, and the CPU flash kernel takes one only in
# some shapes (see below).
#
# The module around SDPA is the [split-heads](../split_heads/) shell: project, split heads,
# attend, merge heads, project.
#
# API reference: [`attention.causal.sdpa_causal`](../../api/causal/sdpa_causal/), [`attention.causal.sdpa_mask`](../../api/causal/sdpa_mask/).

# %%
import math
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from attention.causal.alibi import ALiBiAttention
from attention.causal.sdpa_causal import SDPACausalAttention
from attention.causal.sdpa_mask import SDPAMaskAttention
from attention.display import show_shape, show_source, show_table
from attention.positional import alibi_bias
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

# %% tags=["hide-input"]
show_source(SDPACausalAttention.forward)
show_source(SDPAMaskAttention.forward)

# %% [markdown]
# ## Checked against the float64 reference
#
# Both classes, with the same [canonical weights](../../glossary/#canonical-state-dict); and the
# `is_causal` version once more with each CPU backend pinned by `torch.nn.attention.sdpa_kernel`,
# which makes PyTorch raise instead of silently falling back to another kernel.

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
# ## Which kernel runs on CPU: the mask's shape decides
#
# On CPU, SDPA has two kernels and tries them in order: the flash kernel, then the math kernel,
# which stores the `(B, H, Tq, Tk)` scores. The flash kernel takes a mask only as 2-D
# `(Tq, Tk)` or 4-D `(B, H, Tq, Tk)`, where each size may also be 1. A 3-D mask such as
# `(H, T, T)` broadcasts to the right shape, and the math kernel gives the right answer with it,
# so nothing warns that the flash kernel was skipped. ALiBi's bias is naturally built as
# `(H, T, T)`, one matrix per head; passed that way, every call of the `alibi` class would run the
# math kernel.
#
# The helper below tells which kernel a call gets: with the flash kernel pinned, SDPA raises
# where it would otherwise fall back to the math kernel.

# %%
def cpu_sdpa_kernel(run):
    """Which CPU kernel SDPA uses for `run()`: "flash" if it runs with the flash kernel pinned, else "math"."""
    try:
        with warnings.catch_warnings(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            warnings.simplefilter("ignore")  # pinned, PyTorch also warns why the flash kernel refused
            run()
        return "flash"
    except RuntimeError:
        run()  # unpinned; raises too if no kernel takes the inputs
        return "math"


q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))  # (B, H, T, D)
bias_3d = alibi_bias(4, 16, 16)  # (H, T, T): -m_h * (i - j), -inf above the diagonal
bias_4d = bias_3d[None]  # (1, H, T, T): the same values
for label, bias in (("(H, T, T)", bias_3d), ("(1, H, T, T)", bias_4d)):
    kernel = cpu_sdpa_kernel(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    print(f"ALiBi bias {label:<13} -> {kernel} kernel")

# Pinned, the refusal names the rule:
with warnings.catch_warnings(record=True) as caught, sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    warnings.simplefilter("always")
    try:
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias_3d)
    except RuntimeError as error:
        print("\n(H, T, T), flash pinned: RuntimeError:", error)
for warning in caught:
    print("    warning:", str(warning.message).split(" (Triggered internally")[0])

# %% [markdown]
# The `alibi` class passes the bias as `(1, H, T, T)`, so it runs with the flash kernel pinned:

# %%
alibi = ALiBiAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
alibi_kernel = cpu_sdpa_kernel(lambda: alibi(x))
print("ALiBiAttention:", alibi_kernel, "kernel")
assert alibi_kernel == "flash"

# %% [markdown]
# Same values, same result, another kernel. At a benchmark-like size the 3-D bias costs this much:

# %%
B_big, H_big, T_big, D_big = 4, 8, 1024, 32
q_big, k_big, v_big = (torch.randn(B_big, H_big, T_big, D_big) for _ in range(3))  # (B, H, T, D)
bias_3d = alibi_bias(H_big, T_big, T_big)  # (H, T, T)
seconds, outputs = {}, {}
with torch.no_grad():
    for label, bias in (("(H, T, T)", bias_3d), ("(1, H, T, T)", bias_3d[None])):
        F.scaled_dot_product_attention(q_big, k_big, v_big, attn_mask=bias)  # warm-up
        start = time.perf_counter()
        for _ in range(3):
            outputs[label] = F.scaled_dot_product_attention(q_big, k_big, v_big, attn_mask=bias)
        seconds[label] = (time.perf_counter() - start) / 3
        kernel = cpu_sdpa_kernel(lambda: F.scaled_dot_product_attention(q_big, k_big, v_big, attn_mask=bias))
        print(f"bias {label:<13} {kernel:>5} kernel: {1000 * seconds[label]:6.1f} ms per call")
print(f"the same output: max difference {(outputs['(H, T, T)'] - outputs['(1, H, T, T)']).abs().max().item():.1e}")
print(f"(H, T, T) takes {seconds['(H, T, T)'] / seconds['(1, H, T, T)']:.1f}x as long; the math kernel's "
      f"(B, H, T, T) float32 scores alone take {B_big * H_big * T_big * T_big * 4 / 2**20:.0f} MiB")

# %% [markdown]
# The whole rule, in PyTorch 2.13 on CPU (`q`, `k`, `v` float32 `(B, H, T, D) = (2, 4, 16, 8)`):

# %% tags=["hide-input"]
B, H, T = 2, 4, 16
cases = {
    "`(T, T)` float": dict(attn_mask=torch.zeros(T, T)),
    "`(1, T)` float: one row for every query": dict(attn_mask=torch.zeros(1, T)),
    "`(H, T, T)` float: any 3-D mask": dict(attn_mask=torch.zeros(H, T, T)),
    "`(1, T, T)` float": dict(attn_mask=torch.zeros(1, T, T)),
    "`(H, T, T)` bool": dict(attn_mask=torch.ones(H, T, T, dtype=torch.bool)),
    "`(1, H, T, T)` float": dict(attn_mask=torch.zeros(1, H, T, T)),
    "`(B, H, T, T)` float": dict(attn_mask=torch.zeros(B, H, T, T)),
    "`(B, 1, 1, T)` bool: a padding mask": dict(attn_mask=torch.ones(B, 1, 1, T, dtype=torch.bool)),
    "`(1, H, T, T)` float, transposed: `stride(-1) = T`": dict(attn_mask=torch.zeros(1, H, T, T).transpose(-2, -1)),
    "`(1, H, T, T)` float, `.expand(B, H, T, T)`: stride 0": dict(attn_mask=torch.zeros(1, H, T, T).expand(B, H, T, T)),
    "`(1, H, T, T)` float, `requires_grad=True`": dict(attn_mask=torch.zeros(1, H, T, T, requires_grad=True)),
    "`(1, H, T, T)` float, and `q.requires_grad` (training)": dict(attn_mask=torch.zeros(1, H, T, T),
                                                                  q=q.clone().requires_grad_()),
    "`(1, H, T, T)` float, and `dropout_p=0.1`": dict(attn_mask=torch.zeros(1, H, T, T), dropout_p=0.1),
    "`(1, H, T, T)` float64 (the query is float32)": dict(attn_mask=torch.zeros(1, H, T, T, dtype=torch.float64)),
}
rows = []
for label, case in cases.items():
    query = case.pop("q", q)
    try:
        kernel = cpu_sdpa_kernel(lambda: F.scaled_dot_product_attention(query, k, v, **case))
    except RuntimeError as error:
        kernel = f"error in every kernel: {str(error).split(', but got')[0]}"
    rows.append((label, kernel))
show_table("SDPA's CPU kernel for each attn_mask", ["`attn_mask`", "kernel"], rows)

# %% [markdown]
# So the CPU flash kernel takes a mask that is 2-D or 4-D, whose sizes each equal the matching
# size of `(B, H, Tq, Tk)` or 1, and that does not require a gradient (a learned bias runs the
# math kernel). Its strides do not matter, and a boolean mask counts as a float one of the same
# shape (SDPA turns it into 0/-inf first). A mask's dtype must be bool, float32 or the query's
# dtype; any other is an error, not a fallback. Besides the mask, `dropout_p > 0` also sends the
# call to the math kernel: training with attention dropout runs the math kernel on CPU.
#
# ## Pitfalls
#
# **A float mask is added, not applied.** SDPA adds a floating-point `attn_mask` to the scores. A
# class that keeps `torch.triu(torch.ones(T, T), diagonal=1)` as a buffer (1.0 above the diagonal,
# the future) and passes it as `attn_mask`, meaning "mask the future", gets it added: every future
# key gets +1 on its score and nothing is masked. Casting that buffer with `.bool()`
# does not help either: SDPA reads a boolean True as *attend* (the convention of this package, the
# opposite of `nn.MultiheadAttention`), so each query would look at the future only, never at
# itself, and the last query at nothing. Against the float64 reference, with `causal`'s weights:

# %%
T = 16
positions = torch.arange(T)
future = torch.triu(torch.ones(T, T), diagonal=1)  # (T, T) float: 1.0 above the diagonal, the copied buffer
masks = {
    "copied: triu(ones, diagonal=1), float": future,
    "copied, cast: triu(...).bool()": future.bool(),
    "ours: q_idx >= kv_idx, bool (True = attend)": positions[:, None] >= positions[None, :],
    "additive: 0 / -inf, float": torch.zeros(T, T).masked_fill(future.bool(), float("-inf")),
}
with torch.no_grad():
    q = causal.query(x).view(2, T, 4, 8).transpose(1, 2)  # (B, H, T, D)
    k = causal.key(x).view(2, T, 4, 8).transpose(1, 2)  # (B, H, T, D)
    v = causal.value(x).view(2, T, 4, 8).transpose(1, 2)  # (B, H, T, D)
    for label, mask in masks.items():
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, D)
        out = causal.out(context.transpose(1, 2).reshape(2, T, 32))  # (B, T, d_out)
        print(f"{label:<45} max |out - reference| = {(out.double() - expected).abs().max().item():.2e}")
    # What SDPA computed with the float buffer: the softmax of scores + 1 on every future key.
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + future, dim=-1)  # (B, H, T, T)
print(f"with the float buffer, the share of attention on future keys, averaged over queries: "
      f"{(weights * future).sum(dim=-1).mean().item():.2f}")

# %% [markdown]
# (In PyTorch 2.13, a query with no key to attend to, like the last one under the cast mask, gets a
# zero context from SDPA; other paths, such as `nn.MultiheadAttention`'s fast path and its
# explicit-weights path, give `NaN`: see [its page](../torch_mha/).)
#
# **`is_causal=True` aligns the mask top-left.** With fewer queries than keys, `is_causal=True`
# builds `tril(ones(Tq, Tk))`: query `i` sees keys `0..i`. That is wrong when the queries are the
# *last* `Tq` of `Tk` positions, as in chunked decoding (a chunk of new tokens against the keys of
# everything so far): query `i` is at position `Tk - Tq + i` and must see keys `0..Tk - Tq + i`,
# the bottom-right aligned mask. Build it from the positions, or use
# `torch.nn.attention.bias.causal_lower_right(Tq, Tk)` (a prototype API in PyTorch 2.13: SDPA
# recognises it and, on CPU, applies the same boolean mask). Here the last 4 of 16 positions
# against all 16 keys, compared with the same rows of the full causal attention (the reference):

# %%
Tq = 4
q_positions = torch.arange(T - Tq, T)  # (Tq,): where the queries sit in the sequence
kv_positions = torch.arange(T)  # (Tk,)
bottom_right = q_positions[:, None] >= kv_positions[None, :]  # (Tq, Tk), True = attend
with torch.no_grad():
    q_chunk = q[:, :, -Tq:]  # (B, H, Tq, D): the queries of the last Tq positions
    for label, mask_args in (("is_causal=True (top-left)", dict(is_causal=True)),
                             ("positions: q_pos >= kv_pos", dict(attn_mask=bottom_right)),
                             ("causal_lower_right(Tq, Tk)", dict(attn_mask=causal_lower_right(Tq, T)))):
        context = F.scaled_dot_product_attention(q_chunk, k, v, **mask_args)  # (B, H, Tq, D)
        out = causal.out(context.transpose(1, 2).reshape(2, Tq, 32))  # (B, Tq, d_out)
        error = (out.double() - expected[:, -Tq:]).abs().max().item()
        print(f"{label:<28} max |out - reference rows {T - Tq}..{T - 1}| = {error:.2e}")
print("bottom-right mask (1 = attend):")
print(bottom_right.int())

# %% [markdown]
# **Dropout is not switched off by `eval()`.** `F.scaled_dot_product_attention(dropout_p=0.1)`
# drops weights whenever it is called; the modules pass `dropout_p=self.dropout_p if self.training
# else 0.0`.
#
# **An fp32 run is not "FlashAttention".** On CUDA, PyTorch's FlashAttention kernel takes only
# fp16 and bf16 inputs. With fp32 inputs SDPA quietly picks the memory-efficient or the math
# kernel, so an fp32 benchmark of `sdpa_causal` measures one of those, and calling its numbers
# "FlashAttention" is wrong. To know which kernel ran, pin it:
# `with sdpa_kernel(SDPBackend.FLASH_ATTENTION): ...` raises when that kernel cannot take the
# inputs. On CPU the flash-style kernel does accept fp32, as the checks above show.

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
