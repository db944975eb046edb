"""The float64 reference every implementation is tested against.

Plain PyTorch in float64, written for clarity, not speed: one explicit score matrix, one masked
softmax over the keys. It reads weights in the canonical form (`query.weight`, `key.weight`,
`value.weight`, `out.weight`, optional biases) that every implementation exports. Implementations
never import it; the tests and the benchmark's correctness check do. It imports nothing of the package
either: what it needs to know of a model it reads from the model's configuration (`model_reference_kwargs`),
so a layer that reads its configuration wrongly differs from it. `TOLERANCES` says how close an
implementation must come to it, on each device and dtype.
"""

import math

import torch

# How close an output computed on a device type in a dtype must come to this reference, for the tests and the
# benchmark alike: `|out - reference| <= atol + rtol * |reference|` at every element. The low-precision rows include
# the rounding of the weights themselves (a module runs wholly in that dtype); "tf32" is float32 with TensorFloat-32
# matmuls (NVIDIA GPUs). The recorded runs' largest errors sit well inside (docs/results: 4.4e-6 in float32 over
# 32k-token decode steps and long sequences, 5.6e-3 in bfloat16).
TOLERANCES = {
    ("cpu", "float32"): {"atol": 2e-5, "rtol": 1e-4},
    ("cpu", "bfloat16"): {"atol": 2e-2, "rtol": 2e-2},
    ("cpu", "float16"): {"atol": 3e-3, "rtol": 3e-3},
    ("cuda", "float32"): {"atol": 2e-5, "rtol": 1e-4},
    ("cuda", "tf32"): {"atol": 5e-3, "rtol": 5e-3},
    ("cuda", "bfloat16"): {"atol": 2e-2, "rtol": 2e-2},
    ("cuda", "float16"): {"atol": 3e-3, "rtol": 3e-3},
    ("mps", "float32"): {"atol": 2e-5, "rtol": 1e-4},
    ("mps", "bfloat16"): {"atol": 2e-2, "rtol": 2e-2},
    ("mps", "float16"): {"atol": 3e-3, "rtol": 3e-3},
}


def tolerance(device, dtype):
    """`{"atol", "rtol"}` (a new dict) for outputs computed on `device` (a `torch.device` or its name) in `dtype` (a
    `torch.dtype`, or its name: `"float32"`, `"tf32"`, `"bfloat16"`, `"float16"`), from `TOLERANCES`; `ValueError`
    naming the pair where the table has none."""
    device_type = torch.device(device).type
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if (device_type, name) not in TOLERANCES:
        raise ValueError(f"no tolerance for dtype={name!r} on device type {device_type!r}: TOLERANCES has "
                         f"{', '.join(f'{d}/{t}' for d, t in TOLERANCES)}")
    return dict(TOLERANCES[(device_type, name)])


def reference_attention(query, key, value, state, num_heads, mask=None, attn_bias=None, rope_base=None):
    """Multi-head attention in float64.

    Args:
        query: `(B, Tq, d_in)`.
        key, value: `(B, Tk, d_in)`.
        state: canonical weights: `{query,key,value}.weight` `(d_out, d_in)`, `out.weight`
            `(d_out, d_out)`, and optionally the matching `.bias` entries. `key.*` and `value.*` may have
            fewer rows (`num_kv_heads * head_dim`, grouped-query attention).
        num_heads: H; head_dim D = d_out / H.
        mask: boolean, True = attend, broadcastable to `(B, H, Tq, Tk)`. A query with no key to
            attend to gets zero weights and a zero attention output.
        attn_bias: additive score bias broadcastable to `(B, H, Tq, Tk)` (ALiBi).
        rope_base: if given, rotate each pair `(i, i + D/2)` of queries and keys by the angle
            `position * rope_base ** (-2i / D)` (rotary embeddings, rotate-half layout: `reference_rope`).

    Returns:
        `(out, weights)`: `(B, Tq, d_out)` and `(B, H, Tq, Tk)`, both float64.
    """
    f64 = {name: tensor.to(torch.float64) for name, tensor in state.items()}
    query, key, value = (t.to(torch.float64) for t in (query, key, value))

    def project(x, name):
        y = x @ f64[f"{name}.weight"].T
        return y + f64[f"{name}.bias"] if f"{name}.bias" in f64 else y

    head_dim = f64["query.weight"].shape[0] // num_heads

    def split(x):  # (B, T, heads*D) -> (B, heads, T, D): H query heads, H_kv key and value heads
        B, T, C = x.shape
        return x.reshape(B, T, C // head_dim, head_dim).permute(0, 2, 1, 3)

    q, k, v = split(project(query, "query")), split(project(key, "key")), split(project(value, "value"))
    if rope_base is not None:
        inv_freq, _ = rope_frequencies(head_dim, {"rope_theta": rope_base})
        q, k = reference_rope(q, torch.arange(q.shape[-2]), inv_freq), reference_rope(k, torch.arange(k.shape[-2]), inv_freq)

    attn_output, weights = reference_kernel(q, k, v, mask=mask, bias=attn_bias)  # (B, H, Tq, D), (B, H, Tq, Tk)
    B, H, Tq, D = attn_output.shape
    attn_output = attn_output.permute(0, 2, 1, 3).reshape(B, Tq, H * D)
    return project(attn_output, "out"), weights


def reference_kernel(q, k, v, mask=None, bias=None, *, scale=None, softcap=None, sinks=None):
    """The attention kernel in float64: `softmax(scale * q kᵀ (+ bias), masked) v` per head.

    Every float64 attention in the project is this one: `reference_attention` (modules), the
    benchmark's checks and the model families' tests call it.

    Args:
        q: `(B, H, Tq, Dk)` queries.
        k: `(B, H_kv, Tk, Dk)` keys; `v`: `(B, H_kv, Tk, Dv)` values. `H_kv` divides `H`: query head `h`
            reads K/V head `h // (H // H_kv)` (grouped-query attention; `H_kv == H` is multi-head).
        mask: boolean, True = attend, broadcastable to `(B, H, Tq, Tk)`. A query with no key to attend
            to gets zero weights and a zero output (never NaN).
        bias: additive score bias broadcastable to `(B, H, Tq, Tk)` (ALiBi), added after the cap.
        scale: the score scale, default `1 / sqrt(Dk)`.
        softcap: if given, scores become `softcap * tanh(scores / softcap)` after scaling (Gemma 2's
            logit soft-capping).
        sinks: if given, `(H,)` learned sink logits (gpt-oss): each row's softmax runs over its scores
            and the head's sink, and the sink's share is dropped, so a row's weights sum to less than 1.

    Returns:
        `(out, weights)`: `(B, H, Tq, Dv)` and `(B, H, Tq, Tk)`, both float64.
    """
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_kv_heads != v.shape[1] or num_heads % num_kv_heads != 0:
        raise ValueError(f"k and v must have a number of heads dividing q's, got q.shape={tuple(q.shape)}, "
                         f"k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}")
    if num_kv_heads != num_heads:
        k = k.repeat_interleave(num_heads // num_kv_heads, dim=1)  # (B, H, Tk, Dk): head h reads K/V head h // group
        v = v.repeat_interleave(num_heads // num_kv_heads, dim=1)  # (B, H, Tk, Dv)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale  # (B, H, Tq, Tk)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.to(torch.float64)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)  # (B, H, Tq, 1)
    if sinks is not None:
        sink = sinks.to(torch.float64).view(1, num_heads, 1, 1).expand_as(row_max)  # (B, H, Tq, 1)
        row_max = torch.maximum(row_max, sink)
    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
    exp_scores = torch.exp(scores - row_max)  # exp(-inf) = 0 for masked keys
    row_sum = exp_scores.sum(dim=-1, keepdim=True)
    if sinks is not None:
        row_sum = row_sum + torch.exp(sink - row_max)  # the sink's share of the softmax, then dropped
    weights = torch.where(row_sum > 0, exp_scores / row_sum.clamp_min(1e-300), torch.zeros_like(exp_scores))
    return weights @ v, weights  # (B, H, Tq, Dv), (B, H, Tq, Tk)


def rope_frequencies(rotary_dim, parameters):
    """Rotary embeddings' angle per position for each pair of `rotary_dim` features, in float64, and the factor
    the rotated queries and keys are multiplied by.

    Pair `i` (of `rotary_dim / 2`) turns by `position * inverse_frequencies[i]`; unscaled,
    `inverse_frequencies[i] = rope_theta ** (-2i / rotary_dim)` (Su et al., 2021, https://arxiv.org/abs/2104.09864).
    `parameters` is a model's `rope_parameters` (or its `rope_scaling` with `rope_theta` added): `rope_theta`, and
    `rope_type` (or `type`; absent: "default", no scaling) with the fields it reads, which stretch the slow pairs to
    reach longer contexts:

    * `"linear"` (`factor`): every frequency divided by `factor` (position interpolation,
      https://arxiv.org/abs/2306.15595).
    * `"llama3"` (`factor`, `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`):
      Llama 3.1's rule, from Meta's reference code: pairs whose wavelength exceeds
      `original / low_freq_factor` are divided by `factor`, those below `original / high_freq_factor` kept,
      those between blended linearly in `original / wavelength`.
    * `"yarn"` (`factor`, `original_max_position_embeddings`, optional `beta_fast` 32, `beta_slow` 1,
      `mscale`, `mscale_all_dim`, `attention_factor`, `truncate` True): YaRN (Peng et al., 2023,
      https://arxiv.org/abs/2309.00071) as its reference code computes it: pair index `d` where a pair
      turns `beta` times over the original context is `rotary_dim * ln(original / (2 pi beta)) / (2 ln rope_theta)`;
      pairs below the `beta_fast` index keep their frequency, pairs past the `beta_slow` index are divided by
      `factor`, and a linear ramp in the pair index blends between (bounds floored and ceiled when
      `truncate`). The attention factor is `0.1 * ln(factor) + 1` (or, given both `mscale` and
      `mscale_all_dim`, the ratio of that formula at each), unless `attention_factor` is given.

    The models compute the same thing their own way (`attention.models.llama.rope_frequencies`): the tests compare.

    Returns:
        `(inverse_frequencies, attention_factor)`: `(rotary_dim / 2,)` float64 and a float (1.0 but for YaRN).
    """
    scaling, base = parameters, parameters["rope_theta"]
    pair = torch.arange(rotary_dim // 2, dtype=torch.float64)
    inverse_frequencies = base ** (-2 * pair / rotary_dim)
    kind = scaling.get("rope_type", scaling.get("type")) or "default"
    if kind == "default":
        return inverse_frequencies, 1.0
    factor = scaling["factor"]
    if kind == "linear":
        return inverse_frequencies / factor, 1.0
    if kind == "llama3":
        original = scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelength = 2 * math.pi / inverse_frequencies
        blend = ((original / wavelength - low) / (high - low)).clamp(0, 1)  # 0: slow pairs, 1: fast pairs
        scaled = (1 - blend) * inverse_frequencies / factor + blend * inverse_frequencies
        return scaled, 1.0
    if kind == "yarn":
        original = scaling["original_max_position_embeddings"]
        beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

        def pair_turning(turns):  # the (fractional) pair index that turns `turns` times over the original context
            return rotary_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = pair_turning(beta_fast), pair_turning(beta_slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rotary_dim - 1)
        ramp = ((pair - low) / ((high - low) or 0.001)).clamp(0, 1)  # 0: keep the frequency, 1: divide by factor
        scaled = (1 - ramp) * inverse_frequencies + ramp * inverse_frequencies / factor

        def magnitude(scale, multiplier=1.0):
            return 1.0 if scale <= 1 else 0.1 * multiplier * math.log(scale) + 1.0

        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
            attention_factor = (magnitude(factor, mscale) / magnitude(factor, mscale_all_dim)
                                if mscale and mscale_all_dim else magnitude(factor))
        return scaled, float(attention_factor)
    raise ValueError(f"rope scaling type must be default, linear, llama3 or yarn, got {kind!r}")


def reference_rope(x, positions, inverse_frequencies, attention_factor=1.0, interleaved=False):
    """`x` `(B, H, T, D)` at `positions` `(T,)` rotated in float64, times `attention_factor`.

    The first `2 * len(inverse_frequencies)` features rotate (the rest, if any, pass unchanged: partial
    rotary embeddings). Pairs are `(i, i + R/2)` of those `R` features (the rotate-half layout of GPT-NeoX,
    Llama and transformers) or, with `interleaved`, `(2i, 2i + 1)` (the paper's and Meta's original layout).
    """
    x = x.to(torch.float64)
    rotary_dim = 2 * inverse_frequencies.shape[0]
    angles = positions.to(torch.float64)[:, None] * inverse_frequencies.to(torch.float64)[None, :]  # (T, R/2)
    cos, sin = torch.cos(angles) * attention_factor, torch.sin(angles) * attention_factor
    rotary, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        first, second = rotary[..., 0::2], rotary[..., 1::2]
    else:
        first, second = rotary[..., : rotary_dim // 2], rotary[..., rotary_dim // 2:]
    turned_first, turned_second = first * cos - second * sin, second * cos + first * sin
    if interleaved:
        rotated = torch.stack([turned_first, turned_second], dim=-1).flatten(-2)  # (.., R): pairs back in place
    else:
        rotated = torch.cat([turned_first, turned_second], dim=-1)
    return torch.cat([rotated, rest], dim=-1)  # the features past rotary_dim pass unchanged


def reference_alibi_slopes(num_heads):
    """ALiBi slopes from the paper (Press et al., 2022, https://arxiv.org/abs/2108.12409).

    For a power of two n: the geometric sequence starting at `2 ** (-8 / n)` with that ratio. Otherwise
    the slopes of the closest smaller power of two, then every other slope of twice that power.
    """
    def power_of_two_slopes(n):
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two_slopes(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two_slopes(closest) + power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]


def canonical_weights(d_in, d_out, seed):
    """Canonical weights drawn as `nn.Linear` would (uniform in ±1/sqrt(fan_in)) from `seed`, float32 on CPU.

    The shared weights of the benchmark and the pages: every implementation loads the same tensors.
    """
    generator = torch.Generator().manual_seed(seed)
    shapes = {"query.weight": (d_out, d_in), "key.weight": (d_out, d_in), "value.weight": (d_out, d_in),
              "out.weight": (d_out, d_out), "out.bias": (d_out,)}  # fan_in: the last dimension
    return {name: (torch.rand(*shape, generator=generator) * 2 - 1) * (1 / math.sqrt(shape[-1]))
            for name, shape in shapes.items()}


def randomised_parameters(module, seed):
    """`module` with every parameter drawn from `seed`: weights as `nn.Linear` draws them (uniform in
    ±1/sqrt(fan_in)), norm weights and sinks uniform in ±1. The benchmark's layers of `attention.models`."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            bound = 1 / math.sqrt(parameter.shape[-1]) if parameter.dim() > 1 else 1.0
            parameter.copy_((torch.rand(parameter.shape, generator=generator) * 2 - 1) * bound)
    return module


def kv_heads_state(state, num_heads, num_kv_heads):
    """`state` for a module with `num_kv_heads` K/V heads: the first `num_kv_heads` heads' rows of `key.*` and
    `value.*` (all of them, so the very same tensors, for multi-head classes)."""
    kv_rows = num_kv_heads * (state["query.weight"].shape[0] // num_heads)
    return {name: tensor[:kv_rows] if name.startswith(("key.", "value.")) else tensor for name, tensor in state.items()}


def expand_kv_heads(state, num_heads):
    """`state` with grouped-query K/V weights repeated into one K/V head per query head.

    Grouped-query attention shares K/V head `g` among the query heads `g * group .. (g + 1) * group - 1`
    (`group = num_heads // num_kv_heads`, read off `key.weight`'s rows), which is multi-head attention
    with K/V head `g`'s rows repeated `group` times. Differentiable: gradients of the repeated rows sum
    back into the shared ones. A multi-head state comes back as it is.
    """
    d_out = state["query.weight"].shape[0]
    head_dim = d_out // num_heads
    num_kv_heads = state["key.weight"].shape[0] // head_dim
    if num_kv_heads * head_dim != state["key.weight"].shape[0] or num_heads % num_kv_heads != 0:
        raise ValueError(f"key.weight has {state['key.weight'].shape[0]} rows: not a divisor of num_heads={num_heads} "
                         f"heads of head_dim={head_dim}")
    if num_kv_heads == num_heads:
        return state
    group = num_heads // num_kv_heads
    expanded = dict(state)
    for name in ("key.weight", "value.weight", "key.bias", "value.bias"):
        if name in state:
            tensor = state[name]
            heads = tensor.reshape(num_kv_heads, head_dim, *tensor.shape[1:])  # (H_kv, D, ...)
            expanded[name] = heads.repeat_interleave(group, dim=0).reshape(d_out, *tensor.shape[1:])  # (H*D, ...)
    return expanded


def reference_causal_self_attention(x, state, num_heads, position_encoding=None):
    """Causal self-attention of `x` `(B, T, d_in)` in float64, with optional ALiBi or RoPE.

    `position_encoding` is None, `"alibi"` (causal bias `-m_h * (i - j)` for keys j <= query i) or
    `"rope"` (rotary embeddings with base 10000 on queries and keys). Grouped-query weights (`key.weight`
    with fewer rows than `query.weight`) are expanded by `expand_kv_heads`. Returns `(out, weights)`.
    """
    state = expand_kv_heads(state, num_heads)
    T = x.shape[1]
    positions = torch.arange(T)
    causal_mask = positions[:, None] >= positions[None, :]  # (T, T), True = attend
    attn_bias, rope_base = None, None
    if position_encoding == "alibi":
        slopes = torch.tensor(reference_alibi_slopes(num_heads), dtype=torch.float64)  # (H,)
        distance = (positions[:, None] - positions[None, :]).to(torch.float64)  # (T, T): i - j
        attn_bias = -slopes[:, None, None] * distance  # (H, T, T); entries with j > i are masked anyway
    elif position_encoding == "rope":
        rope_base = 10000.0
    elif position_encoding is not None:
        raise ValueError(f"position_encoding must be None, 'alibi' or 'rope', got {position_encoding!r}")
    return reference_attention(x, x, x, state, num_heads, mask=causal_mask, attn_bias=attn_bias, rope_base=rope_base)


# ---------------------------------------------------------------------------------------------------------
# The reference as a causal self-attention module (appended for attention/gpt: a whole model in float64)
# ---------------------------------------------------------------------------------------------------------


class ReferenceCausalSelfAttention(torch.nn.Module):
    """`reference_causal_self_attention` as a module of the causal family, in float64.

    The family's constructor (`attention.causal.CausalSelfAttention`, plus the grouped-query keyword
    `num_kv_heads`) and canonical state dict; its parameters are the canonical weights themselves, in
    float64. `forward(x)` `(B, T, d_in)` -> `(B, T, d_out)` float64, and keeps the attention weights
    `(B, H, T, T)` of the call in `attn_weights`. Dropped into a model in place of an implementation (a
    model in float64: `attention.gpt`), it gives the model's float64 reference. For RoPE or ALiBi, take
    `reference_attention_class(position_encoding)`.
    """

    position_encoding = None

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, *, num_kv_heads=None):
        super().__init__()
        if dropout != 0:
            raise ValueError(f"the reference has no dropout: dropout must be 0.0, got dropout={dropout}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        kv_dim = num_kv_heads * (d_out // num_heads)
        self.num_heads, self.context_length = num_heads, context_length
        linear = dict(dtype=torch.float64)
        self.query = torch.nn.Linear(d_in, d_out, bias=qkv_bias, **linear)
        self.key = torch.nn.Linear(d_in, kv_dim, bias=qkv_bias, **linear)
        self.value = torch.nn.Linear(d_in, kv_dim, bias=qkv_bias, **linear)
        self.out = torch.nn.Linear(d_out, d_out, **linear)
        self.attn_weights = None

    def forward(self, x):
        out, self.attn_weights = reference_causal_self_attention(x, self.state_dict(), self.num_heads, self.position_encoding)
        return out  # (B, T, d_out) float64

    def canonical_state_dict(self):
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    def load_canonical_state_dict(self, state):
        """Load canonical weights (any float dtype, kept in float64); `ValueError` naming missing, unexpected or
        misshapen keys."""
        expected = {name: tuple(tensor.shape) for name, tensor in self.state_dict().items()}
        wrong = sorted(set(expected) ^ set(state)) + sorted(
            f"{name} {tuple(state[name].shape)} (expected {shape})" for name, shape in expected.items()
            if name in state and tuple(state[name].shape) != shape)
        if wrong:
            raise ValueError(f"canonical state dict does not fit the reference module: {', '.join(wrong)}")
        self.load_state_dict({name: tensor.to(torch.float64) for name, tensor in state.items()})


def reference_attention_class(position_encoding=None):
    """`ReferenceCausalSelfAttention`, or its subclass applying `"rope"` or `"alibi"` like the classes that do."""
    if position_encoding is None:
        return ReferenceCausalSelfAttention
    if position_encoding not in ("rope", "alibi"):
        raise ValueError(f"position_encoding must be None, 'alibi' or 'rope', got {position_encoding!r}")
    return type(f"Reference{position_encoding.title()}CausalSelfAttention", (ReferenceCausalSelfAttention,),
                {"position_encoding": position_encoding})


# ======================================================================================================
# The model families (attention/models/): QK-norm, and one attention layer as current open models run it
# ======================================================================================================


def reference_rms_norm(x, weight=None, eps=1e-6, offset=0.0):
    """RMSNorm over the last dimension in float64: `x / sqrt(mean(x²) + eps) * (offset + weight)`.

    `offset` is 0 for Llama-style weights (Qwen3, OLMo 2) and 1 for Gemma's, which store `scale - 1`; `weight`
    None multiplies by nothing (Llama 4's "L2 norm" of queries and keys is this, with no weight).
    """
    x = x.to(torch.float64)
    normed = x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed if weight is None else normed * (offset + weight.to(torch.float64))


def reference_model_attention(x, state, *, head_dim, scale, rope=None, interleaved=False, qk_norm=None, norm_eps=1e-6,
                              norm_offset=0.0, window=None, chunk=None, softcap=None, query_temperature=None,
                              past_keys=None, past_values=None):
    """One causal self-attention layer of a current open model over positions `0 .. T-1`, in float64.

    Written from the models' papers, not from their code: project, normalise, rotate, mask, attend
    (`reference_kernel`), project back. `attention/models/` is tested against it.

    Args:
        x: `(B, T, hidden)`.
        state: transformers' parameter names: `q_proj.weight` `(H * D, hidden)`, `k_proj.weight` and
            `v_proj.weight` `(H_kv * D, hidden)`, `o_proj.weight` `(hidden, H * D)`, and each one's `.bias` where
            the model has it; `q_norm.weight`, `k_norm.weight` for a `qk_norm` with weights; `sinks` `(H,)`
            for learned sinks (gpt-oss).
        head_dim: D; the head counts H and H_kv follow from the weights' rows.
        scale, softcap: as in `reference_kernel`.
        rope: `(inverse_frequencies, attention_factor)` from `rope_frequencies`, or None: no rotation (NoPE).
        interleaved: RoPE pairs `(2i, 2i + 1)` (Meta's layout, Llama 4) instead of `(i, i + D/2)` (`reference_rope`).
        qk_norm: None; `"head"`: an RMSNorm of each query and key head over `head_dim`, before RoPE (Qwen3,
            Gemma 3); `"projection"`: an RMSNorm over the whole query and the whole key projection, before RoPE
            (OLMo 2); `"l2"`: an RMSNorm without weight of each head, after RoPE (Llama 4).
        norm_eps, norm_offset: the norms' epsilon and weight offset (`reference_rms_norm`).
        window: query i attends to keys `i - window < j <= i` (a sliding-window layer); None: every `j <= i`.
        chunk: query i attends to keys `j <= i` of its own chunk, `j // chunk == i // chunk` (Llama 4's local layers).
        query_temperature: `(T,)` factors multiplying each position's query (Llama 4's NoPE layers), or None.
        past_keys, past_values: `(B, H_kv, L, D)`, positions `0 .. L - 1` as a KV cache holds them (keys
            normalised and rotated), or None: `x` then continues at positions `L .. L + T - 1` and attends to
            them too (one decoding call, checked against what its cache holds).

    Returns:
        `(out, weights)`: `(B, T, hidden)` and `(B, H, T, L + T)`, both float64.
    """
    f64 = {name: tensor.to(torch.float64) for name, tensor in state.items()}
    x = x.to(torch.float64)
    B, T, _ = x.shape

    def project(inputs, name):
        y = inputs @ f64[f"{name}.weight"].T
        return y + f64[f"{name}.bias"] if f"{name}.bias" in f64 else y

    def heads(y):  # (B, T, heads * D) -> (B, heads, T, D)
        return y.reshape(B, T, -1, head_dim).transpose(1, 2)

    q, k, v = project(x, "q_proj"), project(x, "k_proj"), project(x, "v_proj")
    if qk_norm == "projection":
        q = reference_rms_norm(q, f64["q_norm.weight"], norm_eps, norm_offset)
        k = reference_rms_norm(k, f64["k_norm.weight"], norm_eps, norm_offset)
    q, k, v = heads(q), heads(k), heads(v)
    if qk_norm == "head":
        q = reference_rms_norm(q, f64["q_norm.weight"], norm_eps, norm_offset)
        k = reference_rms_norm(k, f64["k_norm.weight"], norm_eps, norm_offset)
    past = 0 if past_keys is None else past_keys.shape[2]
    positions = torch.arange(past, past + T)
    if rope is not None:
        inverse_frequencies, attention_factor = rope
        q = reference_rope(q, positions, inverse_frequencies, attention_factor, interleaved)
        k = reference_rope(k, positions, inverse_frequencies, attention_factor, interleaved)
    if qk_norm == "l2":
        q, k = reference_rms_norm(q, None, norm_eps), reference_rms_norm(k, None, norm_eps)
    elif qk_norm not in (None, "head", "projection"):
        raise ValueError(f"qk_norm must be None, 'head', 'projection' or 'l2', got {qk_norm!r}")
    if query_temperature is not None:
        q = q * query_temperature.to(torch.float64).view(1, 1, T, 1)
    if past_keys is not None:  # the cached positions first
        k = torch.cat([past_keys.to(torch.float64), k], dim=2)  # (B, H_kv, L + T, D)
        v = torch.cat([past_values.to(torch.float64), v], dim=2)
    key_positions = torch.arange(past + T)
    distance = positions[:, None] - key_positions[None, :]  # (T, L + T): query i - key j
    mask = distance >= 0
    if window is not None:
        mask = mask & (distance < window)
    if chunk is not None:
        mask = mask & (positions[:, None] // chunk == key_positions[None, :] // chunk)
    attn_output, weights = reference_kernel(q, k, v, mask, scale=scale, softcap=softcap, sinks=f64.get("sinks"))
    attn_output = attn_output.transpose(1, 2).reshape(B, T, -1)  # (B, T, H * D)
    return project(attn_output, "o_proj"), weights


def model_reference_kwargs(config, layer_idx, positions, family=None):
    """`reference_model_attention`'s keywords for layer `layer_idx` of the model `config` describes, its queries at
    `positions` `(T,)`: read from the configuration (a mapping, or an object, with transformers' field names), never
    from the layer under test, so a layer that reads its configuration wrongly (its scale, window, chunk, soft-cap,
    norm epsilon, RoPE frequencies) differs from the reference.

    Each field means what the model's paper and config.json say (the docstrings of `attention.models`' files link
    them): the layer's kind from `layer_types`, or the model's rule where the config lists none (Mistral: a window
    on every layer where one is set; Qwen2/3: from `max_window_layers` on, where `use_sliding_window`; Gemma 2 and
    gpt-oss: even layers local; Gemma 3: all but every `sliding_window_pattern`-th local; Llama 4: the RoPE layers
    chunked, every `no_rope_layer_interval`-th without RoPE); Gemma's scale `query_pre_attn_scalar ** -0.5`, else
    `head_dim ** -0.5`; Gemma 2's soft-cap (Gemma 3 keeps the field and never applies it); RoPE from
    `rope_parameters` (per layer kind where it holds one dict per kind) or `rope_theta` and `rope_scaling` (Gemma 3's
    local layers: `rope_local_base_freq`); Llama 4's L2 norm on its RoPE layers where `use_qk_norm`, and its NoPE
    layers' query temperature.

    `family`: the class of `attention.models` whose layer this is, for what its family declares and no configuration
    field tells, as plain class attributes: `qk_norm` (None, `"head"`, `"projection"` or `"l2"`), `norm_offset` (Gemma's
    norm weights store `scale - 1`: 1.0) and `rope_interleaved` (Llama 4's pairs `(2i, 2i + 1)`).
    """
    def field(name, default=None):
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        return default if value is None else value

    model_type = field("model_type", "llama")
    head_dim = field("head_dim") or field("hidden_size") // field("num_attention_heads")
    no_rope_interval = field("no_rope_layer_interval", 4)
    rotates = (bool(field("no_rope_layers")[layer_idx]) if field("no_rope_layers")  # Llama 4's flags: 1 = RoPE
               else model_type != "llama4_text" or (layer_idx + 1) % no_rope_interval != 0)
    if field("layer_types"):
        kind = field("layer_types")[layer_idx]
    elif model_type == "mistral":
        kind = "sliding_attention" if field("sliding_window") else "full_attention"
    elif model_type in ("qwen2", "qwen3"):
        sliding = field("use_sliding_window", False) and field("sliding_window")
        kind = "sliding_attention" if sliding and layer_idx >= field("max_window_layers") else "full_attention"
    elif model_type in ("gemma2", "gpt_oss"):
        kind = "sliding_attention" if layer_idx % 2 == 0 else "full_attention"
    elif model_type == "gemma3_text":
        kind = "sliding_attention" if (layer_idx + 1) % field("sliding_window_pattern", 6) else "full_attention"
    elif model_type == "llama4_text":
        kind = "chunked_attention" if rotates and field("attention_chunk_size") else "full_attention"
    else:
        kind = "full_attention"
    rope = None
    if rotates:
        parameters = field("rope_parameters")
        if parameters is None and model_type == "gemma3_text" and kind == "sliding_attention":
            parameters = {"rope_theta": field("rope_local_base_freq", 10_000.0)}
        elif parameters is None:
            parameters = {**field("rope_scaling", {}), "rope_theta": field("rope_theta", 1_000_000.0 if model_type ==
                                                                           "gemma3_text" else None)}
        elif kind in parameters:  # one dict per kind of layer (Gemma 3 in transformers 5)
            parameters = parameters[kind]
        rope = rope_frequencies(head_dim, parameters)
    qk_norm = getattr(family, "qk_norm", None)
    if model_type == "llama4_text" and not (rotates and field("use_qk_norm", True)):
        qk_norm = None
    temperature = None
    if model_type == "llama4_text" and not rotates and field("attn_temperature_tuning", True):  # arXiv 2501.19399
        temperature = (torch.log1p(torch.floor((positions.to(torch.float64) + 1) / field("floor_scale", 8192)))
                       * field("attn_scale", 0.1) + 1)
    scale = (field("query_pre_attn_scalar") if model_type in ("gemma2", "gemma3_text") else head_dim) ** -0.5
    return dict(head_dim=head_dim, scale=scale, rope=rope, interleaved=getattr(family, "rope_interleaved", False),
                qk_norm=qk_norm, norm_eps=field("rms_norm_eps", 1e-6), norm_offset=getattr(family, "norm_offset", 0.0),
                window=field("sliding_window") if kind == "sliding_attention" else None,
                chunk=field("attention_chunk_size") if kind == "chunked_attention" else None,
                softcap=field("attn_logit_softcapping") if model_type == "gemma2" else None, query_temperature=temperature)


# ---------------------------------------------------------------------------------------------------
# Multi-head latent attention
# ---------------------------------------------------------------------------------------------------


def reference_latent_attention(x, state, num_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rope_theta=10000.0,
                               rope_scaling=None, rope_interleave=True, norm_eps=1e-6, past_latent=None,
                               past_rope_keys=None, selected=None):
    """Causal multi-head latent attention of `x` `(B, T, C)` in float64, from the equations of DeepSeek-V2
    (https://arxiv.org/abs/2405.04434, section 2.1, equations 9-19).

    `state` holds transformers' parameters (`attention.models.deepseek_v3.DeepseekV3Attention`'s):
    `q_proj.weight`, or `q_a_proj.*`, `q_a_layernorm.weight`, `q_b_proj.weight`; `kv_a_proj_with_mqa.*`,
    `kv_a_layernorm.weight`, `kv_b_proj.weight`, `o_proj.*`. The released models add to the paper's
    equations an RMS norm (eps `norm_eps`) on the compressed query `c^Q` and on the latent `c^KV`, and,
    with YaRN, the score scale `mscale²` at `mscale_all_dim` and the rotary attention factor. Pairs
    `(2i, 2i + 1)` rotate when `rope_interleave`, else `(i, i + Dr/2)`.

    `past_latent` `(B, L, Dc)` and `past_rope_keys` `(B, L, Dr)` (normalised latents and rotated keys, as a
    `LatentCache` holds them), if given, are positions `0 .. L - 1`: `x` continues at positions
    `L .. L + T - 1`, and its token `i` attends to positions `0 .. L + i` (one decoding call, checked
    against what its cache holds).

    `selected`, if given, is a boolean `(B, T, L + T)`: query `i` attends only to the positions it marks (and never
    past its own position): DeepSeek-V3.2's sparse attention, with `reference_indexer_selection`'s choice.

    Returns:
        `(out, weights)`: `(B, T, C)` and `(B, H, T, L + T)`, both float64.
    """
    f64 = {name: tensor.to(torch.float64) for name, tensor in state.items()}
    x = x.to(torch.float64)
    B, T, _ = x.shape
    H, Dn, Dr, Dv = num_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    Dc = f64["kv_a_layernorm.weight"].shape[0]
    L = 0 if past_latent is None else past_latent.shape[1]

    def linear(inputs, name):
        y = inputs @ f64[f"{name}.weight"].T
        return y + f64[f"{name}.bias"] if f"{name}.bias" in f64 else y

    def rms_norm(inputs, name):
        return inputs / torch.sqrt(inputs.pow(2).mean(-1, keepdim=True) + norm_eps) * f64[f"{name}.weight"]

    # Queries, eqs. 12-14: c^Q = W^DQ h (normalised), then q^C = W^UQ c^Q and q^R = W^QR c^Q, one matrix for
    # both, head by head. DeepSeek-V2-Lite projects the queries from h directly (q_proj).
    if "q_proj.weight" in f64:
        queries = linear(x, "q_proj")
    else:
        queries = linear(rms_norm(linear(x, "q_a_proj"), "q_a_layernorm"), "q_b_proj")
    queries = queries.reshape(B, T, H, Dn + Dr).permute(0, 2, 1, 3)  # (B, H, T, Dn + Dr)
    q_content, q_rope = queries[..., :Dn], queries[..., Dn:]
    # Keys and values, eqs. 9-11 and 15: c^KV = W^DKV h (normalised) and k^R = W^KR h, one matrix for both;
    # k^C = W^UK c^KV and v^C = W^UV c^KV, one matrix for both, head by head.
    compressed = linear(x, "kv_a_proj_with_mqa")  # (B, T, Dc + Dr)
    latent = rms_norm(compressed[..., :Dc], "kv_a_layernorm")  # (B, T, Dc): c^KV
    k_rope = compressed[..., Dc:].unsqueeze(1)  # (B, 1, T, Dr): one rotary key for all heads
    inverse_frequencies, attention_factor = rope_frequencies(Dr, {**(rope_scaling or {}), "rope_theta": rope_theta})
    positions = torch.arange(L, L + T)
    q_rope = reference_rope(q_rope, positions, inverse_frequencies, attention_factor, rope_interleave)  # RoPE, eq. 14
    k_rope = reference_rope(k_rope, positions, inverse_frequencies, attention_factor, rope_interleave)  # RoPE, eq. 15
    if past_latent is not None:  # the cached positions first
        latent = torch.cat([past_latent.to(torch.float64), latent], dim=1)  # (B, L + T, Dc)
        k_rope = torch.cat([past_rope_keys.to(torch.float64).unsqueeze(1), k_rope], dim=2)  # (B, 1, L + T, Dr)
    S = L + T
    up = (latent @ f64["kv_b_proj.weight"].T).reshape(B, S, H, Dn + Dv).permute(0, 2, 1, 3)  # (B, H, S, Dn + Dv)
    k_content, v_content = up[..., :Dn], up[..., Dn:]
    # Eqs. 16-17: q_{t,i} = [q^C_{t,i}; q^R_{t,i}], k_{t,i} = [k^C_{t,i}; k^R_t].
    q = torch.cat([q_content, q_rope], dim=-1)  # (B, H, T, Dn + Dr)
    k = torch.cat([k_content, k_rope.expand(B, H, S, Dr)], dim=-1)  # (B, H, S, Dn + Dr)
    # Eq. 18: softmax(q k / sqrt(Dn + Dr)) v^C over the positions j <= t, with YaRN's mscale² where configured.
    scale = 1 / math.sqrt(Dn + Dr)
    kind = "default" if not rope_scaling else rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind != "default" and rope_scaling.get("mscale_all_dim") and rope_scaling["factor"] > 1:
        scale *= (0.1 * rope_scaling["mscale_all_dim"] * math.log(rope_scaling["factor"]) + 1) ** 2
    causal_mask = positions[:, None] >= torch.arange(S)[None, :]  # (T, S), True = attend
    if selected is not None:
        causal_mask = causal_mask & selected.unsqueeze(1)  # (B, 1, T, S)
    attn_output, weights = reference_kernel(q, k, v_content, mask=causal_mask, scale=scale)  # (B, H, T, Dv)
    attn_output = attn_output.permute(0, 2, 1, 3).reshape(B, T, H * Dv)  # eq. 19: [o_1; ...; o_H]
    return linear(attn_output, "o_proj"), weights


def reference_indexer_selection(x, state, index_n_heads, index_head_dim, index_topk, qk_rope_head_dim,
                                rope_theta=10000.0, rope_scaling=None, norm_eps=1e-6):
    """The positions DeepSeek-V3.2's lightning indexer picks for each query of `x` `(B, T, C)`, in float64, query by
    query: a boolean `(B, T, T)`, True where query `t` keeps position `s` (DeepSeek-V3.2-Exp's report,
    https://github.com/deepseek-ai/DeepSeek-V3.2-Exp, eq. 1, and its `inference/model.py`).

    `state` holds the layer's parameters (transformers' names): the compressed query `c^Q`
    (`q_a_proj.*`, `q_a_layernorm.weight`, eps `norm_eps`), and the indexer's `indexer.wq_b.weight` (`c^Q` to
    `index_n_heads` queries of `index_head_dim`), `indexer.wk.weight` and its LayerNorm `indexer.k_norm.*` (eps 1e-6;
    one key per position, shared by the indexer's heads), `indexer.weights_proj.weight` (each head's weight, per query).
    The first `qk_rope_head_dim` features of the indexer's queries and keys rotate in pairs `(i, i + R/2)` (not
    interleaved as MLA's own rotary features), at the frequencies and attention factor of the layer's RoPE.

    Query `t`'s score of position `s <= t`: `I(t, s) = sum_j w(t, j) / sqrt(index_n_heads) * ReLU(q(t, j) . k(s) /
    sqrt(index_head_dim))`. The `index_topk` highest-scoring positions are kept (every position `s <= t` where there
    are no more than that); ties go to the earlier position.
    """
    f64 = {name: tensor.to(torch.float64) for name, tensor in state.items()}
    x = x.to(torch.float64)
    B, T, _ = x.shape
    Hi, Di, Dr = index_n_heads, index_head_dim, qk_rope_head_dim

    def linear(inputs, name):
        y = inputs @ f64[f"{name}.weight"].T
        return y + f64[f"{name}.bias"] if f"{name}.bias" in f64 else y

    compressed = linear(x, "q_a_proj")
    compressed = compressed / torch.sqrt(compressed.pow(2).mean(-1, keepdim=True) + norm_eps) * f64["q_a_layernorm.weight"]
    queries = linear(compressed, "indexer.wq_b").reshape(B, T, Hi, Di).permute(0, 2, 1, 3)  # (B, Hi, T, Di)
    keys = linear(x, "indexer.wk")  # (B, T, Di)
    keys = (keys - keys.mean(-1, keepdim=True)) / torch.sqrt(keys.var(-1, unbiased=False, keepdim=True) + 1e-6)
    keys = (keys * f64["indexer.k_norm.weight"] + f64["indexer.k_norm.bias"]).unsqueeze(1)  # (B, 1, T, Di)
    inverse_frequencies, attention_factor = rope_frequencies(Dr, {**(rope_scaling or {}), "rope_theta": rope_theta})
    positions = torch.arange(T)
    queries = reference_rope(queries, positions, inverse_frequencies, attention_factor, interleaved=False)
    keys = reference_rope(keys, positions, inverse_frequencies, attention_factor, interleaved=False)[:, 0]  # (B, T, Di)
    weights = linear(x, "indexer.weights_proj") / math.sqrt(Hi)  # (B, T, Hi)
    selected = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            scores = []
            for s in range(t + 1):
                per_head = [torch.relu(queries[b, j, t] @ keys[b, s] / math.sqrt(Di)) for j in range(Hi)]
                scores.append(sum(weights[b, t, j] * per_head[j] for j in range(Hi)).item())
            for s in sorted(range(t + 1), key=lambda s: -scores[s])[:index_topk]:  # stable: earlier wins a tie
                selected[b, t, s] = True
    return selected


def reference_delta_rule(q, k, v, g=None, beta=None, *, scale=None, initial_state=None):
    """The (gated) delta rule by its definition, position by position in float64 (DeltaNet, Schlag et al. 2021;
    gated DeltaNet, Yang et al. 2024; Kimi delta attention, 2025): per head, a state `S` `(Dk, Dv)`,

        S' = diag(exp(g_t)) S,    S_t = S' + k_t (beta_t (v_t - S'ᵀ k_t))ᵀ,    o_t = S_tᵀ (scale q_t)

    q, k `(B, H, T, Dk)`, v `(B, H, T, Dv)`; `g` the log-decay, `(B, H, T)` (one per head: gated DeltaNet) or
    `(B, H, T, Dk)` (one per key channel: KDA), None for none (DeltaNet); `beta` `(B, H, T)`, None for 1; `scale`
    default `1 / sqrt(Dk)`. Returns `(out (B, H, T, Dv), final_state (B, H, Dk, Dv))`, float64.
    """
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    B, H, T, Dk = q.shape
    scale = 1 / math.sqrt(Dk) if scale is None else scale
    state = (torch.zeros(B, H, Dk, v.shape[-1], dtype=torch.float64, device=q.device) if initial_state is None
             else initial_state.to(torch.float64))
    outs = []
    for t in range(T):
        if g is not None:
            decay = g[:, :, t].to(torch.float64).exp()  # (B, H) or (B, H, Dk)
            state = state * (decay[..., None, None] if decay.dim() == 2 else decay[..., :, None])
        written = 1.0 if beta is None else beta[:, :, t].to(torch.float64)[..., None]  # (B, H, 1)
        recalled = (k[:, :, t, :, None] * state).sum(dim=-2)  # (B, H, Dv): what the state returns for k_t
        state = state + k[:, :, t, :, None] * (written * (v[:, :, t] - recalled))[..., None, :]
        outs.append((q[:, :, t, :, None] * scale * state).sum(dim=-2))  # (B, H, Dv)
    return torch.stack(outs, dim=2), state
