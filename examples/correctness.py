# %% [markdown]
# # Correctness
#
# Every implementation in `attention.IMPLEMENTATIONS`, checked against the float64 reference
# (`attention/reference.py`) on the same weights, input and output gradient: the forward output,
# the gradient with respect to the input, and the gradients with respect to every weight, in
# float32 and in bfloat16. The table is computed when the documentation is built, for whatever
# the registry holds at that moment. The repository's tests make the same comparisons, element
# by element, with tolerances per device and dtype; this page shows the numbers. The code that
# computes them comes first; the tables are under [Every implementation](#every-implementation).
#
# ## Method
#
# 1. Build each class as `cls(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4)`,
#    load one shared set of weights (the *canonical state dict*: `query`, `key`, `value` and `out`
#    weights and biases, which each class maps onto its own layout), and cast it to the dtype.
# 2. Run it on a random `(B=2, T=16, 32)` input, and back-propagate a random output gradient `G`
#    (the loss is `sum(out * G)`).
# 3. Compute the same in float64 with `reference_causal_self_attention`, from the weights and
#    inputs *after* rounding to the dtype, so the table measures the arithmetic, not the rounding
#    of the inputs. Classes with position encodings (`position_encoding = "alibi"` or `"rope"`)
#    pass it to the reference.
# 4. Report the largest absolute difference over all elements.
#
# The reference detaches its weights: it is a function of the input only. To get its gradients
# with respect to the weights as well, the projections are computed outside it, in float64 with
# autograd, and handed in as one stacked input of `3 * d_out` features, which the reference then
# "projects" with exact 0/1 selector matrices. The output matches a direct call to the reference,
# as printed below.

# %%
import torch

from attention import IMPLEMENTATIONS
from attention.display import show_table
from attention.reference import reference_causal_self_attention

torch.manual_seed(0)
B, T, C, H = 2, 16, 32, 4
DTYPES = (torch.float32, torch.bfloat16)


def reference_and_gradients(x, state, position_encoding, grad_out):
    """Float64 reference output and its gradients w.r.t. `x` and every canonical weight."""
    weights = {name: tensor.detach().double().requires_grad_() for name, tensor in state.items()}
    x64 = x.detach().double().requires_grad_()

    def project(name):
        y = x64 @ weights[f"{name}.weight"].T  # (B, T, C)
        return y + weights[f"{name}.bias"] if f"{name}.bias" in weights else y

    stacked = torch.cat([project("query"), project("key"), project("value")], dim=-1)  # (B, T, 3C)
    eye, zero = torch.eye(C, dtype=torch.float64), torch.zeros(C, C, dtype=torch.float64)
    selectors = {
        "query.weight": torch.cat([eye, zero, zero], dim=1),  # (C, 3C): picks the query block
        "key.weight": torch.cat([zero, eye, zero], dim=1),
        "value.weight": torch.cat([zero, zero, eye], dim=1),
        "out.weight": eye,  # the output projection is applied below, with autograd
    }
    context, _ = reference_causal_self_attention(stacked, selectors, H, position_encoding)  # (B, T, C)
    out = context @ weights["out.weight"].T + weights["out.bias"]  # (B, T, C)
    (out * grad_out.double()).sum().backward()
    return out.detach(), x64.grad, {name: w.grad for name, w in weights.items()}


def canonical_gradients(module):
    """The module's parameter gradients, mapped to canonical names by its own `canonical_state_dict`."""
    parameters = list(module.parameters())
    values = [p.data for p in parameters]
    for p in parameters:
        p.data = p.grad if p.grad is not None else torch.zeros_like(p)
    try:
        return module.canonical_state_dict()
    finally:
        for p, value in zip(parameters, values):
            p.data = value


def max_error(actual, expected):
    return (actual.double() - expected.double()).abs().max().item()

# %% [markdown]
# First, the detour through stacked projections changes nothing:

# %%
base = IMPLEMENTATIONS["split_heads"](C, C, T, 0.0, H)
state = base.canonical_state_dict()
x = torch.randn(B, T, C)
grad_out = torch.randn(B, T, C)
direct, _ = reference_causal_self_attention(x, state, H)
stacked, _, _ = reference_and_gradients(x, state, None, grad_out)
print(f"max |stacked form - direct reference| = {max_error(stacked, direct):.1e}")
assert max_error(stacked, direct) < 1e-12

# %% [markdown]
# ## Every implementation

# %%
results, notes = {}, []
for name, cls in IMPLEMENTATIONS.items():
    for dtype in DTYPES:
        label = str(dtype).removeprefix("torch.")
        try:
            module = cls(C, C, T, 0.0, H).train(False)
            module.load_canonical_state_dict(state)
            module = module.to(dtype)
            x_in = x.to(dtype).clone().requires_grad_()  # a fresh leaf per run
            g = grad_out.to(dtype)
            out = module(x_in)
            (out * g).sum().backward()
            grads = canonical_gradients(module)
            expected, expected_dx, expected_grads = reference_and_gradients(
                x_in, module.canonical_state_dict(), cls.position_encoding, g)
            results[name, label] = (
                max_error(out, expected),
                max_error(x_in.grad, expected_dx),
                max(max_error(grads[key], expected_grads[key]) for key in expected_grads),
            )
        except Exception as error:  # noqa: BLE001 -- a class that cannot run a dtype gets a note
            results[name, label] = None
            notes.append(f"{name}, {label}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")

for (name, label), errors in results.items():
    if label == "float32":  # a broken implementation must fail the docs build
        assert errors is not None and errors[0] < 1e-4 and max(errors[1:]) < 1e-3, (name, errors)


def cell(errors, index):
    return "n/a" if errors is None else f"{errors[index]:.1e}"


for label in ("float32", "bfloat16"):
    rows = [[f"`{name}`", cls.position_encoding or "none", *(cell(results[name, label], i) for i in range(3))]
            for name, cls in IMPLEMENTATIONS.items()]
    show_table(f"{label}: max |error| against the float64 reference",
               ["implementation", "position encoding", "out", "dL/dx", "dL/dW"], rows)
for note in notes:
    print("not run:", note)
_, scale_dx, scale_dw = reference_and_gradients(x, state, None, grad_out)
print(f"For scale (float64, no position encoding): max |out| = {direct.abs().max().item():.2f}, "
      f"max |dL/dx| = {scale_dx.abs().max().item():.2f}, "
      f"max |dL/dW| = {max(g.abs().max().item() for g in scale_dw.values()):.2f}")

# %% [markdown]
# ## Reading the table
#
# * Each entry is the largest absolute difference from the float64 reference over all elements:
#   the output `out` `(B, T, d_out)`, the input gradient `dL/dx` `(B, T, d_in)`, and the largest
#   over the canonical weight gradients `dL/dW` (query, key, value, out: weights and biases).
# * float32 errors near `1e-7` to `1e-6` are the rounding of float32 arithmetic (its unit
#   roundoff is about `6e-8`); the build fails if any float32 entry exceeds `1e-4` (outputs) or
#   `1e-3` (gradients).
# * bfloat16 keeps 8 significant bits (unit roundoff about `4e-3`), so errors of a few
#   thousandths on values of order 1 are expected. A column with the same value in every row
#   shows the rounding of the final result to bfloat16, which no implementation avoids;
#   differences *between* rows show where intermediates are rounded to bfloat16 (explicit score
#   matrices, per-head loops) or kept in float32 inside a fused kernel. The weight gradients
#   sum over every position of the batch, hence their larger scale and error. The
#   [numerics page](../numerics/) follows the errors as the sequence grows.
# * "n/a" means the class could not run that dtype here; the reason is printed under the table.
