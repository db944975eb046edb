# %% [markdown]
# # A tiny GPT, end to end
#
# Every other page runs attention with random weights. This one runs a small GPT that the project
# trained itself, on text every Python install has, and uses it: it generates text, swaps every
# causal attention class of the registry in place of the one it was trained with (the same trained
# weights, moved through the canonical state dict), decodes with and without a KV cache, and looks
# at what its trained heads attend to. Nothing is trained here: the page loads the checkpoint
# shipped in the package (`attention/gpt/checkpoints/tiny_gpt.pt`), and every number below is
# computed when the page is built or read from the training run's record beside the checkpoint.
#
# It assumes the [KV cache](../kv_cache/) and [grouped-query attention](../gqa/) pages.
# API reference: [`attention.gpt`](../../api/gpt/).

# %%
import math
import statistics
import time

import torch
from matplotlib.figure import Figure

from attention import IMPLEMENTATIONS
from attention.display import show, show_markdown, show_source, show_table
from attention.gpt import data
from attention.gpt.checkpoint import load_gpt, read_provenance, record_rows
from attention.gpt.model import GPT, Block, GPTConfig
from attention.plotting import plot_attention_weights, plot_heatmaps
from attention.reference import reference_attention_class

record = read_provenance()  # the training run: provenance, final losses, the log (checked against the weights)
_, validation = data.split(data.encode(data.training_text()))  # the held-out bytes, (N,)
model = load_gpt()  # the checkpoint, in the class it was trained with, in eval mode
config = model.config
print(config)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters, attention class {type(model.blocks[0].attn).__name__}")

# %% [markdown]
# ## The model
#
# `attention.gpt.model.GPT` is nanoGPT's model in a few dozen lines: byte embeddings plus learned
# position embeddings, pre-norm blocks, a final layer norm and a head tied to the byte embedding.
# The one line that differs is where a block builds its attention: from any class that keeps the
# causal family's contract (`attention.causal.CausalSelfAttention`). A block:

# %% tags=["hide-input"]
show_source(Block)

# %% [markdown]
# Weights move between classes through `GPT.canonical_state_dict()`: the model's own parameters,
# and each block's attention weights in the family's canonical names, whatever layout a class
# keeps inside (one fused `qkv` matrix, `nn.MultiheadAttention`'s `in_proj_weight`, a list of
# single heads). `load_gpt(attention=name)` builds the model around `IMPLEMENTATIONS[name]` and loads
# them.
#
# ## How it was trained
#
# `python -m attention.gpt.train` read the Python language reference that `help()` shows
# (`pydoc_data.topics`) as UTF-8 bytes, a vocabulary of 256, and learned to predict the next byte.
# Run it yourself and it writes `gpt-runs/tiny_gpt.pt` and `gpt-runs/tiny_gpt.json` in the current
# directory, never over an existing file unless given `--force`; the shipped checkpoint is made again,
# on purpose, from the repository root by
# `python -m attention.gpt.train --threads 1 --out attention/gpt/checkpoints --force`.
# The run's record, `attention/gpt/checkpoints/tiny_gpt.json`, checked field by field and against the
# weights when it is read:

# %% tags=["hide-input"]
show_table("The training run (from its record)", ["", "recorded"], record_rows(record))  # its strings escaped

# %%
steps = torch.arange(1, record["steps"] + 1)
step_losses = torch.tensor(record["log"]["step_train_loss"])
window = 20
smoothed = step_losses.unfold(0, window, 1).mean(dim=1)  # the mean of each run of `window` steps
evaluations = record["log"]["evaluations"]

# %% tags=["hide-input"]
fig = Figure(figsize=(8, 4), layout="constrained")
ax = fig.add_subplot()
ax.plot(steps.numpy(), step_losses.numpy(), color="#bbbbbb", linewidth=0.8, label="train, each step's batch")
ax.plot(steps[window - 1:].numpy(), smoothed.numpy(), color="#1f5fa6", label=f"train, mean of {window} steps")
ax.plot([e["step"] for e in evaluations], [e["validation_loss"] for e in evaluations], "o-", color="#d95f02",
        label=f"validation ({record['log']['eval_windows']} windows of held-out text)")
ax.axhline(math.log(256), color="black", linestyle=":", linewidth=1, label="a uniform guess over 256 bytes (ln 256)")
ax.set_xlabel("optimizer step")
ax.set_ylabel("cross-entropy (nats per byte)")
ax.set_title("Training loss of the tiny GPT (the recorded run)")
ax.legend()
show(fig)

# %% [markdown]
# ## Greedy and sampled text
#
# The prompt goes in as bytes; `generate` appends one byte at a time, either the most likely one
# (greedy) or one drawn from the softmax of the logits (here at temperature 0.8, among the 20 most
# likely bytes, from a seeded generator, so the page shows the same text at every build).

# %%
prompt_text = 'The "while" statement is used for'
prompt = data.encode(prompt_text)[None]  # (1, T): the prompt's bytes
new_tokens = 64
greedy = model.generate(prompt, new_tokens)  # (1, T + new_tokens)
sampled = model.generate(prompt, new_tokens, temperature=0.8, top_k=20, generator=torch.Generator().manual_seed(0))

# %%
def as_block(ids, label):
    text = data.decode(ids[0, prompt.shape[1]:])
    return f"{label}, after the prompt `{prompt_text}`:\n\n````text\n{prompt_text}{text}\n````"


show_markdown(as_block(greedy, f"Greedy, {new_tokens} bytes"))
show_markdown(as_block(sampled, "Sampled (temperature 0.8, top 20)"))

# %% [markdown]
# ## Every causal class swapped in
#
# The same trained weights, loaded into every class of `attention.IMPLEMENTATIONS`, generate the
# greedy continuation of the same prompt. The yardstick is the float64 reference model: the same
# GPT and weights with `attention.reference.ReferenceCausalSelfAttention` in every block, run in
# float64. For each class: whether its bytes are the reference's, where they first differ, and the
# largest difference of its logits from the reference's over the reference's whole sequence (every
# position of prompt and continuation, every byte's logit).

# %%
reference = GPT(config, reference_attention_class(None)).double().eval()
reference.load_canonical_state_dict(model.canonical_state_dict())
reference_tokens = reference.generate(prompt, new_tokens)  # (1, T + new_tokens)
with torch.no_grad():
    reference_logits = reference(reference_tokens)  # (1, T + new_tokens, 256), float64
top2 = reference_logits[0, prompt.shape[1] - 1:-1].topk(2, dim=-1).values  # the scores of each greedy pick and its runner-up
margins = top2[:, 0] - top2[:, 1]  # (new_tokens,): how far each greedy pick was ahead


def swap_in(name):
    """One table row: the class's greedy continuation and logits against the reference's."""
    try:
        swapped = load_gpt(attention=name)
    except ValueError as error:
        return name, IMPLEMENTATIONS[name].__name__, None, str(error)
    tokens = swapped.generate(prompt, new_tokens)
    with torch.no_grad():
        logits = swapped(reference_tokens).double()
    differs = (tokens != reference_tokens)[0, prompt.shape[1]:].nonzero()
    first = None if len(differs) == 0 else int(differs[0])
    return name, type(swapped.blocks[0].attn).__name__, first, (logits - reference_logits).abs().max().item()


started = time.perf_counter()
rows = [swap_in(name) for name in sorted(IMPLEMENTATIONS)]
swap_seconds = time.perf_counter() - started

# %%
def not_fitting_reason(message):
    return "K/V heads differ (`key.weight` shape)" if "key.weight" in message else "position encoding differs"


fitting = [row for row in rows if row[2] is not None or not isinstance(row[3], str)]
show_table(f"The greedy continuation ({new_tokens} bytes) with each class, against the float64 reference model",
           ["class", "identical bytes", "first divergence (continuation byte, from 0)", "largest logit difference"],
           [(f"`{name}` ({cls})", "yes" if first is None else "no", "none" if first is None else first, f"{difference:.1e}")
            if not isinstance(difference, str) else (f"`{name}` ({cls})", "does not fit", "", not_fitting_reason(difference))
            for name, cls, first, difference in rows])
identical = [row for row in fitting if row[2] is None]
largest = max(row[3] for row in fitting)
show_markdown(
    f"{len(identical)} of the {len(fitting)} classes that fit the checkpoint reproduce the reference's {new_tokens} bytes "
    f"exactly. Their logits differ from the reference's by at most {largest:.1e}, while the greedy pick was ahead of the "
    f"runner-up by at least {margins.min().item():.1e} at every step (the closest: continuation byte "
    f"{int(margins.argmin())}), "
    + ("so no rounding difference could change a pick." if largest < margins.min().item() / 2 else
       "close enough that rounding could change a pick there."))
for name, cls, first, difference in fitting:
    if first is not None:
        show_markdown(f"`{name}` first picks another byte at byte {first}: there the reference's top two logits were "
                      f"{margins[first].item():.1e} apart, and {name}'s float32 logits differ from the reference's by up to "
                      f"{difference:.1e}: a near-tie that float32 rounding flips, after which the texts go their own ways.")
not_fitting = [row for row in rows if isinstance(row[3], str)]
show_markdown(f"{len(not_fitting)} classes cannot run these weights, and `load_gpt` says why: "
              + "; ".join(f"`{name}`: {not_fitting_reason(message)}" for name, _, _, message in not_fitting)
              + ". The model learned its positions in a position embedding; RoPE and ALiBi classes encode positions "
              "inside the attention instead, which would be another model. `MultiQueryAttention` has one K/V head where "
              "the checkpoint has one per query head.")

# %% [markdown]
# ## With and without a KV cache
#
# Of these classes, `GroupedQueryAttention` (`gqa`, here with as many K/V heads as query heads: the
# same weights) decodes with a cache: `model.new_caches(batch_size)` makes one `KVCache` per block,
# and `model(next_token, caches)` runs one byte through the model, attending over the cached keys
# and values. `generate` uses the caches where the class has them (`model.supports_cache`), and
# recomputes the whole sequence at every step elsewhere.

# %%
cached_model = load_gpt(attention="gqa")
print(f"{type(cached_model.blocks[0].attn).__name__}: supports_cache = {cached_model.supports_cache}; "
      f"{model.attention_class.__name__}: supports_cache = {model.supports_cache}")
with_cache = cached_model.generate(prompt, new_tokens, use_cache=True)
without_cache = cached_model.generate(prompt, new_tokens, use_cache=False)
print(f"same {new_tokens} bytes with and without the cache: {torch.equal(with_cache, without_cache)}")
assert torch.equal(with_cache, without_cache)

# %% [markdown]
# What a step costs as the sequence grows. Without a cache, the step that produces byte `L + 1` runs
# all `L` bytes through the model again; with a cache, it runs one byte and reads `L` cached
# positions. Both are timed here, at build time, on the machine building this page: the median of
# several repeats of one step at each length (`cache.rewind(L)` backs the cache out, so the same
# step runs again).

# %%
def median_seconds(step, repeats=9):
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


lengths = [8, 16, 32, 64, 96, config.context_length - 1]
sequence = validation[None, :config.context_length]  # (1, context_length): held-out text to run
caches = cached_model.new_caches(batch_size=1)
timings = []
with torch.no_grad():
    cached_model(sequence[:, :lengths[-1]], caches)  # every length's keys and values, cached once

    def cached_step(length):
        for cache in caches:
            cache.rewind(length)  # keep positions 0 .. length - 1
        cached_model(sequence[:, length:length + 1], caches)

    for length in sorted(lengths, reverse=True):  # a cache rewinds backwards only
        uncached = median_seconds(lambda: cached_model(sequence[:, :length + 1]))
        cached = median_seconds(lambda: cached_step(length))
        timings.insert(0, (length, 1 / uncached, 1 / cached))

# %% tags=["hide-input"]
fig = Figure(figsize=(8, 4), layout="constrained")
ax = fig.add_subplot()
ax.plot(lengths, [t[1] for t in timings], "o-", label="without a cache (the whole sequence again)")
ax.plot(lengths, [t[2] for t in timings], "o-", label="with a KV cache (one byte)")
ax.set_xlabel("bytes before the new one, L")
ax.set_ylabel("decode steps per second (tokens/s)")
ax.set_title("One decoding step of the tiny GPT, with and without a KV cache (measured at build time)")
ax.set_ylim(bottom=0)
ax.legend()
show(fig)
show_table("Tokens per second, one decode step (median, this build)", ["L (bytes cached or recomputed)", "without a cache", "with a cache", "ratio"],
           [(length, f"{slow:,.0f}", f"{fast:,.0f}", f"{fast / slow:.1f}x") for length, slow, fast in timings])
(short, slow_short, fast_short), (long, slow_long, fast_long) = timings[0], timings[-1]


def compared(fast, slow):
    return f"{fast / slow:.1f}x as fast as" if fast >= slow else f"{slow / fast:.1f}x slower than"


show_markdown(
    f"In this build, a step without a cache ran at {slow_short:,.0f} tokens/s after {short} bytes and {slow_long:,.0f} "
    f"tokens/s after {long}, where it runs {(long + 1) / (short + 1):.0f}x the bytes through the model; with the cache, "
    f"at {fast_short:,.0f} and {fast_long:,.0f} tokens/s: {compared(fast_short, slow_short)} without it after {short} "
    f"bytes, {compared(fast_long, slow_long)} without it after {long}. The times come from whatever machine builds the "
    f"page, busy or not, and change from build to build; the tokens do not.")

# %% [markdown]
# ## What the trained heads attend to
#
# The float64 reference module keeps each call's attention weights (`attn_weights`, `(B, H, T, T)`).
# Run on held-out text, they give each head a score for a few patterns known from larger models,
# measured, not assumed:
#
# * **previous byte**: the mean weight a query puts on the byte just before it;
# * **first byte**: the mean weight on the first byte of the window (a "sink" for attention that has
#   nowhere better to go);
# * **matching bracket**: at a closing `)`, `]` or `}`, the weight on its matching opening bracket;
# * **induction**: on a random byte string repeated twice, the weight a query in the second copy
#   puts on the byte that followed its earlier occurrence (Olsson et al., 2022,
#   <https://arxiv.org/abs/2209.11895>), the head that lets a model continue a repeated sequence.
#
# Each score sits next to what a head attending uniformly to every earlier byte would get.

# %%
def attention_maps(tokens):
    """The reference model's attention weights for `tokens` `(B, T)`: `(layers, B, H, T, T)` float64."""
    with torch.no_grad():
        reference(tokens)
    return torch.stack([block.attn.attn_weights for block in reference.blocks])


def bracket_pairs(ids):
    """`(closing position, opening position)` of each matched bracket pair in a list of byte ids."""
    opening, pairs, stack = {ord(")"): ord("("), ord("]"): ord("["), ord("}"): ord("{")}, [], []
    for position, byte in enumerate(ids):
        if byte in opening.values():
            stack.append((byte, position))
        elif byte in opening:
            if stack and stack[-1][0] == opening[byte]:
                pairs.append((position, stack.pop()[1]))
            else:
                stack.clear()  # unbalanced: start over
    return pairs


text_windows = data.windows(validation, config.context_length, count=16)[0]  # (16, T) held-out windows
maps = attention_maps(text_windows)  # (layers, 16, H, T, T)
L_layers, _, H, T, _ = maps.shape
queries = torch.arange(1, T)
uniform = 1 / (queries + 1).double()  # a uniform head's weight on any one earlier byte, per query position
scores = {
    "previous byte": maps[..., queries, queries - 1].mean(dim=(1, 3)),  # (layers, H)
    "first byte": maps[..., queries, 0].mean(dim=(1, 3)),
}
chance = {"previous byte": uniform.mean().item(), "first byte": uniform.mean().item()}
pairs = [(window, close, open_) for window in range(len(text_windows))
         for close, open_ in bracket_pairs(text_windows[window].tolist())]
pair_window, pair_close, pair_open = (torch.tensor(column) for column in zip(*pairs))
scores["matching bracket"] = maps[:, pair_window, :, pair_close, pair_open].mean(dim=0)  # (pairs, layers, H) -> (layers, H)
chance["matching bracket"] = (1 / (pair_close + 1).double()).mean().item()
period = 40
random_bytes = torch.randint(ord("a"), ord("z") + 1, (8, period), generator=torch.Generator().manual_seed(0))
repeated = torch.cat([random_bytes, random_bytes], dim=1)  # (8, 2 * period): each string twice
induction_maps = attention_maps(repeated)  # (layers, 8, H, 2 * period, 2 * period)
second = torch.arange(period, 2 * period)  # queries in the second copy
scores["induction"] = induction_maps[..., second, second - period + 1].mean(dim=(1, 3))
chance["induction"] = (1 / (second + 1).double()).mean().item()
print(f"{len(pairs)} matched bracket pairs in {len(text_windows)} windows of held-out text")
best = {pattern: divmod(int(table.argmax()), H) for pattern, table in scores.items()}  # the top head: (layer, head)
strong = [pattern for pattern, (layer, head) in best.items() if scores[pattern][layer, head] > 3 * chance[pattern]]

# %% tags=["hide-input"]
show(plot_heatmaps({f"{pattern}\n(uniform head: {chance[pattern]:.2f})": table for pattern, table in scores.items()},
                   row_labels=[f"layer {layer}" for layer in range(L_layers)], col_labels=list(range(H)),
                   xlabel="head", ylabel="layer", value_label="mean attention weight (0 to 1)",
                   title="What each trained head attends to: measured scores per head", log_scale=False, cell_format="{:.2f}"))
show_table("The head that scores highest on each pattern", ["pattern", "head", "score", "uniform head", "ratio"],
           [(pattern, f"layer {layer}, head {head}", f"{scores[pattern][layer, head]:.2f}", f"{chance[pattern]:.2f}",
             f"{scores[pattern][layer, head] / chance[pattern]:.1f}x") for pattern, (layer, head) in best.items()])
weak = [pattern for pattern in best if pattern not in strong]
show_markdown(
    (f"Patterns with a head at more than three times the uniform score: {', '.join(strong)}. " if strong else
     "No pattern has a head at more than three times the uniform score. ")
    + (f"Not found that clearly: {', '.join(weak)} (a {config.num_layers}-layer model trained for {record['steps']} "
       f"steps need not learn them)." if weak else ""))

# %% [markdown]
# The best-scoring head of each pattern found above (each at least three times the uniform score;
# of every pattern if none is), on a short line of Python, short enough that every byte keeps a
# legible label (each row: a query byte; each column: a byte it may attend to; `␣` a space):

# %%
sentence = data.encode("print(f([x[0]]))")[None]  # (1, T): brackets inside brackets
sentence_maps = attention_maps(sentence)[:, 0]  # (layers, H, T, T)
chosen = list(dict.fromkeys(best[pattern] for pattern in (strong or best)))  # the best head of each pattern found, each once
labels = [{" ": "␣"}.get(chr(byte), chr(byte)) for byte in sentence[0].tolist()]

# %% tags=["hide-input"]
fig = plot_attention_weights(torch.stack([sentence_maps[layer, head] for layer, head in chosen]), ncols=2,
                             title="Attention weights of the best-scoring heads", tokens=labels)
for ax, (layer, head) in zip(fig.axes, chosen):
    patterns = [f"{pattern} ({scores[pattern][layer, head] / chance[pattern]:.1f}x uniform)"
                for pattern in (strong or best) if best[pattern] == (layer, head)]
    ax.set_title(f"layer {layer}, head {head}: {', '.join(patterns)}", fontsize="medium")
show(fig)

# %% [markdown]
# ## The cache's memory against length
#
# A `KVCache` preallocates keys and values for its capacity: per block, `2 * H_kv * head_dim`
# numbers per position and sequence. This model keeps one K/V head per query head; the same sizes
# with grouped-query (2 K/V heads) or multi-query attention (1) would keep fewer. The bytes below are
# `cache.nbytes` of caches actually made, for each capacity, against the model's weights.

# %%
capacities = [16, 32, 64, 128]
this_model = f"this model ({config.num_heads} K/V heads)"
layouts = {this_model: None, "grouped-query, 2 K/V heads": 2, "multi-query, 1 K/V head": 1}
cache_bytes = {}
for label, kv_heads in layouts.items():
    sized = GPT(GPTConfig(**{**config.to_dict(), "num_kv_heads": kv_heads}), IMPLEMENTATIONS["gqa"])
    cache_bytes[label] = [sum(cache.nbytes for cache in sized.new_caches(1, capacity)) for capacity in capacities]
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

# %% tags=["hide-input"]
fig = Figure(figsize=(8, 4), layout="constrained")
ax = fig.add_subplot()
for label, sizes in cache_bytes.items():
    ax.plot(capacities, [size / 2**10 for size in sizes], "o-", label=label)
ax.axhline(weight_bytes / 2**10, color="black", linestyle=":", label="the model's weights (float32)")
ax.set_xlabel("cached positions (bytes of text), one sequence")
ax.set_ylabel("memory (KiB)")
ax.set_title("KV cache memory of the tiny GPT against length (float32)")
ax.legend()
show(fig)
per_position = cache_bytes[this_model][-1] / capacities[-1]
show_markdown(f"This model's caches hold {per_position:,.0f} bytes per position "
              f"({config.num_layers} blocks x 2 (keys, values) x {config.num_heads} heads x {config.d_model // config.num_heads} "
              f"features x 4 bytes): {cache_bytes[this_model][-1] / 2**10:,.0f} KiB at its full context of "
              f"{capacities[-1]} bytes, {cache_bytes[this_model][-1] / weight_bytes:.0%} of its "
              f"{weight_bytes / 2**20:.1f} MiB of weights. The cache grows with the length and with the batch, the weights "
              f"do not: for a large model serving long contexts, the cache is what fills the memory.")
