# %% [markdown]
# # einsum and sequence-first
#
# This page writes every contraction of multi-head attention as an einsum, so each index has a
# name, and compares the batch-first layout with labml.ai's sequence-first one, including its mask
# layout and its projections. It assumes the [split-heads](../split_heads/) page; the index
# letters are on the [notation page](../../notation/).
#
# Two registered classes use `torch.einsum`:
#
# * `EinsumAttention` (`attention/causal/einsum.py`, `einsum`): batch-first, einsum throughout,
#   including the projections;
# * `SeqFirstAttention` (`attention/causal/seq_first.py`, `seq_first`): after labml.ai's annotated
#   implementation (https://nn.labml.ai/transformers/mha.html), computed sequence-first with a
#   `PrepareForMultiHeadAttention` layer that projects and splits heads in one step.
#
# ## The idea
#
# An einsum string lists the indices of each input and of the output; indices missing from the
# output are summed over. With `b` batch, `h` head, `t` query position, `s` key position, `d` head
# feature and `c` input feature:
#
# | Step | einsum | Shapes |
# |------|--------|--------|
# | project into heads | `btc,hdc->bhtd` | `(B, T, C)`, `(H, D, C)` -> `(B, H, T, D)` |
# | scores | `bhtd,bhsd->bhts` | `(B, H, T, D)`, `(B, H, S, D)` -> `(B, H, T, S)` |
# | weighted values | `bhts,bhsd->bthd` | `(B, H, T, S)`, `(B, H, S, D)` -> `(B, T, H, D)` |
# | output projection | `bthd,ohd->bto` | `(B, T, H, D)`, `(d_out, H, D)` -> `(B, T, d_out)` |
#
# The softmax turns the scores of each query into weights over the keys, so it runs over `s`;
# before it, the [causal mask](../../glossary/#causal-mask) sets the scores of future keys
# (`s > t`) to `-inf`.
# The sequence-first version does the same with `i` (query) and `j` (key) on `(T, B, ...)`
# tensors; its scores are `(T, S, B, H)` and its softmax runs over dimension 1.
#
# API reference: [`attention.causal.einsum`](../../api/causal/einsum/), [`attention.causal.seq_first`](../../api/causal/seq_first/).

# %%
import torch

from attention.causal.einsum import EinsumAttention
from attention.causal.seq_first import PrepareForMultiHeadAttention, SeqFirstAttention
from attention.display import show_markdown, show_shape, show_source
from attention.reference import reference_attention, reference_causal_self_attention

# %% [markdown]
# ## Shapes, step by step
#
# `B = 2`, `T = 4`, `d_in = 6`, `H = 2`, `D = 2`, `d_out = 4`; first batch-first:

# %%
torch.manual_seed(0)
B, T, d_in, d_out, H = 2, 4, 6, 4, 2
D = d_out // H
x = torch.randn(B, T, d_in)
module = EinsumAttention(d_in, d_out, context_length=8, dropout=0.0, num_heads=H).eval()

with torch.no_grad():
    show_shape("x", x, "(B, T, C)")
    weight = module.query.weight.view(H, D, d_in)
    show_shape("query.weight.view(H, D, d_in)", weight, "(H, D, C)")
    q = torch.einsum("btc,hdc->bhtd", x, weight)
    k, v = module.project_heads(x, module.key), module.project_heads(x, module.value)
    show_shape('q = einsum("btc,hdc->bhtd") (k, v alike)', q, "(B, H, T, D)")
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / D**0.5
    show_shape('scores = einsum("bhtd,bhsd->bhts") / sqrt(D)', scores, "(B, H, T, S)")
    weights = torch.softmax(scores.masked_fill(~module.causal_mask[:T, :T], float("-inf")), dim=-1)
    show_shape("weights = softmax(masked scores, dim=-1)", weights, "(B, H, T, S)")
    context = torch.einsum("bhts,bhsd->bthd", weights, v)
    show_shape('context = einsum("bhts,bhsd->bthd")', context, "(B, T, H, D)")
    out = torch.einsum("bthd,ohd->bto", context, module.out.weight.view(d_out, H, D)) + module.out.bias
    show_shape('out = einsum("bthd,ohd->bto") + bias', out, "(B, T, d_out)")
    print("same as module(x):", torch.allclose(out, module(x), atol=1e-6))

# %% [markdown]
# Then sequence-first: the input is transposed to `(T, B, C)` and stays that way until the end.

# %%
seq_first = SeqFirstAttention(d_in, d_out, context_length=8, dropout=0.0, num_heads=H).eval()
with torch.no_grad():
    x_tb = x.transpose(0, 1)
    show_shape("x.transpose(0, 1)", x_tb, "(T, B, C)")
    q, k, v = seq_first.query(x_tb), seq_first.key(x_tb), seq_first.value(x_tb)
    show_shape("q = PrepareForMultiHeadAttention(x) (k, v)", q, "(T, B, H, D)")
    scores = torch.einsum("ibhd,jbhd->ijbh", q, k) * seq_first.scale
    show_shape('scores = einsum("ibhd,jbhd->ijbh") * scale', scores, "(T, S, B, H)")
    keep = seq_first.causal_mask[:T, :T, None, None]
    show_shape("causal_mask[:T, :T, None, None]", keep, "(T, S, 1, 1)")
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=1)
    show_shape("weights = softmax(masked scores, dim=1)", weights, "(T, S, B, H)")
    context = torch.einsum("ijbh,jbhd->ibhd", weights, v).reshape(T, B, d_out)
    show_shape('einsum("ijbh,jbhd->ibhd").reshape(T, B, d_out)', context, "(T, B, H*D)")
    out = seq_first.out(context).transpose(0, 1)
    show_shape("out(context).transpose(0, 1)", out, "(B, T, d_out)")
    print("same as seq_first(x):", torch.allclose(out, seq_first(x), atol=1e-6))

# %% [markdown]
# ## The code

# %% tags=["hide-input"]
show_source(EinsumAttention.project_heads)
show_source(EinsumAttention.forward)

# %% tags=["hide-input"]
show_source(PrepareForMultiHeadAttention)
show_source(SeqFirstAttention.forward)

# %% [markdown]
# ## Checked against the float64 reference
#
# Both modules get the same weights through the
# [canonical state dict](../../glossary/#canonical-state-dict).

# %%
x = torch.randn(2, 16, 32)
einsum_module = EinsumAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
seq_first = SeqFirstAttention(d_in=32, d_out=32, context_length=16, dropout=0.0, num_heads=4).eval()
state = einsum_module.canonical_state_dict()
seq_first.load_canonical_state_dict(state)
expected, expected_weights = reference_causal_self_attention(x, state, num_heads=4)
with torch.no_grad():
    for name, module in (("einsum", einsum_module), ("seq_first", seq_first)):
        error = (module(x).double() - expected).abs().max().item()
        print(f"{name:<10} max |out - reference| = {error:.2e}  (float32)")
        assert error < 1e-5, (name, error)

# %% [markdown]
# ## Masks: labml's layout and this package's
#
# labml's `MultiHeadAttention` takes an optional mask laid out like its scores without the head
# dimension: `[seq_len_q, seq_len_k, batch_size]` (the query and batch dimensions may be 1). It
# adds a size-1 head dimension and calls `masked_fill(mask == 0, -inf)`, so nonzero or True means
# attend, as here; only the layout differs.
#
# The causal classes of this package take no mask at all: `forward(x)` builds its causal mask
# from the sequence length (`SeqFirstAttention` indexes its `(T, T)` buffer as
# `causal_mask[:T, :T, None, None]` to fit its `(T, S, B, H)` scores). Where a mask is passed, in
# [`attention.MultiHeadAttention`](../general/) and in the reference, it is boolean, True =
# attend, and broadcasts to `(B, H, Tq, Tk)`. The reasons: it is the layout of
# [`F.scaled_dot_product_attention`](../../glossary/#sdpa)'s `attn_mask` and the argument order of
# FlexAttention's
# [`mask_mod(b, h, q_idx, kv_idx)`](../../glossary/#mask-mod-score-mod), so one mask serves every
# path unchanged; batch comes first as in the `(B, T, C)` inputs; and the head dimension lets a
# mask differ per head, which labml's single broadcast head dimension cannot express.
#
# A labml mask converts with one `permute`. Below, the causal mask combined with a
# [padding mask](../../glossary/#padding-mask) (the second sequence has fewer real tokens),
# applied labml's way to the sequence-first scores and our way by the float64 reference:

# %%
B, T = 2, 16
lengths = torch.tensor([16, 11])  # real tokens per sequence; the second is padded after 11
positions = torch.arange(T)
causal = positions[:, None] >= positions[None, :]  # (Tq, Tk), True = attend
real_key = positions[None, :] < lengths[:, None]  # (B, Tk)
mask_labml = causal[:, :, None] & real_key.T[None, :, :]  # (Tq, Tk, B)
mask_ours = mask_labml.permute(2, 0, 1)[:, None]  # (B, 1, Tq, Tk): broadcasts over heads
show_shape("mask_labml", mask_labml, "(Tq, Tk, B)")
show_shape("mask_labml.permute(2, 0, 1)[:, None]", mask_ours, "(B, 1, Tq, Tk)")

with torch.no_grad():
    x_tb = x.transpose(0, 1)  # (T, B, C)
    q, k, v = seq_first.query(x_tb), seq_first.key(x_tb), seq_first.value(x_tb)  # (T, B, H, D) each
    scores = torch.einsum("ibhd,jbhd->ijbh", q, k) * seq_first.scale  # (T, S, B, H)
    scores = scores.masked_fill(~mask_labml[..., None], float("-inf"))  # labml's mask.unsqueeze(-1)
    weights = torch.softmax(scores, dim=1)  # softmax over keys j: (T, S, B, H)
    context = torch.einsum("ijbh,jbhd->ibhd", weights, v).reshape(T, B, 32)  # (T, B, H*D)
    out_labml = seq_first.out(context).transpose(0, 1)  # (B, T, d_out)
out_ours, _ = reference_attention(x, x, x, state, num_heads=4, mask=mask_ours)
difference = (out_labml.double() - out_ours).abs().max().item()
print(f"max |labml layout - reference with the permuted mask| = {difference:.1e}")

# %% [markdown]
# ## Pitfalls
#
# **The softmax must run over the keys.** An easy slip computes the `(B, H, T, S)` scores
# correctly and then calls `softmax(scores, dim=1)`: dimension 1 is the *heads*. Each weight is
# then normalised across heads instead of across keys. Nothing fails, the shapes are all right,
# and the output is wrong:

# %%
with torch.no_grad():
    q = einsum_module.project_heads(x, einsum_module.query)  # (B, H, T, D)
    k = einsum_module.project_heads(x, einsum_module.key)  # (B, H, S, D)
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / 8**0.5  # (B, H, T, S)
    allowed = einsum_module.causal_mask[:16, :16]  # (T, S), True = attend
    scores = scores.masked_fill(~allowed, float("-inf"))
    for dim, label in ((-1, "dim=-1 (keys s), ours"), (1, "dim=1 (heads h), copied")):
        weights = torch.softmax(scores, dim=dim)  # (B, H, T, S)
        nan_count = weights.isnan().sum().item()
        over_keys = weights.nan_to_num(0.0).sum(dim=-1)  # should be 1 for every (b, h, t)
        error = (weights.double() - expected_weights)[..., allowed].abs().max().item()
        print(f"softmax {label}:\n    NaN weights: {nan_count}, sum over keys in "
              f"[{over_keys.min():.2f}, {over_keys.max():.2f}], max error on allowed keys = {error:.2e}")

# %% [markdown]
# With `dim=1`, the weights of one query no longer sum to 1 over the keys: each is a share of a
# softmax across the `H` heads. And every future key, `-inf` in all heads alike, becomes
# `0 / 0 = NaN`. Without a causal mask the same bug yields no NaN at all, only wrong numbers. The
# safe habit: normalise over the index that the next einsum sums away (`s` here, `j`
# sequence-first), and say so in a comment.
#
# **`dim=1` is right sequence-first, wrong batch-first.** In `SeqFirstAttention` the scores are
# `(T, S, B, H)` and `softmax(dim=1)` *is* the key axis. Porting that line to a batch-first
# layout without changing the axis gives exactly the bug above. Using `dim=-1` with the keys last
# (batch-first) or naming the axis in a comment (`# softmax over keys j`) keeps it visible.
#
# **labml's value projection always has a bias.** Its `MultiHeadAttention(heads, d_model,
# dropout_prob, bias)` passes `bias` to the query and key projections but builds the value
# projection with `bias=True` whatever `bias` says. Here `qkv_bias` switches all three. So a labml model built with `bias=False` has
# `d_out` more parameters than ours with `qkv_bias=False`, and its weights load into neither of
# our configurations:

# %%
labml_like = SeqFirstAttention(32, 32, context_length=16, dropout=0.0, num_heads=4, qkv_bias=False)
labml_like.value = PrepareForMultiHeadAttention(32, 4, 8, bias=True)  # labml: always a value bias
labml_like.eval()
ours = SeqFirstAttention(32, 32, context_length=16, dropout=0.0, num_heads=4, qkv_bias=False).eval()
print("parameters: labml-like", sum(p.numel() for p in labml_like.parameters()),
      "| ours, qkv_bias=False", sum(p.numel() for p in ours.parameters()))
labml_state = labml_like.canonical_state_dict()  # value.linear.bias becomes value.bias
for qkv_bias in (False, True):
    try:
        SeqFirstAttention(32, 32, 16, 0.0, 4, qkv_bias=qkv_bias).load_canonical_state_dict(labml_state)
    except ValueError as error:
        print(f"into qkv_bias={qkv_bias}: ValueError: {error}")

# %% [markdown]
# The value bias can still be carried over exactly, by folding it into the output bias. Each
# query's attention weights sum to 1, so the bias reaches the context unchanged:
# `sum_j w_ij (W_v x_j + b_v) = sum_j w_ij W_v x_j + b_v`, and the output projection turns it into
# the constant `W_o b_v`. (Exact in evaluation mode; attention dropout in training rescales the
# weights, so there the two models differ.)

# %%
folded = {name: tensor for name, tensor in labml_state.items() if name != "value.bias"}
folded["out.bias"] = labml_state["out.bias"] + labml_state["out.weight"] @ labml_state["value.bias"]  # b_o + W_o b_v
ours.load_canonical_state_dict(folded)
with torch.no_grad():
    difference = (ours(x) - labml_like(x)).abs().max().item()
print(f"max |ours with the folded bias - labml-like| = {difference:.1e}")

# %% [markdown]
# **einsum speed, and the cost of sequence-first.** `torch.einsum` lowers each contraction to a
# batched matmul whose batch dimensions are the indices both inputs and the output share,
# permuting and copying its inputs when those indices are not already leading. Batch-first, `b` and `h` lead and little is copied.
# Sequence-first, the `(T, S, B, H)` weights must be rearranged into `(B·H, T, S)` for the
# matmul, and the softmax reduces over dimension 1, a strided dimension, which is slower than
# over the last one. From the recorded CPU benchmark run (read at build time; the
# [Benchmarks](../../benchmarks/) page shows it whole):

# %% tags=["hide-input"]
from attention import report

result = report.load_result(report.RESULTS_DIR / "cpu-intel-xeon-2c-float32.json")
sweep = {(r["implementation"], r["mode"], r["seq_len"]): r["ms_median"]
         for r in report.sequence.sweep_rows(result, "forward") if not r["compiled"] and r["status"] == "ok"}
lengths = [t for t in result["config"]["seq_lens"] if all((name, "forward", t) in sweep for name in ("split_heads", "einsum", "seq_first"))]
ratios = {name: [sweep[(name, "forward", t)] / sweep[("split_heads", "forward", t)] for t in lengths] for name in ("einsum", "seq_first")}
show_markdown(
    f"Forward pass, batch {result['config']['sweep_batch']}, T = {', '.join(map(str, lengths))} "
    f"(`docs/results/cpu-intel-xeon-2c-float32.json`: {result['provenance']['device']['name']}, {result['dtype']}"
    + (", recorded with older sources than these" if report.is_stale(result) else "") + "): `einsum` takes "
    f"{min(ratios['einsum']):.2f} to {max(ratios['einsum']):.2f} times the median time of `split_heads`, "
    f"`seq_first` {min(ratios['seq_first']):.2f} to {max(ratios['seq_first']):.2f} times; at T = {lengths[-1]}: "
    f"{ratios['einsum'][-1]:.2f} and {ratios['seq_first'][-1]:.2f}.")

# %% [markdown]
# Read the einsum versions for the names of the indices; for speed, use the [SDPA](../sdpa/)
# versions.
