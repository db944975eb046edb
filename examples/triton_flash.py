# %% [markdown]
# # FlashAttention in Triton
#
# [Tiled attention](../tiled/) wrote FlashAttention's algorithm in PyTorch operations, its tiles
# run from a Python loop so it can be read. This page writes the same algorithm as a GPU kernel in
# [Triton](https://triton-lang.org/), the language of FlashAttention's tutorials and of
# FlexAttention's generated kernels: `flash_attention(q, k, v, causal=False, scale=None)` in
# `attention/kernels/triton_flash.py`, forward and backward, on `(B, H, T, D)` tensors. It assumes
# the [tiled](../tiled/) page (the online softmax, the log-sum-exp, the backward that recomputes).
#
# This site is built on a CPU. Triton's interpreter runs the kernels here: the same source,
# executed program by program with NumPy, exact enough to check against float64 and far too slow
# to time. Set `TRITON_INTERPRET=1` before Triton is imported (the module does it when CUDA is not
# available). Triton ships wheels for Linux x86-64; the project's `test` and `docs` extras install it
# there.

# %%
import time

import torch
import torch.nn.functional as F

from attention.display import show, show_source, show_table
from attention.kernels import triton_flash
from attention.kernels.triton_flash import BLOCK_M, BLOCK_N, flash_attention
from attention.plotting import plot_flash_tiles
from attention.reference import reference_kernel

# %% [markdown]
# ## A program per tile of queries
#
# A Triton kernel is written for one *program*, and launched on a grid of them that run in
# parallel on the GPU. Here the grid is `(number of query tiles, B * H)`: `tl.program_id(0)` says
# which tile of `BLOCK_M` queries a program owns, `tl.program_id(1)` which sequence and head. The
# program loads its queries once, then walks over the keys a tile of `BLOCK_N` at a time, each
# step a `(BLOCK_M, BLOCK_N)` tile of scores that lives in registers and is never written to
# memory. Lengths need not be multiples of a tile: a load past the end is masked
# (`tl.load(..., mask=..., other=0.0)`) and so are the scores of keys that do not exist. With
# `causal=True`, a program stops at the key tile that holds its last query, and masks inside the
# tiles on the diagonal:

# %%
show(plot_flash_tiles(200, 200, BLOCK_M, BLOCK_N))

# %% [markdown]
# ## The forward kernel
#
# Each program keeps, for each of its queries, the running maximum `m`, the running sum `l` of
# `exp(score - m)` and the unnormalised output `acc`; a tile with a larger maximum rescales what was
# summed before by `exp(m - m_new)`. At the end the output is `acc / l`, and the program stores one
# more number per query for the backward, the log-sum-exp `m + log(l)`. A query with no key to
# attend to (none here, but a masked row can be) gets zeros, not NaN. `tl.dot` multiplies float32
# tiles exactly (`input_precision="ieee"`): by default a GPU would round them to TensorFloat-32.

# %% tags=["hide-input"]
show_source(triton_flash._forward.fn)

# %% [markdown]
# The launch, from `FlashAttentionFunction.forward`: one program per query tile and head. Run it on
# lengths no tile divides and compare with float64 and with PyTorch's SDPA:

# %%
torch.manual_seed(0)
B, H, T, D = 1, 2, 100, 32
q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
started = time.perf_counter()
out = flash_attention(q, k, v, causal=True)  # (B, H, T, D)
seconds = time.perf_counter() - started
causal_mask = torch.ones(T, T, dtype=torch.bool).tril()
expected, _ = reference_kernel(q, k, v, causal_mask)  # float64
sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
print(f"grid: {-(-T // BLOCK_M)} query tiles x {B * H} heads; output {tuple(out.shape)}")
print(f"largest difference from float64: {(out.double() - expected).abs().max():.1e}, from SDPA: "
      f"{(out - sdpa).abs().max():.1e}; the interpreter took {seconds:.2f} s (a GPU takes microseconds)")

# %% [markdown]
# ## The backward: recompute, do not store
#
# With `P` the probabilities, `O` the output and `dO` its gradient, the gradients are
# `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ∘ (dP - δ)` with `δ = rowsum(dO ∘ O)` (the softmax's
# backward), `dQ = scale · dS K` and `dK = scale · dSᵀ Q`. None of them needs `P` stored: each tile
# of it comes back as `exp(scale · q kᵀ - lse)` from the saved log-sum-exp. Two kernels share the
# work without two programs ever writing the same place: one program per *key* tile sums `dK` and
# `dV` over the query tiles (below), one per *query* tile sums `dQ` over the key tiles
# (`_backward_q`, its mirror). With grouped-query heads each query head writes its own `dK` and
# `dV`, and the autograd function sums each group's.

# %% tags=["hide-input"]
show_source(triton_flash._backward_kv.fn)

# %% [markdown]
# Every gradient, against float64 autograd through the reference:

# %%
q, k, v = (t.requires_grad_() for t in (q, k, v))
grad_out = torch.randn(B, H, T, D)
flash_attention(q, k, v, causal=True).backward(grad_out)
exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
reference_kernel(*exact, causal_mask)[0].backward(grad_out.double())
rows = [(f"d{name}", tuple(t.grad.shape), f"{(t.grad.double() - e.grad).abs().max():.1e}")
        for name, t, e in zip("qkv", (q, k, v), exact)]

# %% tags=["hide-input"]
show_table("Gradients of flash_attention against float64", ["gradient", "shape", "largest difference"], rows)

# %% [markdown]
# The tests (`tests/test_triton_flash.py`) check the same at lengths 1, 100 and 129, causal and
# not, head sizes 16 to 128 (48: not a power of two, padded inside the kernel), grouped-query
# heads, more keys than queries, bfloat16, and that bad shapes are errors naming them.
#
# ## What the interpreter cannot tell you
#
# It runs the programs one after another, each block operation as a NumPy array operation, so it
# checks the indexing, the masks and the arithmetic. It cannot tell you:
#
# - **speed**: nothing here says how fast the kernel is on a GPU, or how it compares with SDPA's
#   FlashAttention and cuDNN backends;
# - **resources**: a `BLOCK_M x BLOCK_N` tile that fits in NumPy may need more registers or shared
#   memory than a GPU's streaming multiprocessor has, and spill or fail to compile;
# - **races**: programs that run in parallel on a GPU run in order here, so two programs writing one
#   place would not show (the backward's split into a key-tile and a query-tile kernel is what
#   avoids that).
#
# On a GPU, `python -m attention.bench --profile gpu` times this kernel beside SDPA's backends
# (FlashAttention, cuDNN, memory-efficient, math), compiled FlexAttention and the tiled algorithm,
# forward and backward, each checked against float64 first; [Benchmarks: on a
# GPU](../../benchmarks/#on-a-gpu) shows the runs recorded so far. Until one is, nothing on this
# site says how fast the kernel is.
