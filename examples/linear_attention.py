# %% [markdown]
# # Linear attention
#
# Softmax attention keeps every past key and value: a decoder's [KV cache](../kv_cache/) grows with
# the context, and each new token reads all of it. Linear attention keeps a fixed-size **state**
# per head instead, a `(Dk, Dv)` matrix that every token reads and writes once, so a step costs
# the same at position 10 as at position 1,000,000. Most layers of several 2025-26 open models are
# of this kind: Qwen3-Next and Qwen3.5 (three gated DeltaNet layers to one softmax layer), Kimi
# Linear (three Kimi delta attention layers to one MLA layer), MiniMax-01 (lightning attention).
#
# This page builds the family one change at a time, from plain linear attention to the delta
# rules of those models, and shows the three forms each rule runs in (one position at a time, in
# chunks, as masked attention) computing the same function. The rules are in `attention/linear/`,
# one file each, importing only torch and the folder's shared argument checks.

# %%
import torch

from attention.display import show, show_markdown, show_source, show_table
from attention.linear import (delta_rule, gated_delta_rule, gated_linear_attention, kimi_delta_rule, retention,
                              retnet_log_decays, ssd)
from attention.linear import gated_delta, gla, kimi_delta, mamba2
from attention.plotting import plot_attention_weights

# %% [markdown]
# ## Attention without the softmax is a running sum
#
# Drop the softmax from causal attention and the output of position `t` is
# `o_t = Σ_{j ≤ t} (q_t · k_j) v_j = S_tᵀ q_t`, with `S_t = Σ_{j ≤ t} k_j v_jᵀ`: the keys and values
# summed into one `(Dk, Dv)` matrix. The same numbers come out of a loop that adds one outer
# product per position (the **recurrent** form) and out of masked attention, scores times a causal
# mask times the values (the **quadratic** form):

# %%
torch.manual_seed(0)
T, Dk, Dv = 6, 4, 3
q, k = torch.randn(T, Dk, dtype=torch.float64), torch.randn(T, Dk, dtype=torch.float64)
v = torch.randn(T, Dv, dtype=torch.float64)

state, outs = torch.zeros(Dk, Dv, dtype=torch.float64), []
for t in range(T):
    state = state + torch.outer(k[t], v[t])  # write: S_t = S_{t-1} + k_t v_tᵀ
    outs.append(state.T @ q[t])  # read: o_t = S_tᵀ q_t
recurrent = torch.stack(outs)  # (T, Dv)

causal = torch.ones(T, T, dtype=torch.float64).tril()
quadratic = ((q @ k.T) * causal) @ v  # (T, Dv): attention with the softmax left out
print(f"state {tuple(state.shape)}, outputs {tuple(recurrent.shape)}; largest difference of the two forms: "
      f"{(recurrent - quadratic).abs().max():.1e}")

# %% [markdown]
# ## The ladder: one change to the recurrence at a time
#
# A plain sum never forgets, and adding a key's value twice blurs it with whatever was there. The
# rules of the last years change the step `S_t = decay_t ⊙ S_{t-1} + write_t`, `o_t = S_tᵀ q_t`:
#
# | Rule | Decay of the state | Write | In |
# |---|---|---|---|
# | Retention, lightning attention | a constant per head | `k_t v_tᵀ` | RetNet, MiniMax-01 |
# | Mamba-2's SSD | `exp(g_t)`, one per head and position | `k_t v_tᵀ` | Mamba-2 |
# | Gated linear attention (GLA) | `exp(g_t)`, one per key channel | `k_t v_tᵀ` | GLA |
# | DeltaNet | none | `k_t u_tᵀ`, `u_t = β_t (v_t − S_{t-1}ᵀ k_t)` | DeltaNet |
# | Gated DeltaNet | one per head and position | the delta rule's, after the decay | Qwen3-Next, Qwen3.5 |
# | Kimi delta attention (KDA) | one per key channel | the delta rule's, after the decay | Kimi Linear |
#
# The delta rule's write stores `v_t` under the key `k_t` as one step of gradient descent on
# `‖Sᵀ k_t − v_t‖²` (step `β_t` in [0, 1]): it first subtracts what the state already returns for
# that key, so a key written twice is overwritten. Here are the decode steps of GLA, SSD, gated
# DeltaNet and KDA, each one position, as the package writes them; compare their lines:

# %% tags=["hide-input"]
show_source(gla.gated_linear_step)
show_source(mamba2.ssd_step)
show_source(gated_delta.gated_delta_step)
show_source(kimi_delta.kimi_delta_step)

# %% [markdown]
# ## Chunks: the form that runs fast
#
# The recurrent form is a loop of `T` small steps; the quadratic form is `T²` work. The **chunked**
# form runs a chunk of `C` positions at a time as a few matrix products and carries the state from
# chunk to chunk. For the delta rules the writes inside a chunk depend on each other (each
# corrects what the ones before it wrote), but the dependence is linear: with `G_t` the cumulative
# log-decay from the chunk's start, the chunk's corrections `U` solve one unit lower-triangular
# system `(I + A) U = diag(β) (V − diag(e^G) K S_0)`, with `A[t, j] = β_t e^{G_t − G_j} k_t · k_j`
# below the diagonal (the "WY" or "UT" transform of the DeltaNet papers). The gated delta rule's
# chunk:

# %% tags=["hide-input"]
show_source(gated_delta.chunk)

# %% [markdown]
# Every exponent in it is a decay from an earlier position to a later one, at most 0, so gates near
# 0 cannot overflow it. Each rule in each form against its own recurrent form, in float64, on a
# length no chunk divides (37 positions, chunks of 16), with a random initial state:

# %%
torch.manual_seed(1)
B, H, T, Dk, Dv = 2, 3, 37, 16, 8
q, k = (torch.nn.functional.normalize(torch.randn(B, H, T, Dk, dtype=torch.float64), dim=-1) for _ in range(2))
v = torch.randn(B, H, T, Dv, dtype=torch.float64)
g_channel = -torch.rand(B, H, T, Dk, dtype=torch.float64)  # log-decays <= 0, one per key channel
g_head = g_channel[..., 0]  # one per head and position
beta = torch.rand(B, H, T, dtype=torch.float64)
initial = torch.randn(B, H, Dk, Dv, dtype=torch.float64)
rules = {
    "retention": lambda form: retention(q, k, v, retnet_log_decays(H), form=form, initial_state=initial, chunk_size=16),
    "ssd": lambda form: ssd(q, k, v, g_head, form=form, initial_state=initial, chunk_size=16),
    "gated_linear_attention": lambda form: gated_linear_attention(q, k, v, g_channel, form=form, initial_state=initial,
                                                                  chunk_size=16),
    "delta_rule": lambda form: delta_rule(q, k, v, beta, form=form, initial_state=initial, chunk_size=16),
    "gated_delta_rule": lambda form: gated_delta_rule(q, k, v, g_head, beta, form=form, initial_state=initial,
                                                      chunk_size=16),
    "kimi_delta_rule": lambda form: kimi_delta_rule(q, k, v, g_channel, beta, form=form, initial_state=initial,
                                                    chunk_size=16),
}
rows = []
for name, run in rules.items():
    out, final = run("recurrent")
    errors = [max((got - out).abs().max().item(), (state - final).abs().max().item())
              for got, state in (run("chunked"), run("quadratic"))]
    rows.append([f"`{name}`", f"{errors[0]:.1e}", f"{errors[1]:.1e}"])
show_table("Largest difference from the recurrent form (outputs and final state), float64",
           ["rule", "chunked", "quadratic"], rows)

# %% [markdown]
# ## In float32 and bfloat16
#
# In float32 the forms round differently: the recurrence adds one write per position, the chunked
# form sums a chunk's writes in a few products. The layers feed the rules bfloat16 activations but
# run them in float32 (the state too), so the bfloat16 line rounds only the inputs. Each rule's
# largest difference from its float64 recurrent form, over its largest output (512 positions, two
# heads of 64):

# %%
torch.manual_seed(2)
B, H, T, Dk, Dv = 1, 2, 512, 64, 64
q, k = (torch.nn.functional.normalize(torch.randn(B, H, T, Dk, dtype=torch.float64), dim=-1) for _ in range(2))
v = torch.randn(B, H, T, Dv, dtype=torch.float64)
g_channel = torch.nn.functional.logsigmoid(torch.randn(B, H, T, Dk, dtype=torch.float64) + 4)  # decays near 0.98
g_head, beta = g_channel[..., 0], torch.rand(B, H, T, dtype=torch.float64)
inputs = {"retention": (q, k, v), "ssd": (q, k, v, g_head), "gated_linear_attention": (q, k, v, g_channel),
          "delta_rule": (q, k, v, beta), "gated_delta_rule": (q, k, v, g_head, beta),
          "kimi_delta_rule": (q, k, v, g_channel, beta)}
functions = {"retention": lambda *t, **kw: retention(*t, retnet_log_decays(H).to(t[0].dtype), **kw), "ssd": ssd,
             "gated_linear_attention": gated_linear_attention, "delta_rule": delta_rule,
             "gated_delta_rule": gated_delta_rule, "kimi_delta_rule": kimi_delta_rule}
rows = []
for name, tensors in inputs.items():
    exact = functions[name](*tensors, form="recurrent")[0]
    bfloat16_inputs = [t.to(torch.bfloat16).float() for t in tensors]  # rounded to bfloat16, run in float32
    outs = [functions[name](*[t.float() for t in tensors], form=form)[0] for form in ("recurrent", "chunked")]
    outs.append(functions[name](*bfloat16_inputs, form="chunked")[0])
    rows.append([f"`{name}`", *(f"{(out.double() - exact).abs().max() / exact.abs().max():.1e}" for out in outs)])
show_table("Largest difference from the float64 recurrent form, over the largest output",
           ["rule", "float32 recurrent", "float32 chunked", "bfloat16 inputs, chunked"], rows)

# %% [markdown]
# A decoder runs the recurrence token by token after a chunked prompt, so the two float32 forms
# must not drift apart over a long sequence. The gated delta rule and KDA in float32, step by step
# against chunked over 32,768 positions, the largest difference so far at each power of two:

# %%
T = 32768
q, k = (torch.nn.functional.normalize(torch.randn(1, 2, T, 64), dim=-1) for _ in range(2))
v, beta = torch.randn(1, 2, T, 64), torch.rand(1, 2, T)
g_channel = torch.nn.functional.logsigmoid(torch.randn(1, 2, T, 64) + 4)
drift = {}
for name, rule, g in (("gated_delta_rule", gated_delta_rule, g_channel[..., 0]), ("kimi_delta_rule", kimi_delta_rule,
                                                                                   g_channel)):
    difference = (rule(q, k, v, g, beta, form="recurrent")[0] - rule(q, k, v, g, beta, form="chunked")[0]).abs()
    so_far = difference.amax(dim=(0, 1, 3)).cummax(dim=0).values  # (T,): the largest up to each position
    drift[name] = [so_far[n - 1].item() for n in (1024, 4096, 16384, 32768)]
show_table("float32, token by token against chunked: largest difference up to each position",
           ["rule", "1,024", "4,096", "16,384", "32,768"],
           [[f"`{name}`", *(f"{value:.1e}" for value in values)] for name, values in drift.items()])
assert max(max(values) for values in drift.values()) < 1e-4  # "must not drift apart": bounded, not growing with T

# %% [markdown]
# ## The quadratic form's decay mask
#
# Unrolled, a rule with a decay per head and position is masked attention whose mask is not 0 or 1
# but the decay between the two positions, `exp(G_t − G_j)` below the diagonal: Mamba-2 calls this
# its state-space duality. A constant decay (retention) gives a mask that fades at the same rate
# along every diagonal; a data-dependent one (SSD) lets a position cut off everything before it:

# %%
T = 16
retention_gate = torch.full((T,), -0.15)  # a constant log-decay
ssd_gate = torch.full((T,), -0.05)
ssd_gate[9] = -6.0  # position 9 forgets almost everything before it
masks = []
for gate in (retention_gate, ssd_gate):
    G = gate.cumsum(0)
    masks.append((G[:, None] - G[None, :]).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).exp())
show(plot_attention_weights(torch.stack(masks), ncols=2, title="Decay masks of the quadratic form",
                            head_titles=["constant decay (retention)", "data-dependent decay (SSD)"],
                            value_label="decay from key j to query i"))

# %% [markdown]
# ## The hybrid models' layers
#
# `attention/models/` holds the layers of three hybrids, each equal to transformers' own
# (tests/test_hybrids.py): `qwen3_next.py` (gated DeltaNet beside gated softmax attention),
# `kimi_linear.py` (Kimi delta attention beside latent attention without RoPE) and `minimax.py`
# (lightning attention beside softmax attention). `from_config` builds either kind of layer from
# the config's `layer_types`, and a linear layer decodes with its states (the recurrent state and its
# short convolution's last inputs) instead of a KV cache. A tiny Qwen3-Next, one layer in four
# softmax attention, and its first layer decoding token by token against the whole prompt at once:

# %%
from attention.models import MODELS

tiny = dict(model_type="qwen3_next", hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, rms_norm_eps=1e-6, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_conv_kernel_dim=4, rope_parameters={"rope_theta": 1e7,
                                                                                 "partial_rotary_factor": 0.25})
layers = [MODELS["qwen3_next"].from_config(tiny, i).double() for i in range(tiny["num_hidden_layers"])]
print(" ".join("L" if layer.layer_type == "linear_attention" else "S" for layer in layers),
      "(L: gated DeltaNet, S: softmax attention)")
x = torch.randn(1, 40, tiny["hidden_size"], dtype=torch.float64)
with torch.no_grad():
    whole = layers[0](x)  # the prompt at once: the chunked form
    cache = layers[0].new_cache(batch_size=1)
    steps = torch.cat([layers[0](x[:, t:t + 1], cache=cache) for t in range(40)], dim=1)  # one token at a time
print(f"state cache: {cache.nbytes:,} bytes after {cache.length} tokens; largest difference from the whole prompt: "
      f"{(steps - whole).abs().max():.1e}")

# %% [markdown]
# Each kind of layer of three tiny transformers models (random weights, float64), fed what the model
# feeds it, against ours with the same weights loaded unchanged (`tests/test_hybrids.py` checks every
# layer, and decoding, the same way):

# %%
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's, on importing transformers in a notebook
import transformers

transformers.logging.set_verbosity_error()  # not its notes that the fast kernels (fla, causal_conv1d) are missing
common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, hidden_act="silu", num_experts_per_tok=2,
              layer_types=["linear_attention", "full_attention"] * 2)
tiny_models = {
    "qwen3_next": common | dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                linear_value_head_dim=6, linear_conv_kernel_dim=4, num_experts=4,
                                moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.5}),
    "kimi_linear": common | dict(num_key_value_heads=4, kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=4,
                                 qk_nope_head_dim=6, v_head_dim=6, linear_num_heads=4, linear_head_dim=6,
                                 num_local_experts=4, moe_intermediate_size=16, pad_token_id=0,
                                 mlp_layer_types=["dense", "sparse"] * 2),
    "minimax": common | dict(block_size=4, num_local_experts=4, rope_parameters={"rope_theta": 1e4}),
}
differences = []  # (model, our class, largest |ours - theirs|, largest |theirs|)
for model_type, config in tiny_models.items():
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **config),
                                                          dtype=torch.float64, experts_implementation="eager")
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.5)
    seen = {}  # layer index -> (what the model fed its attention, what that attention returned)
    for i, decoder_layer in enumerate(model.model.layers):
        def keep(module, args, kwargs, out, i=i):
            seen[i] = (kwargs.get("hidden_states", args[0] if args else None), out[0] if isinstance(out, tuple) else out)
        (getattr(decoder_layer, "linear_attn", None) or decoder_layer.self_attn).register_forward_hook(keep, with_kwargs=True)
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 11)))
    for i in range(2):  # a linear layer, then a softmax one
        theirs = getattr(model.model.layers[i], "linear_attn", None) or model.model.layers[i].self_attn
        ours = MODELS[model_type].from_config(config, i).double()
        ours.load_state_dict(theirs.state_dict())
        x, expected = seen[i]
        with torch.no_grad():
            differences.append((model_type, type(ours).__name__, (ours(x) - expected).abs().max().item(),
                                expected.abs().max().item()))

# %% tags=["hide-input"]
show_table("Our layers against transformers' in a tiny float64 model, 2 sequences of 11 tokens",
           ["model", "our layer", "largest |difference|", "largest |output|"],
           [(name, f"`{layer}`", f"{difference:.1e}", f"{size:.1f}") for name, layer, difference, size in differences])
largest = max(row[2] for row in differences)
assert largest < 1e-5, largest  # float32's precision, below
show_markdown(f"The largest difference, {largest:.0e}, is float32's precision, not float64's: transformers runs the "
              "rules, the L2 norms and the RMSNorms in float32 whatever the model's dtype, where ours keep float64 "
              "(tests/test_hybrids.py holds every layer within 1e-5 of transformers', and our forms and decoding "
              "within 1e-12 of each other).")

# %% [markdown]
# ## Three published hybrids: their schedules and their caches
#
# A linear layer's state has one size at every context, while a softmax layer's cache grows with it:
# [Qwen3-Next 80B-A3B](https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json),
# [Kimi Linear 48B-A3B](https://huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct/blob/main/config.json) and
# [MiniMax-M1](https://huggingface.co/MiniMaxAI/MiniMax-M1-80k/blob/main/config.json), each layer built on the
# `meta` device from its published configuration (`attention.models.published.PUBLISHED_HYBRIDS`), and
# each cache counted by `layer_cache_bytes` ([API](../../api/models/#attention.models.published.layer_cache_bytes),
# checked against the caches the layers allocate): a state of `H x Dk x Dv` numbers in float32 (and a
# short convolution's last inputs), a softmax layer's keys and values (Kimi's latent) per position, in
# bfloat16, for one sequence. Against each, the same model with every layer its softmax kind:

# %%
from attention.models.published import PUBLISHED_HYBRIDS, layer_cache_bytes, published_layers

GiB = 2**30
contexts = [2**k for k in range(12, 21)]  # 4,096 .. 1,048,576 positions
hybrids, rows = {}, []
for name in PUBLISHED_HYBRIDS:
    layers = published_layers(name)
    linear = [layer for layer in layers if layer.layer_type == "linear_attention"]
    softmax = [layer for layer in layers if layer.layer_type != "linear_attention"]
    state = layer_cache_bytes(linear[0], 1, torch.bfloat16)  # one linear layer, at any context
    per_position = layer_cache_bytes(softmax[0], 1, torch.bfloat16)  # one softmax layer, per position
    hybrid = [sum(layer_cache_bytes(layer, n, torch.bfloat16) for layer in layers) for n in contexts]
    all_softmax = [len(layers) * per_position * n for n in contexts]
    smaller_from = state // per_position + 1  # the first context where a linear layer holds less than a softmax one
    assert (len(layers) * per_position * smaller_from > sum(layer_cache_bytes(layer, smaller_from, torch.bfloat16)
                                                            for layer in layers))
    hybrids[name] = dict(layers=layers, hybrid=hybrid, all_softmax=all_softmax, smaller_from=smaller_from)
    rows.append((name, f"{len(linear)} + {len(softmax)}", f"{state / 2**20:.2f} MiB", f"{per_position / 1024:.2f} KiB",
                 *(f"{hybrid[contexts.index(n)] / GiB:.2f}" for n in (4096, 131072, 2**20)),
                 f"{all_softmax[-1] / GiB:.0f}", f"{smaller_from:,}"))

# %% tags=["hide-input"]
show_table("Whole-model cache of one sequence (GiB; states in float32, K/V in bfloat16)",
           ["model", "layers: linear + softmax", "a linear layer's state", "a softmax layer, per position",
            "4k", "128k", "1M", "1M, all softmax", "hybrid smaller from (positions)"], rows)

# %% tags=["hide-input"]
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

depth = max(len(entry["layers"]) for entry in hybrids.values())
fig = Figure(figsize=(10, 2.4), layout="constrained")
ax = fig.subplots()
grid = torch.full((len(hybrids), depth), float("nan"))
for row_index, entry in enumerate(hybrids.values()):
    grid[row_index, :len(entry["layers"])] = torch.tensor([float(layer.layer_type != "linear_attention")
                                                           for layer in entry["layers"]])
ax.imshow(grid, cmap=ListedColormap(["#9ecae1", "#08306b"]), aspect="auto", interpolation="nearest", vmin=0, vmax=1)
ax.set_yticks(range(len(hybrids)), list(hybrids))
ax.set_xticks(range(0, depth, 8))
ax.set(title="Linear (light) and softmax (dark) layers, across the depth", xlabel="layer index")
show(fig)

fig = Figure(figsize=(8, 4.2), layout="constrained")
ax = fig.subplots()
for (name, entry), color in zip(hybrids.items(), ["#1b9e77", "#d95f02", "#7570b3"]):
    ax.plot(contexts, [b / GiB for b in entry["hybrid"]], color=color, marker="o", label=name)
    ax.plot(contexts, [b / GiB for b in entry["all_softmax"]], color=color, linestyle="--")
ax.set(xscale="log", yscale="log", xlabel="context (positions)", ylabel="cache of one sequence (GiB)",
       title="The whole model's cache: hybrid (solid) and all softmax (dashed)")
ax.set_xticks(contexts[::2], [f"{n // 1024:,}k" for n in contexts[::2]])
ax.legend(loc="lower right")
show(fig)
ratios = {name: entry["all_softmax"][-1] / entry["hybrid"][-1] for name, entry in hybrids.items()}
show_markdown("At 1M positions each hybrid's cache is smaller than the same model's with every layer softmax: "
              + ", ".join(f"{ratio:.1f}x ({name})" for name, ratio in ratios.items())
              + ". A state costs more than the cache it replaces only below "
              + ", ".join(f"{entry['smaller_from']:,} positions ({name})" for name, entry in hybrids.items())
              + ": from there on the hybrid holds less at every context.")

# %% [markdown]
# ## Measured: the rule against softmax attention on a CPU
#
# The benchmark's linear profile times the gated delta rule's attention core in each form against
# SDPA's causal attention, by prompt length, and one decode step over the state against one over a
# KV cache, each row checked against the rule's float64 definition first. The recorded run, read by
# `attention.report.linear`:

# %%
from attention.report.linear import linear_section, plot_prefill
from attention.report.long import recorded

linear_path, linear_run = recorded("linear")  # float32

# %% tags=["hide-input"]
show(plot_prefill(linear_run))
show_markdown(linear_section(linear_path, linear_run))
