# %% [markdown]
# # Numerics
#
# This page measures how far each implementation lands from the float64 reference in float16 and
# bfloat16 as the sequence grows, how memory grows with the sequence in a recorded benchmark run,
# and how float16 overflows and which implementations survive it. It assumes the
# [correctness page](../correctness/) (the reference and the canonical weights) and the
# implementations of the earlier pages, from [stacked heads](../stacked_heads/) to
# [FlexAttention](../flex/).
#
# Every implementation in `attention.IMPLEMENTATIONS` gets the same weights (rounded to the dtype;
# grouped-query classes take the first of the shared key/value heads) and the same input; the
# reference computes the same attention in float64 from those rounded values, so the error below
# is the arithmetic alone. Computed on the machine that builds the
# documentation (a CPU here); a GPU's kernels differ.
#
# ## Method
#
# * `d_in = d_out = 64`, `H = 4` heads of `D = 16`, batch `B = 1`, dropout 0, forward only.
# * Sequence lengths `T` = 128, 256, 512, 1024; inputs drawn from a standard normal.
# * Error: `max |out - reference|` over all `T * d_out` outputs, in the units of the output (whose
#   largest magnitude is printed with the table).
# * Floor: `max |reference rounded to the dtype - reference|`, the error of the exact result
#   rounded once. Every implementation returns the dtype, so none can do better; each error
#   below is also given as a multiple of it.

# %%
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention import IMPLEMENTATIONS
from attention.report import prose
from attention.causal.tiled import tiled_attention
from attention.display import show, show_markdown, show_table
from attention.plotting import plot_heatmaps
from attention.reference import kv_heads_state, reference_causal_self_attention
from attention.report.long import memory_section, recorded

torch.manual_seed(0)
C, H = 64, 4
LENGTHS = (128, 256, 512, 1024)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}

# %%
state = IMPLEMENTATIONS["split_heads"](C, C, max(LENGTHS), 0.0, H).canonical_state_dict()
inputs = {T: torch.randn(1, T, C) for T in LENGTHS}
errors, notes, scale = {}, [], {}  # errors[dtype name][implementation] = [error per length]
floor = {}  # floor[dtype name][T, position_encoding, K/V heads] = max |reference rounded to the dtype - reference|
kv_heads_of = {}  # K/V heads per class: grouped-query classes take the first K/V heads of the shared weights

for dtype_name, dtype in DTYPES.items():
    rounded_state = {key: value.to(dtype) for key, value in state.items()}
    references = {}  # (T, position_encoding, K/V heads) -> float64 output
    for name, cls in IMPLEMENTATIONS.items():
        try:
            module = cls(C, C, max(LENGTHS), 0.0, H).eval()
            kv_heads = kv_heads_of[name] = getattr(module, "num_kv_heads", H)
            module.load_canonical_state_dict(kv_heads_state(state, H, kv_heads))
            module = module.to(dtype)
            row = []
            for T in LENGTHS:
                x = inputs[T].to(dtype)
                reference_key = (T, cls.position_encoding, kv_heads)
                if reference_key not in references:
                    references[reference_key], _ = reference_causal_self_attention(
                        x, kv_heads_state(rounded_state, H, kv_heads), H, cls.position_encoding)
                    reference = references[reference_key]
                    scale[T] = max(scale.get(T, 0.0), reference.abs().max().item())
                    rounding = (reference.to(dtype).double() - reference).abs().max().item()
                    floor.setdefault(dtype_name, {})[reference_key] = rounding
                with torch.no_grad():
                    out = module(x)
                row.append((out.double() - references[reference_key]).abs().max().item())
            errors.setdefault(dtype_name, {})[name] = row
        except Exception as error:  # noqa: BLE001 -- a class that cannot run a dtype gets a note
            notes.append(f"{name}, {dtype_name}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")

for note in notes:
    print("not run:", note)

# %% [markdown]
# ## Error against sequence length
#
# Each cell is an implementation's error divided by the floor at that length (the floor of the
# reference with its position encoding): 1.0 means it lands on the correctly rounded result's
# error; 2.0, twice as far.

# %%
names = list(IMPLEMENTATIONS)
ratios = {dtype_name: [[by_implementation[name][i] / floor[dtype_name][T, IMPLEMENTATIONS[name].position_encoding,
                                                                         kv_heads_of[name]]
                        if name in by_implementation else math.nan for i, T in enumerate(LENGTHS)] for name in names]
          for dtype_name, by_implementation in errors.items()}  # ratios[dtype name][class index][length index]

# %% tags=["hide-input"]
measured = [value for table in ratios.values() for row in table for value in row if not math.isnan(value)]
smallest, largest = min(measured), max(measured)
fig = plot_heatmaps({f"{dtype_name} forward": table for dtype_name, table in ratios.items()}, names, LENGTHS,
                    "sequence length T (tokens)", "implementation", "max |out - reference| / floor (×, log scale)",
                    f"Error in multiples of the rounding floor, CPU, d_model={C}, {H} heads, batch 1 (1.0 = on the floor)")
show(fig, alt=f"Heat maps, one per dtype ({', '.join(ratios)}): one row per implementation ({len(names)}), "
              f"one column per sequence length ({', '.join(map(str, LENGTHS))}); each cell gives the maximum error "
              f"divided by the rounding floor, from {smallest:.1f} to {largest:.1f}.")

# %% [markdown]
# ## The numbers

# %% tags=["hide-input"]
for dtype_name, by_implementation in errors.items():
    rows = [[f"`{name}`", *(f"{e:.1e}" for e in row)] for name, row in by_implementation.items()]
    for encoding, kv_heads in sorted({key[1:] for key in floor[dtype_name]}, key=str):
        heads = "" if kv_heads == H else f", {kv_heads} K/V heads"
        rows.append([f"floor ({encoding or 'no'} position encoding{heads})",
                     *(f"{floor[dtype_name][T, encoding, kv_heads]:.1e}" for T in LENGTHS)])
    show_table(f"{dtype_name}: max |out - reference|", ["implementation", *(f"T={T}" for T in LENGTHS)], rows)
print("largest |reference output| per length:", {T: round(value, 2) for T, value in scale.items()})
print("unit roundoff (half the gap between 1 and the next number): "
      + ", ".join(f"{name} {torch.finfo(dtype).eps / 2:.1e}" for name, dtype in DTYPES.items()))

# %% [markdown]
# ## Reading the chart
#
# * float16 keeps 11 significant bits, bfloat16 8 bits (their unit roundoffs are printed above)
#   but float32's exponent range. An implementation on the floor loses nothing to its
#   intermediate steps; a few times the floor is normal.
# * Where a whole column shows one value, the largest error comes from steps every implementation
#   shares, the projections and the roundings of their results, not from the attention itself
#   (the [correctness page](../correctness/#why-the-bfloat16-rows-look-alike) shows this for
#   bfloat16).
# * Above the floor, implementations differ in what they round along the way. An explicit
#   `(T, T)` score or weight matrix in float16/bfloat16 (the eager implementations) rounds every
#   score and weight. The CPU kernels behind [SDPA](../../glossary/#sdpa) and FlexAttention
#   compute the scores, the running maximum and sum of the softmax, and the output in float32,
#   and round only the unnormalised weights `exp(score - max)` (each in `(0, 1]`) to the dtype
#   for the second matmul.
# * A longer sequence spreads each query's weight over more keys, so each weight is smaller and
#   the weighted sum has more terms: per-element rounding is averaged, and the error does not need
#   to grow with `T`; a level or falling row is normal.
# * A class whose cell stands out in one column can round once more than the others at the end.
#   The measurement below finds out for `einsum`, whose output projection is an einsum followed
#   by `+ bias`, two roundings to the dtype, where `nn.Linear` adds the bias inside its float32
#   accumulator and rounds once.
# * bfloat16 is not "float16 with less precision" for training: its range avoids the overflow and
#   underflow that make float16 training need loss scaling (the overflow is shown below). For
#   accuracy within range, float16 is the more precise of the two.

# %%
einsum_module = IMPLEMENTATIONS["einsum"](C, C, max(LENGTHS), 0.0, H).eval()
einsum_module.load_canonical_state_dict(state)
einsum_module = einsum_module.to(torch.bfloat16)
worst = max(range(len(LENGTHS)), key=lambda i: ratios["bfloat16"][names.index("einsum")][i])
T_worst = LENGTHS[worst]
x_worst = inputs[T_worst].to(torch.bfloat16)
with torch.no_grad():
    q, k, v = (einsum_module.project_heads(x_worst, layer) for layer in
               (einsum_module.query, einsum_module.key, einsum_module.value))  # (B, H, T, D) each
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(C // H)  # (B, H, T, S)
    scores = scores.masked_fill(~einsum_module.causal_mask[:T_worst, :T_worst], float("-inf"))
    context = torch.einsum("bhts,bhsd->bthd", torch.softmax(scores, dim=-1), v)  # (B, T, H, D)
    through_linear = F.linear(context.reshape(1, T_worst, C), einsum_module.out.weight, einsum_module.out.bias)  # (B, T, C)
reference = reference_causal_self_attention(x_worst, kv_heads_state({key: value.to(torch.bfloat16) for key, value in
                                                                      state.items()}, H, H), H)[0]
floor_worst = floor["bfloat16"][T_worst, None, H]
with_linear = (through_linear.double() - reference).abs().max().item() / floor_worst
as_is = ratios["bfloat16"][names.index("einsum")][worst]
split_heads_ratio = ratios["bfloat16"][names.index("split_heads")][worst]

# %% tags=["hide-input"]
kind, _ = prose.ratio_words(as_is, with_linear, within=0.1)
show_markdown(
    f"`einsum` in bfloat16 lands farthest from the floor at `T = {T_worst}`: {as_is:.2f}× (`split_heads`: "
    f"{split_heads_ratio:.2f}×). The same `einsum` module, with only its output projection done by `F.linear` on "
    f"the same context: {with_linear:.2f}×. "
    + ("So its extra error is the output projection's second rounding (einsum, then `+ bias`), not its attention."
       if kind == "more" else "So the output projection's second rounding does not explain it here."))

# %% [markdown]
# ## Memory against sequence length
#
# Peak memory of one forward call against `T` for five classes, read from the newest recorded
# float32 CPU run of the benchmark (the [Benchmarks page](../../benchmarks/) has every class, with
# time; `peak_memory_bytes` is defined on the [schema page](../../benchmark-schema/#memory)).
# Classes that build the `(T, T)` scores of every
# head at once grow like `T²`. A fused kernel's own work needs memory in proportion to `T`; a dense
# `(T, T)` mask handed to it, as `sdpa_mask` does, still grows like `T²`.

# %%
path, recorded_run = recorded("")

# %% tags=["hide-input"]
show_markdown(memory_section(path, recorded_run))

# %% [markdown]
# ## float16: overflowing scores
#
# float16's largest finite number is printed below; past it a value becomes `inf`. Long
# sequences do not by themselves push the scores there; large queries and keys do. A score is the
# dot product of a query and a key, and where `x` holds large activations (outlier features, or
# no normalisation before attention), `q · k` can exceed that number before the `1/sqrt(D)`
# scaling brings it back. Then `softmax` computes `inf - inf = nan`, and the whole row of weights
# is `nan`.
#
# Below, every implementation runs in float16 with the key projection set equal to the query
# projection, so that each token's score against itself is `|q|²`, the largest in its row, on the
# inputs of the sections above scaled up until the largest of those scores is twice float16's
# largest number.

# %%
T = 128
FP16_MAX = torch.finfo(torch.float16).max
tied = dict(state, **{"key.weight": state["query.weight"].clone()})  # each token's self-score is |q|^2
self_scores = (inputs[T].double() @ state["query.weight"].double().T).pow(2).view(1, T, H, C // H).sum(-1)  # (B, T, H)
factor = math.sqrt(2 * FP16_MAX / self_scores.max().item())  # the scores grow with the square of the inputs
x_large = inputs[T] * factor
half_state = {key: value.half() for key, value in tied.items()}
q_large = F.linear(x_large.half(), half_state["query.weight"]).double().view(1, T, H, C // H)  # (B, T, H, D)
largest_scaled_score = q_large.pow(2).sum(-1).max().item() / math.sqrt(C // H)
print(f"inputs x {factor:.0f}; largest finite float16: {FP16_MAX:.0f}; largest |x|: {x_large.abs().max().item():.0f}; "
      f"largest self-score |q|^2 before scaling: {q_large.pow(2).sum(-1).max().item():.0f}, "
      f"after the 1/sqrt(D) scaling: {largest_scaled_score:.0f}; float16 numbers there are "
      f"{2.0 ** (math.floor(math.log2(largest_scaled_score)) - 10):.0f} apart")
overflow_outputs, overflow_errors = {}, {}  # per implementation: (B, T, C) output; (B, T) largest error per position
tied_classes = {name: cls for name, cls in IMPLEMENTATIONS.items() if kv_heads_of[name] == H}
print("left out (grouped K/V heads: the key projection cannot equal the query projection):",
      ", ".join(name for name in IMPLEMENTATIONS if name not in tied_classes))
for name, cls in tied_classes.items():
    module = cls(C, C, T, 0.0, H).eval()
    module.load_canonical_state_dict(tied)
    module = module.half()
    expected, _ = reference_causal_self_attention(x_large.half(), half_state, H, cls.position_encoding)  # float64
    with torch.no_grad():
        overflow_outputs[name] = module(x_large.half())  # (B, T, C)
    overflow_errors[name] = (overflow_outputs[name].double() - expected).abs().amax(dim=-1)  # (B, T), nan where nan
finite_everywhere = torch.stack([~out.isnan().any(dim=-1) for out in overflow_outputs.values()]).all(dim=0)  # (B, T)
print(f"largest |reference output|: {expected.abs().max().item():.0f}")

# %% tags=["hide-input"]
show_table(f"float16, inputs x {factor:.0f}, query = key projection, T = {T}",
           ["implementation", "positions with nan outputs",
            f"max |error| over the {finite_everywhere.sum().item()} positions finite in every implementation"],
           [[f"`{name}`", f"{out.isnan().any(dim=-1).sum().item()} of {T}",
             f"{overflow_errors[name][finite_everywhere].max().item():.2f}"] for name, out in overflow_outputs.items()])

# %% [markdown]
# The implementations with `nan` outputs compute `q @ k.T` in float16 and scale it afterwards:
# the product overflows before the division can help. The others avoid it in one of two ways:
#
# * `nn.MultiheadAttention` with `need_weights=True` (`torch_mha_weights`) multiplies `q` by
#   `1/sqrt(D)` before its matmul (`torch.nn.functional.multi_head_attention_forward`).
# * The SDPA CPU kernel ([FlashAttention](../../glossary/#flashattention)'s scheme) and
#   FlexAttention's compiled CPU kernel write `q @ k.T` into a float32 buffer, scale it there and
#   keep the running maximum of the softmax in float32; the
#   [math kernel](../../glossary/#math-kernel), forced below, stays finite too.
#
# Finite is not accurate. At this magnitude the float16 rounding of the inputs, the projections
# and the outputs costs every implementation far more than in the sections above (compare the
# last column with the largest output); where one class stands out, the next section measures
# why. The attention step alone, on `(B, H, T, D)` tensors with the same queries and keys,
# separates the two fixes: scaling `q` first avoids the overflow but still rounds every score to
# float16, whose numbers near the largest scaled score are several units apart (printed above); a
# kernel that keeps the scores in float32 does not round them.

# %%
q = k = q_large.transpose(1, 2).half()  # (B, H, T, D): queries equal to keys, as above
v = torch.randn(1, H, T, C // H).half()  # (B, H, T, D)
causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), True = attend
exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=causal)  # float64


def report(label, out):
    print(f"{label:<48} nan outputs: {out.isnan().sum().item():>5}, "
          f"max |error| elsewhere: {(out.double() - exact).abs()[~out.isnan()].max().item():.1e}")


scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)  # (B, H, T, T): overflows, then scaled
report("q @ k.T, then scaled", torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v)
scores = (q / math.sqrt(C // H)) @ k.transpose(-2, -1)  # (B, H, T, T): scaled first
report("q scaled, then @ k.T", torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v)
for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
    with sdpa_kernel(backend):
        report(f"F.scaled_dot_product_attention, {backend.name}", F.scaled_dot_product_attention(q, k, v, is_causal=True))

# %% [markdown]
# ### Why one row can go far wrong
#
# The scores here are tens of thousands of units, so rounding the queries and keys to float16,
# which every class does, moves a score by several units: a lot for a softmax, where a difference
# of a few units decides which key takes the weight. A row whose two largest scores are nearly
# equal can then give its weight to the other key, and its output jumps from one value vector to
# the other. The largest error of each class, where it occurs, and how close that row's two largest
# exact scores are (`rope`'s rotation changes the scores, and with them which rows are close):

# %%
from attention.causal.rope import apply_rotary, rotary_cos_sin

D = C // H
causal_rows = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), True = attend
projected = F.linear(x_large.half().double(), half_state["query.weight"].double())  # (B, T, C): exact, from float16 inputs
q_exact = projected.view(1, T, H, D).transpose(1, 2)  # (B, H, T, D)
cos, sin = rotary_cos_sin(T, D, 10000.0, "cpu", torch.float64)
q_exact_rope = apply_rotary(q_exact, cos, sin)  # (B, H, T, D): the exact rotation


def top_two_gap(queries):
    """Per head and query, the gap between the two largest exact scaled scores of `queries @ queries.T`: (B, H, T)."""
    scores = (queries @ queries.transpose(-2, -1) / math.sqrt(D)).masked_fill(~causal_rows, float("-inf"))
    top = scores.topk(2, dim=-1).values  # (B, H, T, 2); the first query has one key, its gap is inf
    return top[..., 0] - top[..., 1]


gaps = {None: top_two_gap(q_exact), "rope": top_two_gap(q_exact_rope)}
rounding = (q_exact.half().double() @ q_exact.half().double().transpose(-2, -1)
            - q_exact @ q_exact.transpose(-2, -1)).abs().masked_fill(~causal_rows, 0).max().item() / math.sqrt(D)
rows = []
for name, cls in tied_classes.items():
    errors = overflow_errors[name][0].masked_fill(~finite_everywhere[0], -1.0)  # (T,)
    position = errors.argmax().item()
    gap = gaps[cls.position_encoding if cls.position_encoding == "rope" else None][0, :, position].min().item()
    rows.append((f"`{name}`", position, f"{errors[position].item():.2f}", f"{gap:.1f}"))
largest_name, largest_position, largest_error, largest_gap = max(rows, key=lambda row: float(row[2]))
others = [float(row[2]) for row in rows if row[0] != largest_name]
near_tie = float(largest_gap) < rounding
if largest_name == "`rope`":
    value_exact = F.linear(x_large.half().double(), half_state["value.weight"].double()).view(1, T, H, D).transpose(1, 2)
    exact_out = F.scaled_dot_product_attention(q_exact_rope, q_exact_rope, value_exact, is_causal=True)  # (B, H, T, D)
    roundings = {
        "rotated exactly, then rounded once to float16": q_exact_rope.half(),
        "rotated in float32, then rounded once to float16":
            apply_rotary(q_exact.half().float(), *rotary_cos_sin(T, D, 10000.0, "cpu", torch.float32)).half(),
        "rotated in float16, as `rope` does (and Hugging Face's Llama)":
            apply_rotary(q_exact.half(), *rotary_cos_sin(T, D, 10000.0, "cpu", torch.float16)),
    }
    rope_rows = {}
    for label, rotated in roundings.items():  # (B, H, T, D) float16 queries = keys
        out = F.scaled_dot_product_attention(rotated, rotated, value_exact.half(), is_causal=True)  # (B, H, T, D)
        rope_rows[label] = (out.double() - exact_out).abs()[0, :, largest_position].max().item()

# %% tags=["hide-input"]
show_table("float16, the position of each class's largest error, and the smallest gap between the two largest exact "
           "scores of that query (over the heads), in scaled-score units", ["implementation", "position", "max |error|",
           "gap between its two largest scores"], rows)
show_markdown(
    f"Rounding the queries and keys to float16 moves a scaled score by up to {rounding:.1f} units here. "
    f"The largest error of all, {largest_name}'s {largest_error} at position {largest_position}, is at a query whose "
    f"two largest exact scores are {largest_gap} units apart"
    + (f", less than that rounding: the row's weight can go to either key, and the output with it. The other "
       f"classes' largest errors are {min(others):.2f} to {max(others):.2f}. So the outlier is a near tie in one row, "
       "not a rounding spread over the output, and not a bug: with other inputs another row, or no row, would stand out."
       if near_tie else ", more than that rounding: a near tie does not explain it."))
if largest_name == "`rope`":
    show_table(f"`rope` at position {largest_position}, the attention alone (before the output projection): three "
               "ways of rounding its queries and keys, max |error| in that row", ["queries and keys", "max |error|"],
               [(label, f"{error:.2f}") for label, error in rope_rows.items()])
    once, in_float32, in_float16 = rope_rows.values()
    kind, ratio = prose.ratio_words(in_float16, in_float32)
    show_markdown(
        f"Rotated exactly and rounded once, this row's attention output is {once:.2f} off; rotated in float32, then "
        f"rounded, {in_float32:.2f}; rotated in float16, as `rope` does (like Hugging Face's Llama), {in_float16:.2f}"
        + (f", {prose.times(ratio)} the float32 rotation's error. Each rounding of numbers this large moves the "
           "scores by units, and in a near tie that decides how the weight splits between two keys."
           if kind == "more" else ". The rotation's precision changes little here; the near tie does the rest."))

# %% [markdown]
# ### Long sequences and the softmax's sum
#
# Where length does matter is the softmax's denominator: a sum of `T` terms of at most 1 each. A
# hand-written softmax that keeps that sum in float16 overflows once it passes the largest finite
# float16, here with equal scores over 70,000 keys, and every weight becomes 0. `torch.softmax`,
# SDPA and FlexAttention's CPU kernel keep that sum in float32 (checked below for the first two).
# Every implementation on this site uses one of them, except `tiled`, which keeps its own running
# sum, and keeps it in float32 at least (`acc_dtype` in `attention/causal/tiled.py`, checked last):
# none of them is exposed to it.

# %%
long_scores = torch.zeros(70_000, dtype=torch.float16)  # one query's equal scores over 70,000 keys
exp_scores = torch.exp(long_scores - long_scores.max())
print(f"hand-written: the sum in float16 is {exp_scores.sum().item()}, "
      f"the weights sum to {(exp_scores / exp_scores.sum()).double().sum().item()}")
print(f"torch.softmax in float16: the weights sum to {torch.softmax(long_scores, dim=-1).double().sum().item():.4f}")
values = torch.randn(1, 1, 70_000, 16).half()  # (B, H, Tk, D)
out = F.scaled_dot_product_attention(torch.zeros(1, 1, 1, 16).half(), torch.zeros(1, 1, 70_000, 16).half(), values)
print(f"SDPA in float16, one query, equal scores: max |out - mean of the values| = "
      f"{(out.double() - values.double().mean(dim=2, keepdim=True)).abs().max().item():.1e}")
out = tiled_attention(torch.zeros(1, 1, 1, 16).half(), torch.zeros(1, 1, 70_000, 16).half(), values, causal=False)
print(f"tiled in float16, the same query: max |out - mean of the values| = "
      f"{(out.double() - values.double().mean(dim=2, keepdim=True)).abs().max().item():.1e}")
