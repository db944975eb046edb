# %% [markdown]
# # Correctness
#
# This page checks every implementation against the float64 reference, forward and backward, in
# float32 and bfloat16, and finds out what the bfloat16 errors are made of. It assumes the
# implementations of the earlier pages (from [stacked heads](../stacked_heads/) to
# [FlexAttention](../flex/)) and the letters of the [notation page](../../notation/); the
# [numerics page](../numerics/) follows the errors to longer sequences and float16.
#
# Every implementation in `attention.IMPLEMENTATIONS` is checked against the float64 reference
# (`attention/reference.py`) on the same weights, input and output gradient: the forward output,
# the gradient with respect to the input, and the gradients with respect to every weight. The
# tables are computed when the documentation is built, for whatever the registry holds at that
# moment. The repository's tests make the same comparisons, element by element, with tolerances
# per device and dtype; this page shows the numbers. The code that computes them comes first; the
# tables are under [Every implementation](#every-implementation).
#
# ## Method
#
# 1. Build each class as `cls(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4)`,
#    load one shared set of weights (the
#    [canonical state dict](../../glossary/#canonical-state-dict): `query`, `key`, `value` and
#    `out` weights and biases, which each class maps onto its own layout; grouped-query classes,
#    with fewer key/value heads, take the first of them), and cast it to the dtype.
# 2. Run it on a random `(B=2, T=16, 32)` input, and back-propagate a random output gradient `G`
#    (the loss is `sum(out * G)`).
# 3. Compute the same in float64 with `reference_causal_self_attention`, from the weights and
#    inputs *after* rounding to the dtype, so the table measures the arithmetic, not the rounding
#    of the inputs; autograd gives the reference's gradients with respect to the input and every
#    weight. Classes with position encodings (`position_encoding = "alibi"` or `"rope"`) pass it to
#    the reference.
# 4. Report the largest absolute difference over all elements (and, further down, the mean).
#
# API reference: [`attention.reference`](../../api/reference/).

# %%
import copy

import torch
import torch.nn.functional as F

from attention import IMPLEMENTATIONS
from attention.display import show_markdown, show_table
from attention.reference import kv_heads_state, reference_attention, reference_causal_self_attention

torch.manual_seed(0)
B, T, C, H = 2, 16, 32, 4
DTYPES = (torch.float32, torch.bfloat16)


def reference_and_gradients(x, state, position_encoding, grad_out):
    """Float64 reference output and its gradients with respect to `x` and every canonical weight."""
    weights = {name: tensor.detach().double().requires_grad_() for name, tensor in state.items()}
    x64 = x.detach().double().requires_grad_()
    out, _ = reference_causal_self_attention(x64, weights, H, position_encoding)  # (B, T, C)
    (out * grad_out.double()).sum().backward()
    return out.detach(), x64.grad, {name: w.grad for name, w in weights.items()}


def canonical_gradients(module):
    """The module's parameter gradients under canonical names: the `canonical_state_dict` of a copy whose
    parameters hold the gradients (the method only renames, splits and joins parameters)."""
    shadow = copy.deepcopy(module)
    with torch.no_grad():
        for copied, original in zip(shadow.parameters(), module.parameters()):
            copied.copy_(original.grad if original.grad is not None else torch.zeros_like(original))
    return shadow.canonical_state_dict()


def max_error(actual, expected):
    return (actual.double() - expected.double()).abs().max().item()


def mean_error(actual, expected):
    return (actual.double() - expected.double()).abs().mean().item()


base = IMPLEMENTATIONS["split_heads"](C, C, T, 0.0, H)
state = base.canonical_state_dict()
x = torch.randn(B, T, C)
grad_out = torch.randn(B, T, C)

# %% [markdown]
# ## Every implementation

# %%
def check(cls, dtype, x, grad_out):
    """One class against the reference on `x` `(B, T, C)`: `(max errors, mean errors, output, K/V heads)`, each
    error triple for (out, dL/dx, dL/dW)."""
    module = cls(C, C, x.shape[1], 0.0, H).train(False)
    heads = getattr(module, "num_kv_heads", H)
    module.load_canonical_state_dict(kv_heads_state(state, H, heads))
    module = module.to(dtype)
    x_in = x.to(dtype).clone().requires_grad_()  # a fresh leaf per run
    g = grad_out.to(dtype)
    out = module(x_in)
    (out * g).sum().backward()
    grads = canonical_gradients(module)
    expected, expected_dx, expected_grads = reference_and_gradients(
        x_in, module.canonical_state_dict(), cls.position_encoding, g)
    largest = (max_error(out, expected), max_error(x_in.grad, expected_dx),
               max(max_error(grads[key], expected_grads[key]) for key in expected_grads))
    all_grads = torch.cat([grads[key].flatten() for key in expected_grads])  # every weight gradient
    mean = (mean_error(out, expected), mean_error(x_in.grad, expected_dx),
            mean_error(all_grads, torch.cat([expected_grads[key].flatten() for key in expected_grads])))
    return largest, mean, out.detach(), heads


results, notes = {}, []  # results[name, dtype]: max |error| of (out, dL/dx, dL/dW)
means, outputs = {}, {}  # the mean |error| of the same three; each output, for the bfloat16 section
kv_heads = {}  # K/V heads per class: grouped-query classes take the first ones of the shared weights
for name, cls in IMPLEMENTATIONS.items():
    for dtype in DTYPES:
        label = str(dtype).removeprefix("torch.")
        try:
            results[name, label], means[name, label], outputs[name, label], kv_heads[name] = check(cls, dtype, x, grad_out)
        except Exception as error:  # noqa: BLE001 -- a class that cannot run a dtype gets a note
            results[name, label] = None
            notes.append(f"{name}, {label}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")

for (name, label), errors in results.items():
    if label == "float32":  # a broken implementation must fail the docs build
        assert errors is not None and errors[0] < 1e-4 and max(errors[1:]) < 1e-3, (name, errors)


# %% tags=["hide-input"]
def cell(errors, index):
    return "n/a" if errors is None else f"{errors[index]:.1e}"


for label in ("float32", "bfloat16"):
    rows = [[f"`{name}`", cls.position_encoding or "none", *(cell(results[name, label], i) for i in range(3))]
            for name, cls in IMPLEMENTATIONS.items()]
    show_table(f"{label}: max |error| against the float64 reference",
               ["implementation", "position encoding", "out", "dL/dx", "dL/dW"], rows)
for note in notes:
    print("not run:", note)
scale_out, scale_dx, scale_dw = reference_and_gradients(x, state, None, grad_out)
print(f"For scale (float64, no position encoding): max |out| = {scale_out.abs().max().item():.2f}, "
      f"max |dL/dx| = {scale_dx.abs().max().item():.2f}, "
      f"max |dL/dW| = {max(g.abs().max().item() for g in scale_dw.values()):.2f}")
print("unit roundoff (half the gap between 1 and the next number): "
      + ", ".join(f"{label} {torch.finfo(dtype).eps / 2:.1e}" for label, dtype in
                  (("float32", torch.float32), ("bfloat16", torch.bfloat16))))

# %% [markdown]
# ## Past one tile
#
# At `T = 16` every query and key fits in one tile: `tiled` works in blocks of `block_size`
# queries and keys, and FlexAttention in blocks of its `BlockMask` (on CPU this package pads short
# sequences to `MIN_CPU_SEQ_LEN` before FlexAttention runs). So the table above checks their
# one-block path only. The same check at a length past every block size, not a multiple of it, runs
# the paths that carry the softmax's running maximum and sum from one block of keys to the next,
# skip the blocks above the diagonal and cut the last block short, in float32, forward and backward:

# %%
from torch.nn.attention.flex_attention import _DEFAULT_SPARSE_BLOCK_SIZE

from attention.causal.flex import MIN_CPU_SEQ_LEN
from attention.causal.tiled import TiledAttention

tile = max(TiledAttention(C, C, 8, 0.0, H).block_size, _DEFAULT_SPARSE_BLOCK_SIZE, MIN_CPU_SEQ_LEN)
T_long = 2 * tile + tile // 3  # two full blocks and a partial one
x_long, grad_long = torch.randn(1, T_long, C), torch.randn(1, T_long, C)
long_results = {}
for name, cls in IMPLEMENTATIONS.items():
    long_results[name] = check(cls, torch.float32, x_long, grad_long)[0]
    assert long_results[name][0] < 1e-4 and max(long_results[name][1:]) < 1e-3, (name, long_results[name])

# %% tags=["hide-input"]
show_table(f"float32, T = {T_long} (blocks of {tile}: {-(-T_long // tile)} per row, the last one partial), B = 1: "
           "max |error| against the float64 reference",
           ["implementation", "position encoding", "out", "dL/dx", "dL/dW"],
           [[f"`{name}`", cls.position_encoding or "none", *(f"{error:.1e}" for error in long_results[name])]
            for name, cls in IMPLEMENTATIONS.items()])

# %% [markdown]
# ## Reading the table
#
# * Each entry is the largest absolute difference from the float64 reference over all elements:
#   the output `out` `(B, T, d_out)`, the input gradient `dL/dx` `(B, T, d_in)`, and the largest
#   over the canonical weight gradients `dL/dW` (query, key, value, out: weights and biases).
# * float32 errors of a few units of its unit roundoff (printed above) on values of order 1 are
#   the rounding of float32 arithmetic; the build fails if any float32 entry exceeds `1e-4`
#   (outputs) or `1e-3` (gradients), the bounds in the code above.
# * bfloat16 keeps 8 significant bits, so errors of a few thousandths on values of order 1 are
#   expected. The weight gradients sum over every position of the batch, hence their larger
#   scale and error.
#
# ## Why the bfloat16 rows look alike
#
# In the bfloat16 table the `out` and `dL/dW` columns show the same, or nearly the same, value in
# every row. The classes
# are not computing the same numbers: many of their outputs differ (counted below). The largest
# error is set by steps they all share.
#
# **The output.** Every class without a position encoding projects `x` to queries, keys and values
# with a bfloat16 matmul, rounds the attention output (the *context*) to bfloat16, and applies the
# output projection in bfloat16. Run exactly those shared steps around an *exact* attention core
# (the float64 reference on the rounded queries, keys and values, with identity projections):

# %%
bf16_state = {name: tensor.to(torch.bfloat16) for name, tensor in state.items()}
x_bf16 = x.to(torch.bfloat16)
q, k, v = (F.linear(x_bf16, bf16_state[f"{name}.weight"], bf16_state.get(f"{name}.bias"))
           for name in ("query", "key", "value"))  # (B, T, C) each, rounded to bfloat16 like nn.Linear's
identity = {name: torch.eye(C, dtype=torch.float64) for name in ("query.weight", "key.weight", "value.weight", "out.weight")}
causal_mask = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), True = attend
exact_context, _ = reference_attention(q, k, v, identity, H, mask=causal_mask)  # (B, T, C): float64, no projection
shared_steps_out = F.linear(exact_context.to(torch.bfloat16), bf16_state["out.weight"], bf16_state["out.bias"])  # (B, T, C)
expected_bf16, _ = reference_causal_self_attention(x_bf16, bf16_state, H)  # (B, T, C): the float64 reference


def largest_error(actual):
    """`(max |actual - expected_bf16|, index of that element)`."""
    error = (actual.double() - expected_bf16).abs().flatten()
    return error.max().item(), error.argmax().item()


print("max |out error| and the output element where it occurs:")
print(f"  shared bfloat16 steps around an exact core: {largest_error(shared_steps_out)[0]:.2e} at element "
      f"{largest_error(shared_steps_out)[1]}")
for name, cls in IMPLEMENTATIONS.items():
    if cls.position_encoding is None and kv_heads.get(name) == H and (name, "bfloat16") in outputs:
        error, index = largest_error(outputs[name, "bfloat16"])
        print(f"  {name:<40} {error:.2e} at element {index}")

# %% [markdown]
# **The weight gradients.** The float64 weight gradients, rounded once to bfloat16, already miss
# by this much: no class can do better than returning the correctly rounded gradient.

# %%
_, _, exact_grads = reference_and_gradients(x_bf16, bf16_state, None, grad_out.to(torch.bfloat16))
rounding_floor = max(max_error(grad.to(torch.bfloat16), grad) for grad in exact_grads.values())
print(f"max |dL/dW rounded to bfloat16 - dL/dW| = {rounding_floor:.2e}")

# %% [markdown]
# **Telling the classes apart.** The largest error picks one element; the mean over all elements
# weighs every rounding. The table gives the mean absolute error of each quantity in bfloat16, and
# how many of each class's outputs are bit for bit those of `split_heads`.

# %% tags=["hide-input"]
baseline = outputs.get(("split_heads", "bfloat16"))
rows = []
for name, cls in IMPLEMENTATIONS.items():
    if (name, "bfloat16") not in means:
        continue
    out = outputs[name, "bfloat16"]
    # the same function as split_heads: no position encoding, and every K/V head of the shared weights
    comparable = baseline is not None and cls.position_encoding is None and kv_heads.get(name) == H
    same = f"{(out == baseline).sum().item()} of {out.numel()}" if comparable else "—"
    rows.append([f"`{name}`", cls.position_encoding or "none", *(f"{value:.2e}" for value in means[name, "bfloat16"]), same])
show_table("bfloat16: mean |error| against the float64 reference",
           ["implementation", "position encoding", "out", "dL/dx", "dL/dW", "outputs equal to split_heads"], rows)

# Among the classes without position encoding: those whose attention runs in one fused kernel (SDPA
# or FlexAttention), and those that build the (T, T) scores and weights as tensors (attention/causal/*.py).
FUSED = {"sdpa_causal", "sdpa_mask", "torch_mha", "flex"}
EAGER = {"stacked_heads", "split_heads", "fused_qkv", "einsum", "seq_first", "torch_mha_weights"}


def group_mean(names, index):
    values = [means[name, "bfloat16"][index] for name in names if (name, "bfloat16") in means]
    return sum(values) / len(values)


fused_out, eager_out = group_mean(FUSED, 0), group_mean(EAGER, 0)
dx = {name: means[name, "bfloat16"][1] for name in ("stacked_heads", "split_heads", "fused_qkv")}
show_markdown(
    f"Among the classes without position encoding, averaged over each group, the mean output error is "
    f"{fused_out:.2e} for the classes whose attention runs "
    f"in a fused kernel ({', '.join(f'`{n}`' for n in sorted(FUSED))}) and {eager_out:.2e} for those that "
    f"build the `(T, T)` scores and weights as bfloat16 tensors ({', '.join(f'`{n}`' for n in sorted(EAGER))}): "
    f"the fused group's is {'lower' if fused_out < eager_out else 'not lower'}. For the input gradient, "
    f"`stacked_heads` {dx['stacked_heads']:.2e}, `split_heads` {dx['split_heads']:.2e}, "
    f"`fused_qkv` {dx['fused_qkv']:.2e}.")

# %% [markdown]
# What separates them:
#
# * **Scores and weights.** The eager classes store the `(T, T)` scores, the softmax weights and
#   their product with the values as bfloat16 tensors, rounding each. The CPU kernels behind
#   [SDPA](../../glossary/#sdpa) and FlexAttention compute the scores, the running maximum and
#   sum of the softmax, and the output in float32; only the unnormalised weights
#   `exp(score - max)`, each in `(0, 1]`, are rounded to bfloat16 for the second matmul (PyTorch's
#   `aten/src/ATen/native/cpu/FlashAttentionKernel.cpp` and [Inductor](../../glossary/#inductor)'s
#   `torch/_inductor/codegen/cpp_flex_attention_template.py`).
# * **The input gradient.** `x` feeds `3 * H` separate bfloat16 linear layers in `stacked_heads`
#   (a query, key and value projection per head), 3 in `split_heads` and 1 in `fused_qkv`.
#   Autograd adds the input gradients of those layers in bfloat16, rounding after each addition;
#   one fused matmul adds them inside its float32 accumulator.
# * Classes with a position encoding are compared with the reference *with* that encoding: their
#   rotations (`rope`) or biases (`alibi`) are extra rounded steps.
#
# The largest error, the one the tests bound, is therefore no way to rank bfloat16 classes at this
# size: the projections and the final roundings every class shares set it. The
# [numerics page](../numerics/) measures the forward error at longer sequences and in float16,
# against the error of the exact result rounded to the dtype.
