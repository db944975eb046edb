# %% [markdown]
# # Numerics
#
# How far from the float64 reference does each implementation land in float16 and bfloat16, and
# does that change with the sequence length? Every implementation in `attention.IMPLEMENTATIONS`
# gets the same weights (rounded to the dtype) and the same input; the reference computes the same
# attention in float64 from those rounded values, so the error below is the arithmetic alone.
# Computed on the machine that builds the documentation (a CPU here); a GPU's kernels differ.
#
# ## Method
#
# * `d_in = d_out = 64`, `H = 4` heads of `D = 16`, batch `B = 1`, dropout 0, forward only.
# * Sequence lengths `T` = 64, 128, 256, 512, 1024; inputs drawn from a standard normal.
# * Error: `max |out - reference|` over all `T * d_out` outputs, in the units of the output (whose
#   largest magnitude is printed with the table).

# %%
import matplotlib
import torch
from matplotlib.figure import Figure

from attention import IMPLEMENTATIONS
from attention.display import show, show_table
from attention.reference import reference_causal_self_attention

torch.manual_seed(0)
C, H = 64, 4
LENGTHS = (64, 128, 256, 512, 1024)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}

# %%
state = IMPLEMENTATIONS["split_heads"](C, C, max(LENGTHS), 0.0, H).canonical_state_dict()
inputs = {T: torch.randn(1, T, C) for T in LENGTHS}
errors, notes, scale = {}, [], {}  # errors[dtype name][implementation] = [error per length]
floor = {}  # floor[dtype name] = [max |reference - reference rounded to the dtype| per length]

for dtype_name, dtype in DTYPES.items():
    rounded_state = {key: value.to(dtype) for key, value in state.items()}
    references = {}  # (T, position_encoding) -> float64 output
    for name, cls in IMPLEMENTATIONS.items():
        try:
            module = cls(C, C, max(LENGTHS), 0.0, H).eval()
            module.load_canonical_state_dict(state)
            module = module.to(dtype)
            row = []
            for T in LENGTHS:
                x = inputs[T].to(dtype)
                key = (T, cls.position_encoding)
                if key not in references:
                    references[key], _ = reference_causal_self_attention(x, rounded_state, H, cls.position_encoding)
                    scale[T] = max(scale.get(T, 0.0), references[key].abs().max().item())
                    if cls.position_encoding is None:
                        rounding = (references[key].to(dtype).double() - references[key]).abs().max().item()
                        floor.setdefault(dtype_name, {})[T] = rounding
                with torch.no_grad():
                    out = module(x)
                row.append((out.double() - references[key]).abs().max().item())
            errors.setdefault(dtype_name, {})[name] = row
        except Exception as error:  # noqa: BLE001 -- a class that cannot run a dtype gets a note
            notes.append(f"{name}, {dtype_name}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")

for note in notes:
    print("not run:", note)

# %% [markdown]
# ## Error against sequence length

# %%
markers = "osD^vP*Xh<>p8"
colors = matplotlib.colormaps["tab20"].colors  # one colour per implementation (the default cycle has 10)
fig = Figure(figsize=(8, 10), layout="constrained")
axes = fig.subplots(len(DTYPES), 1)
for ax, (dtype_name, by_implementation) in zip(axes, errors.items()):
    for i, (name, row) in enumerate(by_implementation.items()):
        ax.plot(LENGTHS, row, marker=markers[i % len(markers)], color=colors[i % len(colors)], label=name)
    ax.plot(LENGTHS, [floor[dtype_name][T] for T in LENGTHS], color="black", linestyle=":",
            linewidth=2, label="floor: the exact result rounded to the dtype")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(LENGTHS, [str(T) for T in LENGTHS])
    ax.set_title(f"{dtype_name} forward on CPU, d_model={C}, {H} heads, batch 1:\n"
                 "max |out - float64 reference| (lower is better)")
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("max abs error (output units)")
    ax.grid(True, which="both", alpha=0.3)
handles, labels = axes[0].get_legend_handles_labels()
fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize="small", title="implementation")
show(fig)

# %% [markdown]
# ## The numbers

# %%
for dtype_name, by_implementation in errors.items():
    rows = [[f"`{name}`", *(f"{e:.1e}" for e in row)] for name, row in by_implementation.items()]
    rows.append(["floor: exact result rounded", *(f"{floor[dtype_name][T]:.1e}" for T in LENGTHS)])
    show_table(f"{dtype_name}: max |out - reference|", ["implementation", *(f"T={T}" for T in LENGTHS)], rows)
print("largest |reference output| per length:", {T: round(value, 2) for T, value in scale.items()})

# %% [markdown]
# ## Reading the chart
#
# * float16 keeps 11 significant bits (unit roundoff about `5e-4`), bfloat16 8 bits (about
#   `4e-3`) but float32's exponent range. The dotted line is the floor: the error of the exact
#   result rounded to the dtype, which every implementation that returns that dtype pays. An
#   implementation on the floor loses nothing to its intermediate steps; at most a few units of
#   the floor above it is normal.
# * Above the floor, implementations differ in what they round along the way. An explicit
#   `(T, T)` score or weight matrix in float16/bfloat16 (the eager implementations) rounds every
#   score and weight; fused kernels (SDPA, FlexAttention) keep the scores, the running softmax
#   and the accumulation in float32 and round at the end. At these sizes the differences stay
#   within a small factor of the floor for every implementation.
# * A longer sequence spreads each query's weight over more keys, so each weight is smaller and
#   the weighted sum has more terms: per-element rounding is averaged, and the error does not need
#   to grow with `T`; a flat or falling line is normal.
# * bfloat16 is not "float16 with less precision" for training: its range avoids the overflow and
#   underflow that make float16 training need loss scaling. For inference accuracy alone, float16
#   is the more precise of the two.
