# %% [markdown]
# # FlexAttention
#
# This page shows how FlexAttention turns a mask written as a Python predicate into a compiled
# kernel that skips masked blocks, and what the `flex` class does to run it correctly on CPU. It
# assumes the [split-heads](../split_heads/) page (the module shell), the [masks](../masks/) page
# (masks as predicates) and the [SDPA page](../sdpa/) (fused attention kernels).
#
# `FlexCausalAttention` (`attention/causal/flex.py`, registered as `flex`) runs the attention with
# PyTorch's FlexAttention (`torch.nn.attention.flex_attention`, https://pytorch.org/blog/flexattention/),
# compiled with `torch.compile`.
#
# ## The idea
#
# FlexAttention takes the mask as a Python predicate,
# [`mask_mod(b, h, q_idx, kv_idx) -> bool`](../../glossary/#mask-mod-score-mod) (True = attend),
# instead of a tensor. `create_block_mask` evaluates the predicate once per `(Q_LEN, KV_LEN)` and
# summarises it per block of 128 x 128 positions in a [`BlockMask`](../../glossary/#blockmask):
# which blocks are fully masked (skip), fully visible (no mask needed) or partial (apply the
# predicate). `torch.compile` then generates one fused kernel, in the style of
# [FlashAttention](../../glossary/#flashattention), that walks only over the blocks that matter.
# New mask patterns (sliding windows, documents, prefixes) cost a new predicate, not a new kernel.
# For the [causal mask](../../glossary/#causal-mask), the blocks above the diagonal are skipped:
# nearly half of them for long sequences.
#
# The module around it is the [split-heads](../split_heads/) shell. Two limits of PyTorch's
# FlexAttention shape the class: it has no dropout on the attention weights (so `dropout` must be
# 0), and no backward on CPU or MPS (there the class computes the backward densely, in
# `FlexDenseBackward`).
#
# API reference: [`attention.causal.flex`](../../api/causal/flex/).

# %%
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from attention.causal.alibi_flex import ALiBiFlexAttention
from attention.causal.flex import (MIN_CPU_SEQ_LEN, FlexCausalAttention, FlexDenseBackward, causal,
                                   compiled_flex_attention, recompile_room)
from attention.display import show_shape, show_source
from attention.reference import reference_causal_self_attention

# %% [markdown]
# ## The block mask
#
# The causal predicate:

# %% tags=["hide-input"]
show_source(causal)

# %% [markdown]
# Its `BlockMask` for 512 positions. Per row of query blocks, the `BlockMask` lists the partial
# blocks (`kv_num_blocks`, `kv_indices`: the kernel applies the predicate inside them) and the full
# ones (`full_kv_num_blocks`, `full_kv_indices`: no predicate needed); every block in neither list
# is skipped. `sparsity()` is the share of skipped blocks.

# %%
seq_len = 512
block_mask = create_block_mask(causal, B=None, H=None, Q_LEN=seq_len, KV_LEN=seq_len, device="cpu")
q_block, kv_block = block_mask.BLOCK_SIZE
n_q_blocks, n_kv_blocks = -(-seq_len // q_block), -(-seq_len // kv_block)  # ceil division
kinds = [["."] * n_kv_blocks for _ in range(n_q_blocks)]  # "." = skipped
for row in range(n_q_blocks):
    for col in block_mask.kv_indices[0, 0, row, : block_mask.kv_num_blocks[0, 0, row]].tolist():
        kinds[row][col] = "P"  # partial
    for col in block_mask.full_kv_indices[0, 0, row, : block_mask.full_kv_num_blocks[0, 0, row]].tolist():
        kinds[row][col] = "F"  # full
counts = {kind: sum(row.count(kind) for row in kinds) for kind in "FP."}
print(f"T = {seq_len}, BLOCK_SIZE = {block_mask.BLOCK_SIZE}: {n_q_blocks} x {n_kv_blocks} blocks")
print("\n".join("    " + " ".join(row) for row in kinds))
print(f"full (F): {counts['F']}, partial (P): {counts['P']}, skipped (.): {counts['.']}; "
      f"sparsity() = {block_mask.sparsity():.1f}%")

# %% [markdown]
# ## Shapes, step by step
#
# Every distinct shape costs a compilation (seconds on CPU), so this page uses one shape
# throughout: `B = 2`, `T = 16`, `d_in = d_out = 32`, `H = 4`, `D = 8`. On CPU the class runs
# sequences shorter than `MIN_CPU_SEQ_LEN` padded with zero tokens at the end (see the pitfalls
# below for why), so a `T = 16` call really runs at the padded length, on a one-block
# `BlockMask`.

# %%
torch.manual_seed(0)
B, T, d_model, H = 2, 16, 32, 4
D = d_model // H
x = torch.randn(B, T, d_model)
module = FlexCausalAttention(d_model, d_model, context_length=T, dropout=0.0, num_heads=H).eval()
with torch.no_grad():
    show_shape("x", x, "(B, T, d_in)")
    q = module.query(x).view(B, T, H, D).transpose(1, 2)
    k = module.key(x).view(B, T, H, D).transpose(1, 2)
    v = module.value(x).view(B, T, H, D).transpose(1, 2)
    show_shape("q = query(x).view(B, T, H, D).transpose(1, 2)", q, "(B, H, T, D)")
    T_run = max(T, MIN_CPU_SEQ_LEN)  # on CPU
    show_shape("F.pad(q, (0, 0, 0, T_run - T))", F.pad(q, (0, 0, 0, T_run - T)), "(B, H, T_run, D)")
    start = time.perf_counter()
    out = module(x)
    print(f"first call (compiles): {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    out = module(x)
    print(f"second call: {1000 * (time.perf_counter() - start):.1f} ms")
    show_shape("module(x)", out, "(B, T, d_out)")
used = module.block_masks[(T_run, "cpu")]  # the BlockMask the calls above ran on, cached per (length, device)
show_shape("module.block_masks[(T_run, 'cpu')]", used, "(1, 1, T_run, T_run): one for every sequence and head")
print(f"BLOCK_SIZE = {used.BLOCK_SIZE}; partial blocks: {used.kv_num_blocks.sum().item()}, "
      f"full blocks: {used.full_kv_num_blocks.sum().item()}; block masks built: {list(module.block_masks)}")

# %% [markdown]
# ## The code

# %% tags=["hide-input"]
show_source(FlexCausalAttention.block_mask)
show_source(FlexCausalAttention.forward)

# %% [markdown]
# Where FlexAttention has no backward (CPU, MPS), the forward still runs the compiled kernel and
# the backward recomputes the weights densely:

# %% tags=["hide-input"]
show_source(FlexDenseBackward)

# %% [markdown]
# The dense backward needs the score modification as a tensor too: `score_bias` gives the causal
# mask (and, in a subclass, the position bias) as one additive `(H or 1, T, T)` tensor. The ALiBi
# variant, `alibi_flex`, is this class with another score and nothing else: it overrides
# `score_mod` and `score_bias` ([position encodings](../positional/)).

# %% tags=["hide-input"]
show_source(FlexCausalAttention.score_bias)
show_source(ALiBiFlexAttention)

# %% [markdown]
# ## Checked against the float64 reference
#
# The output, and the gradient with respect to the input (on CPU, through `FlexDenseBackward`).

# %%
state = module.canonical_state_dict()
x_ref = x.clone().requires_grad_()
expected, _ = reference_causal_self_attention(x_ref, state, num_heads=H)
grad_out = torch.randn(B, T, d_model, dtype=torch.float64)
(expected * grad_out).sum().backward()

x_flex = x.clone().requires_grad_()
out = module(x_flex)
(out * grad_out.float()).sum().backward()
error = (out.double() - expected).abs().max().item()
grad_error = (x_flex.grad.double() - x_ref.grad).abs().max().item()
print(f"max |out - reference|       = {error:.2e}  (float32)")
print(f"max |dL/dx - reference|     = {grad_error:.2e}  (float32)")
assert error < 1e-5 and grad_error < 1e-4, (error, grad_error)

# %% [markdown]
# ## Pitfalls
#
# **Slicing a `BlockMask` does not shorten it.** A class that builds one `BlockMask` for
# `context_length = 1024` positions and cuts it for each input like a dense mask,
# `block_mask[:T, :T]`, gets no shorter mask. A `BlockMask` is indexed by batch and head first: the
# slice leaves the lengths whole, and FlexAttention refuses it, as it refuses the unsliced mask for
# a shorter input:

# %%
long_mask = create_block_mask(causal, B=None, H=None, Q_LEN=1024, KV_LEN=1024, device="cpu")
sliced = long_mask[:T, :T]
show_shape("long_mask", long_mask, "(1, 1, 1024, 1024)")
show_shape("long_mask[:T, :T]", sliced, "(1, 1, 1024, 1024): batch and head sliced, not Q_LEN, KV_LEN")
for label, wrong_mask in (("long_mask[:T, :T]", sliced), ("long_mask", long_mask)):
    try:
        flex_attention(q, k, v, block_mask=wrong_mask)  # q, k, v: (B, H, T, D) with T = 16
    except (RuntimeError, ValueError) as error:
        print(f"{label}: {type(error).__name__}: {str(error).split('. ')[0]}")

# %% [markdown]
# A `BlockMask` is built for one `(Q_LEN, KV_LEN)`: the class builds one per length from the
# predicate, with `create_block_mask`, and caches it (`FlexCausalAttention.block_mask` above).
#
# **Uncompiled, FlexAttention is a slow reference.** The same copied class never called
# `torch.compile`. Eager `flex_attention` works, but it materialises the full score matrix,
# which is what FlexAttention exists to avoid, and PyTorch warns about it:

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    flex_attention(q, k, v, block_mask=create_block_mask(causal, B=None, H=None, Q_LEN=T, KV_LEN=T, device="cpu"))
for warning in caught:
    print(str(warning.message).splitlines()[0])

# %% [markdown]
# The class compiles `flex_attention` once per process (`_compiled_flex_attention` at module
# level) and builds each `BlockMask` once per sequence length and device.
#
# **Compilation per shape, and `recompile_limit`.** The first call for a new shape or dtype
# compiles (seconds, see above): the class compiles with `dynamic=False`, one kernel per length,
# because [inductor](../../glossary/#inductor)'s CPU FlexAttention template fails on some
# dynamic-shape compiles. Benchmarks must warm up first. And `torch.compile` keeps at most
# `recompile_limit` compiled versions of one function (`torch._dynamo.config.recompile_limit`);
# past it, PyTorch logs one warning and runs the function uncompiled from then on. Every
# FlexAttention class shares the one compiled `flex_attention`, so a process that runs several of
# them over several dtypes and lengths (a benchmark sweep, the [numerics page](../numerics/)) can
# pass `recompile_limit`, and FlexAttention then runs *uncompiled*: still correct, but dense and
# slow. So the class raises `recompile_limit` for its own calls: `compiled_flex_attention` runs
# inside `recompile_room()`, the one place the package sets `recompile_limit`:

# %% tags=["hide-input"]
show_source(recompile_room)
show_source(compiled_flex_attention)

# %%
print("recompile_limit, torch's default:    ", torch._dynamo.config.recompile_limit)
with recompile_room():
    print("recompile_limit in recompile_room(): ", torch._dynamo.config.recompile_limit)

# %% [markdown]
# Code that compiles `flex_attention` itself should run inside `recompile_room()` too, and
# `TORCH_LOGS=recompiles` shows every recompilation.
#
# **Short sequences on CPU.** On one AVX2 machine this project ran on, PyTorch 2.13's compiled CPU
# FlexAttention kernel returned wrong output rows for some sequences shorter than 64 tokens:
# garbage values, no error, and not on every run (the observation is recorded beside
# `MIN_CPU_SEQ_LEN` in `attention/causal/flex.py`). With a margin, the class runs every sequence
# shorter than `MIN_CPU_SEQ_LEN`, one 128-token block, on CPU padded with zero tokens at the end
# and cuts the output back: under a causal mask no real query sees a padded key, so this is exact. The cell runs
# the raw kernel and the class on such a length; whether the raw kernel goes wrong depends on the
# machine and the run, so only the class is asserted.

# %%
q, k, v = (torch.randn(2, 2, 8, 8) for _ in range(3))  # (B, H, T, D) with T = 8
short_mask = create_block_mask(causal, B=None, H=None, Q_LEN=8, KV_LEN=8, device="cpu")
with torch.no_grad(), recompile_room():
    raw = torch.compile(flex_attention, dynamic=False)(q, k, v, block_mask=short_mask)
raw_error = (raw - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max().item()
print(f"raw compiled kernel at T=8: max |flex - sdpa| = {raw_error:.1e}")

x_short = torch.randn(B, 8, d_model, dtype=torch.float64)
expected_short, _ = reference_causal_self_attention(x_short, state, num_heads=H)
with torch.no_grad():
    short_error = (module(x_short.float()).double() - expected_short).abs().max().item()
print(f"FlexCausalAttention at T=8 (run padded to {MIN_CPU_SEQ_LEN}): max |out - reference| = {short_error:.1e}")
assert short_error < 1e-5

# %% [markdown]
# **No dropout, no CPU backward.** `FlexCausalAttention(dropout=0.1)` raises a `ValueError`
# rather than silently ignoring the dropout. Training on CPU works through the dense backward
# above, which materialises the `(T, T)` weights: correct, not fast.

# %%
try:
    FlexCausalAttention(32, 32, context_length=16, dropout=0.1, num_heads=4)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# **An fp32 FlexAttention run is not "FlashAttention" either.** The compiled kernel follows the
# FlashAttention algorithm, but it is Triton (CUDA) or C++ (CPU) code generated by
# `torch.compile`, not the FlashAttention library; call its numbers "FlexAttention".
