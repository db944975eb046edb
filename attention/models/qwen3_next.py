"""The layers of Qwen3-Next, as transformers runs them: three gated DeltaNet layers to every softmax layer.

Qwen3-Next (https://qwen.ai/blog?id=4074c4f1ebb5e36e4c9cafb6fcabc3c4d5bbb8d4, and Qwen3.5 after it) replaces three of
every four attention layers (`full_attention_interval` 4) with a linear one whose state has a fixed size per
head: `Qwen3NextGatedDeltaNet`, the gated delta rule of `attention/linear/gated_delta.py`. What the layer adds around
the rule, each step commented below:

* one fused projection `in_proj_qkvz` for the queries, keys, values and the output gate `z`, laid out per key head
  (each key head's query, key, then the values and gates of the value heads it serves), and `in_proj_ba` for each
  value head's write strength `beta = sigmoid(b)` and its decay `g = -exp(A_log) * softplus(a + dt_bias)` (Mamba-2's
  discretisation: `g <= 0`, a decay in (0, 1]);
* a short causal depthwise convolution (`conv1d`, `linear_conv_kernel_dim` 4 taps, then SiLU) over the queries,
  keys and values, so each sees the last few positions: its last `kernel - 1` inputs are the second state a decoder
  keeps;
* q and k L2-normalised per head, the query and key heads repeated to the value heads (16 key heads, 32 value heads
  in the 80B model), the rule run in float32 at least, and the output through an RMSNorm gated by `SiLU(z)`.

The fourth layers are softmax attention with two changes from Qwen3's (`attention/models/qwen3.py`): `q_proj` also
returns a gate per query feature, and the output is multiplied by `sigmoid(gate)` before `o_proj`; RoPE turns only
the first `partial_rotary_factor` (0.25) of each head's features. Their q/k norms multiply by `1 + weight`.

`MODELS["qwen3_next"].from_config(config, layer_idx)` builds either kind (`layer_type` `"linear_attention"` or
`"full_attention"`). The contract: `attention.models.ModelAttention`; a linear layer's `new_cache` holds its states
(`attention.decoding.RecurrentStateCache`: the recurrent state and the convolution's last inputs), the same size at every context. This
file imports only torch, the decoding family and the gated delta rule (`attention/linear/`); its helpers are marked
copies of `llama.py`'s.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from attention.decoding import KVCache, RecurrentStateCache, SlidingWindowKVCache, cached_attention, check_decode_kernel
from attention.linear.checks import FORMS  # how a linear layer may run its rule
from attention.linear.gated_delta import gated_delta_rule

REQUIRED = object()  # `config_value`'s default: the field must be present
LAYER_TYPES = ("linear_attention", "full_attention")  # the kinds of layer `layer_types` may list


class Qwen3NextAttention(nn.Module):
    """Qwen3-Next's softmax attention layer (one in `full_attention_interval`): `(B, T, hidden_size) -> (B, T,
    hidden_size)`.

    The parameters of transformers' `Qwen3NextAttention`: `q_proj` (`2 * H * D` outputs: each head's query, then its
    gate), `k_proj`, `v_proj`, `o_proj` (biases where `attention_bias`), `q_norm.weight`, `k_norm.weight` `(D,)`.
    `from_config` builds a `Qwen3NextGatedDeltaNet` for a linear layer. Over a cache, `decode_kernel` (`"auto"`,
    `"sdpa"` or `"matmul"`) as `Qwen3Attention`.
    """

    MODEL_TYPES = ("qwen3_next",)
    LAYER_TYPES = LAYER_TYPES
    qk_norm = "head"  # an RMSNorm over each query and key head, before RoPE
    norm_offset = 1.0  # the norms multiply by `1 + weight`

    def __init__(self, config, layer_idx, *, decode_kernel="auto"):
        super().__init__()
        self.decode_kernel = check_decode_kernel(decode_kernel)  # over a cache: attention.decoding.DECODE_KERNELS
        check_model_type(config, self.MODEL_TYPES)
        self.layer_idx = check_layer_idx(config, layer_idx)
        self.layer_type = qwen3_next_layer_type(config, self.layer_idx)
        if self.layer_type != "full_attention":
            raise ValueError(f"layer {layer_idx} is a {self.layer_type} layer: build it with "
                             "Qwen3NextAttention.from_config (or Qwen3NextGatedDeltaNet)")
        self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim = head_sizes(config)
        check_no_dropout(config)
        self.scaling = self.head_dim**-0.5
        self.sliding_window = None  # every softmax layer of Qwen3-Next attends to the whole past

        H, H_kv, D = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        bias = config_value(config, "attention_bias", False)
        self.q_proj = nn.Linear(self.hidden_size, H * D * 2, bias=bias)  # per head: D query features, then D gates
        self.k_proj = nn.Linear(self.hidden_size, H_kv * D, bias=bias)
        self.v_proj = nn.Linear(self.hidden_size, H_kv * D, bias=bias)
        self.o_proj = nn.Linear(H * D, self.hidden_size, bias=bias)
        rms_norm_eps = config_value(config, "rms_norm_eps")
        check_finite("rms_norm_eps", rms_norm_eps)
        self.q_norm = Qwen3NextRMSNorm(D, rms_norm_eps)
        self.k_norm = Qwen3NextRMSNorm(D, rms_norm_eps)

        self.rope_parameters = rope_parameters(config, self.layer_type)
        self.rotary_dim = rotary_dim(config, self.rope_parameters, D)  # the first features of a head RoPE turns
        self.inv_freq, self.attention_scaling = rope_frequencies(self.rotary_dim, self.rope_parameters)
        self.rope_tables = {}

    @classmethod
    def from_config(cls, config, layer_idx, **options):
        """Layer `layer_idx` of the model configured by `config`: this class on a `"full_attention"` layer (`options`:
        `decode_kernel`), `Qwen3NextGatedDeltaNet` on a `"linear_attention"` one (`options`: `form`, `chunk_size`)."""
        check_layer_idx(config, layer_idx)
        if qwen3_next_layer_type(config, layer_idx) == "linear_attention":
            return Qwen3NextGatedDeltaNet(config, layer_idx, **options)
        return cls(config, layer_idx, **options)

    def forward(self, x, cache=None):
        """`x` `(B, T, hidden_size)` -> `(B, T, hidden_size)`; with `cache`, `x` continues the cached sequence."""
        check_input(x, self.hidden_size, self.o_proj.weight.dtype)
        B, T, C = x.shape
        start = 0 if cache is None else check_cache(self, cache, x)  # the position of x's first token
        q, gate = self.q_proj(x).view(B, T, -1, 2 * self.head_dim).chunk(2, dim=-1)  # (B, T, H, D) each
        q = self.q_norm(q).transpose(1, 2)  # (B, H, T, D)
        k = self.k_norm(self.k_proj(x).view(B, T, -1, self.head_dim)).transpose(1, 2)  # (B, H_kv, T, D)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H_kv, T, D)
        cos, sin = rotary_cos_sin(self, start, T, x)  # (T, rotary_dim) each
        q, k = partial_rotary(q, cos, sin), partial_rotary(k, cos, sin)  # the first rotary_dim features turn
        if cache is None:
            keys, values, mask = k, v, None  # mask None: causal
        else:
            keys, values, mask = cache.update(k, v)  # (B, H_kv, S, D) each; mask (T, S) or None
        attn_output = cached_attention(q, keys, values, mask, self.scaling, self.decode_kernel,
                                       over_cache=cache is not None)  # (B, H, T, D)
        attn_output = attn_output.transpose(1, 2).reshape(B, T, -1)  # (B, T, H*D)
        attn_output = attn_output * torch.sigmoid(gate.reshape(B, T, -1))  # the output gate, one per feature
        return self.o_proj(attn_output)  # (B, T, hidden_size)

    # Same as attention/models/llama.py::LlamaAttention.new_cache
    def new_cache(self, batch_size, capacity):
        """An empty KV cache for `batch_size` sequences of up to `capacity` positions (a sliding layer keeps only
        its window: at most `sliding_window` positions, however long the sequence)."""
        return make_cache(self, batch_size, capacity)

    # Same as attention/models/llama.py::LlamaAttention.load_state_dict
    def load_state_dict(self, state_dict, strict=True, assign=False):
        """`nn.Module.load_state_dict`, with `ValueError` naming a missing, unexpected or misshapen key."""
        check_state_dict(self, state_dict, strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


class Qwen3NextGatedDeltaNet(nn.Module):
    """Qwen3-Next's linear attention layer (gated DeltaNet): `(B, T, hidden_size) -> (B, T, hidden_size)`.

    The parameters of transformers' `Qwen3NextGatedDeltaNet`: `in_proj_qkvz`, `in_proj_ba`, `conv1d.weight`
    `(conv_dim, 1, kernel)`, `dt_bias` and `A_log` `(H_v,)`, `norm.weight` `(D_v,)`, `out_proj`. `form` (`"chunked"`
    by default, `"recurrent"` or `"quadratic"`: the same function, `attention.linear.gated_delta_rule`) and
    `chunk_size` choose how a prompt runs; a cached step of one token is always the recurrence.
    """

    MODEL_TYPES = ("qwen3_next",)
    LAYER_TYPES = LAYER_TYPES

    def __init__(self, config, layer_idx, *, form="chunked", chunk_size=64):
        super().__init__()
        check_model_type(config, self.MODEL_TYPES)
        self.layer_idx = check_layer_idx(config, layer_idx)
        self.layer_type = qwen3_next_layer_type(config, self.layer_idx)
        if self.layer_type != "linear_attention":
            raise ValueError(f"layer {layer_idx} is a {self.layer_type} layer: build it with "
                             "Qwen3NextAttention.from_config (or Qwen3NextAttention)")
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got form={form!r}")
        check_int("chunk_size", chunk_size)
        self.form, self.chunk_size = form, chunk_size
        self.hidden_size = config_value(config, "hidden_size")
        check_int("hidden_size", self.hidden_size)
        sizes = {name: config_value(config, name) for name in ("linear_num_key_heads", "linear_num_value_heads",
                                                                 "linear_key_head_dim", "linear_value_head_dim",
                                                                 "linear_conv_kernel_dim")}
        for name, value in sizes.items():
            check_int(name, value)
        self.num_k_heads, self.num_v_heads = sizes["linear_num_key_heads"], sizes["linear_num_value_heads"]
        self.head_k_dim, self.head_v_dim = sizes["linear_key_head_dim"], sizes["linear_value_head_dim"]
        self.conv_kernel_size = sizes["linear_conv_kernel_dim"]
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(f"linear_num_key_heads must divide linear_num_value_heads (each key head serves as many "
                             f"value heads), got linear_num_key_heads={self.num_k_heads}, "
                             f"linear_num_value_heads={self.num_v_heads}")
        activation = config_value(config, "hidden_act", "silu")
        if activation != "silu":
            raise ValueError(f"hidden_act must be 'silu' (the convolution's and the gated norm's activation in every "
                             f"published Qwen3-Next), got hidden_act={activation!r}")
        rms_norm_eps = config_value(config, "rms_norm_eps")
        check_finite("rms_norm_eps", rms_norm_eps)
        self.key_dim, self.value_dim = self.num_k_heads * self.head_k_dim, self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim  # the convolution runs over q, k and v side by side
        self.state_shape = (self.num_v_heads, self.head_k_dim, self.head_v_dim)  # one sequence's recurrent state

        self.in_proj_qkvz = nn.Linear(self.hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(self.hidden_size, 2 * self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.conv_kernel_size, groups=self.conv_dim, bias=False,
                                padding=self.conv_kernel_size - 1)  # depthwise: one filter of `kernel` taps per channel
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.num_v_heads).uniform_(1, 16)))
        self.norm = Qwen3NextRMSNormGated(self.head_v_dim, rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, self.hidden_size, bias=False)

    @classmethod
    def from_config(cls, config, layer_idx, **options):
        """Layer `layer_idx` of the model configured by `config`, whichever its kind (`Qwen3NextAttention.from_config`)."""
        return Qwen3NextAttention.from_config(config, layer_idx, **options)

    def forward(self, x, cache=None):
        """`x` `(B, T, hidden_size)` -> `(B, T, hidden_size)`; with `cache`, `x` continues the cached sequence (its
        states are read and replaced)."""
        check_input(x, self.hidden_size, self.out_proj.weight.dtype)
        if cache is not None:
            check_state_cache(self, cache, x)
        B, T, C = x.shape
        Hk, Hv, Dk, Dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        per_key_head = Hv // Hk  # the value heads each key head serves
        # The fused projections, laid out per key head: [q (Dk), k (Dk), v (per_key_head * Dv), z (per_key_head * Dv)].
        qkvz = self.in_proj_qkvz(x).view(B, T, Hk, 2 * Dk + 2 * per_key_head * Dv)
        q, k, v, z = qkvz.split([Dk, Dk, per_key_head * Dv, per_key_head * Dv], dim=-1)
        b, a = self.in_proj_ba(x).view(B, T, Hk, 2 * per_key_head).split([per_key_head, per_key_head], dim=-1)
        mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], dim=-1)  # (B, T, conv_dim)

        # The causal depthwise convolution: each channel sees its last `kernel` inputs (zeros before the first, or
        # the cache's last inputs), then SiLU.
        mixed = mixed.transpose(1, 2)  # (B, conv_dim, T)
        past = (mixed.new_zeros(B, self.conv_dim, self.conv_kernel_size - 1) if cache is None
                else cache.conv_state.to(mixed.dtype))
        padded = torch.cat([past, mixed], dim=-1)  # (B, conv_dim, kernel - 1 + T)
        mixed = F.silu(F.conv1d(padded, self.conv1d.weight, groups=self.conv_dim)).transpose(1, 2)  # (B, T, conv_dim)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)

        # The rule runs in float32 at least, on (B, H_v, T, D) heads: q and k L2-normalised, repeated to the value heads.
        compute = torch.promote_types(x.dtype, torch.float32)
        q, k = (l2_normalized(t.reshape(B, T, Hk, Dk).to(compute)) for t in (q, k))  # (B, T, Hk, Dk)
        q, k = (t.repeat_interleave(per_key_head, dim=2).transpose(1, 2) for t in (q, k))  # (B, Hv, T, Dk)
        v = v.reshape(B, T, Hv, Dv).to(compute).transpose(1, 2)  # (B, Hv, T, Dv)
        beta = b.reshape(B, T, Hv).to(compute).sigmoid().transpose(1, 2)  # (B, Hv, T): how much of each write
        g = (-self.A_log.to(compute).exp() * F.softplus(a.reshape(B, T, Hv).to(compute) + self.dt_bias.to(compute)))
        g = g.transpose(1, 2)  # (B, Hv, T): the log-decay, <= 0
        state = None if cache is None else cache.recurrent_state.to(compute)
        form = "recurrent" if cache is not None and T == 1 else self.form
        out, state = gated_delta_rule(q, k, v, g, beta, form=form, initial_state=state, chunk_size=self.chunk_size)
        if cache is not None:  # the convolution's last kernel - 1 inputs, and the state after the last position
            cache.replace(padded[..., padded.shape[-1] - (self.conv_kernel_size - 1):], state, T)

        out = out.transpose(1, 2).to(x.dtype)  # (B, T, Hv, Dv)
        out = self.norm(out, z.reshape(B, T, Hv, Dv))  # RMSNorm over each head, times SiLU(z)
        return self.out_proj(out.reshape(B, T, -1))  # (B, T, hidden_size)

    def new_cache(self, batch_size, capacity=None):
        """Empty states for `batch_size` sequences (`attention.decoding.RecurrentStateCache`): the recurrent state
        `(B, H_v, D_k, D_v)`, float32 at least, and the convolution's last `kernel - 1` inputs `(B, conv_dim, kernel - 1)`.
        `capacity` is ignored: a state holds no positions, so its size is the same at every context."""
        weight = self.out_proj.weight
        cache = RecurrentStateCache(batch_size, self.conv_dim, self.conv_kernel_size, *self.state_shape,
                                    dtype=weight.dtype, device=weight.device,
                                    state_dtype=torch.promote_types(weight.dtype, torch.float32))
        cache.layer = (type(self).__name__, self.layer_idx)  # check_state_cache refuses it to any other layer
        return cache

    # Same as attention/models/llama.py::LlamaAttention.load_state_dict
    def load_state_dict(self, state_dict, strict=True, assign=False):
        """`nn.Module.load_state_dict`, with `ValueError` naming a missing, unexpected or misshapen key."""
        check_state_dict(self, state_dict, strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


class Qwen3NextRMSNorm(nn.Module):
    """`x / sqrt(mean(x²) + eps) * (1 + weight)` over the last dimension, computed in float32 at least (the weight
    starts at 0: transformers' `Qwen3NextRMSNorm`, like Gemma's)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        y = x.to(torch.promote_types(x.dtype, torch.float32))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.to(y.dtype))).to(x.dtype)


class Qwen3NextRMSNormGated(nn.Module):
    """The linear layer's output norm: RMSNorm over each head's `D_v` features (weight starting at 1), times `SiLU(z)`,
    computed in float32 at least."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x, gate):
        compute = torch.promote_types(x.dtype, torch.float32)
        y = x.to(compute)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        y = self.weight * y.to(x.dtype)
        return (y * F.silu(gate.to(compute))).to(x.dtype)


def l2_normalized(x, eps=1e-6):
    """`x / sqrt(sum(x²) + eps)` over the last dimension (flash-linear-attention's and transformers' `l2norm`)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def partial_rotary(x, cos, sin):
    """RoPE on the first `cos.shape[-1]` features of each head of `(B, H, T, D)` `x` (rotate-half pairs within them);
    the other features pass unturned."""
    turned, passed = x[..., :cos.shape[-1]], x[..., cos.shape[-1]:]
    return torch.cat([apply_rotary(turned, cos, sin), passed], dim=-1)


def rotary_dim(config, parameters, head_dim):
    """The features of a head RoPE turns: `int(head_dim * partial_rotary_factor)` (from `rope_parameters`, else the
    config's field, else transformers' default for Qwen3-Next, 0.25), checked to be even and at least 2."""
    factor = parameters.pop("partial_rotary_factor", None)
    if factor is None:
        factor = config_value(config, "partial_rotary_factor", 0.25)
    check_finite("partial_rotary_factor", factor)
    dim = int(head_dim * factor)
    if factor > 1 or dim < 2 or dim % 2:
        raise ValueError(f"partial_rotary_factor must turn an even number of a head's features, at least 2 and at most "
                         f"head_dim={head_dim}, got partial_rotary_factor={factor} ({dim} features)")
    return dim


def qwen3_next_layer_type(config, layer_idx):
    """transformers' kind of layer `layer_idx`: `config.layer_types[layer_idx]` where listed, else the rule of its
    config class: every `full_attention_interval`-th layer (default 4) is softmax attention, the others linear."""
    layer_types = listed_layer_types(config, LAYER_TYPES)
    if layer_types is not None:
        return layer_types[layer_idx]
    interval = config_value(config, "full_attention_interval", 4)
    check_int("full_attention_interval", interval)
    return "full_attention" if (layer_idx + 1) % interval == 0 else "linear_attention"


# Same as attention/models/kimi_linear.py::check_state_cache
def check_state_cache(module, cache, x):
    """Raise a clear error unless `cache` was made by this linear layer (`new_cache`) for `x`'s batch, dtype and device,
    and gradients are off (a cache is for inference)."""
    if not isinstance(cache, RecurrentStateCache):
        raise TypeError(f"cache must come from the layer's new_cache(), got {type(cache).__name__}")
    check_made_by(module, cache, x, cache.conv_state)


# Same as attention/models/kimi_linear.py::check_made_by
def check_made_by(module, cache, x, tensor):
    """The checks both caches share: the layer that made `cache`, its batch, dtype and device (`tensor`'s), no grad."""
    layer = (type(module).__name__, module.layer_idx)
    if cache.layer != layer:
        raise ValueError(f"cache was made by {cache.layer[0] if cache.layer else None} layer "
                         f"{cache.layer[1] if cache.layer else None}, not by this layer ({layer[0]} layer {layer[1]}, "
                         f"{module.layer_type})")
    if x.shape[0] != tensor.shape[0]:
        raise ValueError(f"x has batch size {x.shape[0]}, the cache was made for batch_size={tensor.shape[0]}")
    if tensor.dtype != x.dtype or tensor.device != x.device:
        raise ValueError(f"cache is {tensor.dtype} on {tensor.device}, x is {x.dtype} on {x.device}")
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in module.parameters())):
        raise ValueError("a cache is for inference: call the layer under torch.no_grad() or torch.inference_mode()")



# Same as attention/models/llama.py::rope_parameters
def rope_parameters(config, layer_type):
    """The RoPE parameters of a layer: `{"rope_type", "rope_theta", ...}` (a new dict).

    transformers 5 keeps them in `config.rope_parameters` (one dict, or one per layer type); a published
    config.json has transformers 4's `rope_theta` and `rope_scaling`.
    """
    parameters = config_value(config, "rope_parameters", None)
    if parameters is None:
        parameters = mapping("rope_scaling", config_value(config, "rope_scaling", None))
        parameters["rope_theta"] = config_value(config, "rope_theta")
    else:
        parameters = mapping("rope_parameters", parameters)
        if layer_type in parameters:
            parameters = mapping(f"rope_parameters[{layer_type!r}]", parameters[layer_type])
    parameters["rope_type"] = parameters.pop("type", None) or parameters.get("rope_type") or "default"
    return parameters

# Same as attention/models/llama.py::rope_frequencies
def rope_frequencies(head_dim, parameters):
    """RoPE's inverse frequencies `(head_dim / 2,)` (float64, CPU) and the factor its cos and sin are multiplied by.

    Pair `i` turns by `position * inv_freq[i]`, `inv_freq[i] = rope_theta ** (-2i / head_dim)`, unless
    `rope_type` stretches the slow pairs for a longer context: `"linear"` divides every frequency by `factor`;
    `"llama3"` (Llama 3.1) divides the pairs slower than `original_max_position_embeddings / low_freq_factor`
    by `factor`, keeps those faster than `... / high_freq_factor`, and blends between; `"yarn"`
    (https://arxiv.org/abs/2309.00071) blends by pair index between the pairs turning `beta_fast` and
    `beta_slow` times over the original context, and multiplies cos and sin by `0.1 ln(factor) + 1`.
    Parameters that cannot rotate raise first (`check_rope_parameters`).
    """
    check_rope_parameters(head_dim, parameters)
    base, kind = parameters["rope_theta"], parameters["rope_type"]
    pair = torch.arange(head_dim // 2, dtype=torch.float64, device="cpu")
    inv_freq = base ** (-2 * pair / head_dim)
    if kind == "default":
        return inv_freq, 1.0
    factor = parameters["factor"]
    if kind == "linear":
        return inv_freq / factor, 1.0
    original = parameters["original_max_position_embeddings"]
    if kind == "llama3":
        low, high = parameters["low_freq_factor"], parameters["high_freq_factor"]
        blend = ((original * inv_freq / (2 * math.pi) - low) / (high - low)).clamp(0, 1)  # 0: slow pairs, 1: fast
        return (1 - blend) * inv_freq / factor + blend * inv_freq, 1.0
    if kind == "yarn":
        def pair_turning(turns):  # the (fractional) pair index turning `turns` times over the original context
            return head_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = pair_turning(parameters.get("beta_fast") or 32), pair_turning(parameters.get("beta_slow") or 1)
        if parameters.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        ramp = ((pair - low) / ((high - low) or 0.001)).clamp(0, 1)  # 0: keep the frequency, 1: divide by factor
        attention_factor = parameters.get("attention_factor")
        if attention_factor is None:
            def magnitude(scale, multiplier=1.0):
                return 1.0 if scale <= 1 else 0.1 * multiplier * math.log(scale) + 1.0

            mscale, mscale_all_dim = parameters.get("mscale"), parameters.get("mscale_all_dim")
            attention_factor = (magnitude(factor, mscale) / magnitude(factor, mscale_all_dim)
                                if mscale and mscale_all_dim else magnitude(factor))
        return (1 - ramp) * inv_freq + ramp * inv_freq / factor, float(attention_factor)

# Same as attention/models/llama.py::rotary_cos_sin
def rotary_cos_sin(module, start, length, like):
    """cos and sin `(length, D)` of the angles at positions `start .. start + length - 1`, in `like`'s dtype.

    Computed in float64 (float32 on MPS, which has no float64) from `module.inv_freq`, times
    `module.attention_scaling`, in the rotate-half layout: feature `i` pairs with `i + D/2`.
    """
    dtype = torch.float32 if like.device.type == "mps" else torch.float64
    if (like.device, dtype) not in module.rope_tables:
        module.rope_tables[(like.device, dtype)] = module.inv_freq.to(like.device, dtype)
    inv_freq = module.rope_tables[(like.device, dtype)]  # (D/2,)
    positions = torch.arange(start, start + length, device=like.device, dtype=dtype)  # (T,)
    angles = positions[:, None] * inv_freq[None, :]  # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, D)
    scale = module.attention_scaling
    return (angles.cos() * scale).to(like.dtype), (angles.sin() * scale).to(like.dtype)

# Same as attention/positional/rotary.py::rotate_half
def rotate_half(x):
    """`(x1, x2) -> (-x2, x1)` on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)

# Same as attention/positional/rotary.py::apply_rotary
def apply_rotary(x, cos, sin):
    """Rotate each pair `(x[..., i], x[..., i + D/2])` of `(B, H, T, D)` `x` by its position's angle."""
    return x * cos + rotate_half(x) * sin  # (B, H, T, D)

# Same as attention/models/llama.py::make_cache
def make_cache(module, batch_size, capacity):
    """`module.new_cache`: a `KVCache` of `capacity` positions, or, on a sliding layer whose window is shorter,
    a `SlidingWindowKVCache` of the window (the keys older than the window are never read again)."""
    sizes = dict(batch_size=batch_size, num_kv_heads=module.num_key_value_heads, head_dim=module.head_dim,
                 dtype=module.k_proj.weight.dtype, device=module.k_proj.weight.device)
    window = module.sliding_window
    if window is not None and not (isinstance(capacity, int) and capacity <= window):
        cache = SlidingWindowKVCache(window=window, **sizes)
    else:
        cache = KVCache(capacity=capacity, **sizes)
    cache.layer = (type(module).__name__, module.layer_idx)  # check_cache refuses it to any other layer
    return cache

# Same as attention/models/llama.py::check_cache
def check_cache(module, cache, x):
    """Raise a clear error unless `cache` was made by this layer (`new_cache`) for `x`'s batch, dtype and device,
    and gradients are off (a cache is for inference); return the position of `x`'s first token."""
    if not isinstance(cache, (KVCache, SlidingWindowKVCache)) or not hasattr(cache, "layer"):
        raise TypeError(f"cache must come from the layer's new_cache(), got {type(cache).__name__}")
    layer = (type(module).__name__, module.layer_idx)
    if cache.layer != layer:
        raise ValueError(f"cache was made by {cache.layer[0]} layer {cache.layer[1]}, not by this layer "
                         f"({layer[0]} layer {layer[1]}, {module.layer_type})")
    B, H_kv, _, D = cache.keys.shape
    if (H_kv, D) != (module.num_key_value_heads, module.head_dim):
        raise ValueError(f"cache holds {H_kv} K/V heads of size {D}, the layer has num_key_value_heads="
                         f"{module.num_key_value_heads}, head_dim={module.head_dim}")
    span = module.sliding_window or getattr(module, "attention_chunk_size", None)  # a local layer's window or chunk
    if isinstance(cache, SlidingWindowKVCache) and cache.window != span:
        raise ValueError(f"cache keeps a window of {cache.window} positions, the layer's is {span}")
    if x.shape[0] != B:
        raise ValueError(f"x has batch size {x.shape[0]}, the cache was made for batch_size={B}")
    if cache.keys.dtype != x.dtype or cache.keys.device != x.device:
        raise ValueError(f"cache is {cache.keys.dtype} on {cache.keys.device}, x is {x.dtype} on {x.device}")
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in module.parameters())):
        raise ValueError("a KV cache is for inference: call the layer under torch.no_grad() or torch.inference_mode()")
    return cache.length

# Same as attention/models/llama.py::check_state_dict
def check_state_dict(module, state_dict, strict):
    """Raise `ValueError` naming each key of `state_dict` that does not fit `module` (missing where `strict`,
    unexpected where `strict`, or of another shape, with both shapes)."""
    expected = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
    missing, unexpected = sorted(set(expected) - set(state_dict)), sorted(set(state_dict) - set(expected))
    if strict and (missing or unexpected):
        raise ValueError(f"state dict does not fit {type(module).__name__} layer {module.layer_idx}: "
                         f"missing keys {missing}, unexpected keys {unexpected}")
    for name in sorted(set(expected) & set(state_dict)):
        if tuple(state_dict[name].shape) != expected[name]:
            raise ValueError(f"state dict does not fit {type(module).__name__} layer {module.layer_idx}: {name} has "
                             f"shape {tuple(state_dict[name].shape)}, the layer's is {expected[name]}")

# Same as attention/models/llama.py::check_input
def check_input(x, hidden_size, dtype):
    """Raise a clear error unless `x` is a floating `(B, T, hidden_size)` tensor with T > 0, of the layer's `dtype`
    (that of its weights; under autocast, which casts them, any floating dtype)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got x.dtype={x.dtype}")
    if x.dim() != 3 or x.shape[-1] != hidden_size or x.shape[1] == 0:
        raise ValueError(f"x must have shape (B, T > 0, hidden_size={hidden_size}), got x.shape={tuple(x.shape)}")
    if x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise ValueError(f"x.dtype={x.dtype} differs from the layer's dtype {dtype}: convert x (x.to({dtype})) "
                         f"or the layer (layer.to({x.dtype}))")

# Same as attention/models/llama.py::check_model_type
def check_model_type(config, model_types):
    """Raise a clear error unless the config's `model_type` (where it names one) is one of `model_types`."""
    model_type = config_value(config, "model_type", None) or model_types[0]
    if model_type not in model_types:
        raise ValueError(f"this class builds the layers of model_type {', '.join(model_types)}; "
                         f"the config has model_type={model_type!r} (attention.models.MODELS maps each to its class)")

# Same as attention/models/llama.py::check_layer_idx
def check_layer_idx(config, layer_idx):
    """`layer_idx`, checked to be an int in `[0, num_hidden_layers)`."""
    num_hidden_layers = config_value(config, "num_hidden_layers")
    check_int("num_hidden_layers", num_hidden_layers)
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < num_hidden_layers:
        raise ValueError(f"layer_idx must be an int in [0, num_hidden_layers={num_hidden_layers}), got layer_idx={layer_idx!r}")
    return layer_idx

# Same as attention/models/llama.py::check_heads
def check_heads(num_attention_heads, num_key_value_heads):
    """Raise a clear error unless `num_key_value_heads` divides `num_attention_heads`."""
    if num_key_value_heads <= 0 or num_attention_heads % num_key_value_heads != 0:
        raise ValueError(f"num_key_value_heads must divide num_attention_heads, got num_key_value_heads="
                         f"{num_key_value_heads}, num_attention_heads={num_attention_heads}")

# Same as attention/models/llama.py::check_no_dropout
def check_no_dropout(config):
    """Raise a clear error for a config with attention dropout: these layers have none (every published config: 0.0)."""
    dropout = config_value(config, "attention_dropout", 0.0) or 0.0
    if dropout != 0:
        raise ValueError(f"attention_dropout must be 0.0 (these layers have no attention dropout), got {dropout}")

# Same as attention/models/llama.py::head_sizes
def head_sizes(config):
    """`(hidden_size, num_attention_heads, num_key_value_heads, head_dim)` of the config, checked: positive ints,
    the K/V heads dividing the query heads. As transformers reads them, `num_key_value_heads` absent, None or 0
    means one K/V head per query head, and `head_dim` absent, None or 0 `hidden_size // num_attention_heads`."""
    hidden_size, num_attention_heads = config_value(config, "hidden_size"), config_value(config, "num_attention_heads")
    check_int("hidden_size", hidden_size)
    check_int("num_attention_heads", num_attention_heads)
    num_key_value_heads = config_value(config, "num_key_value_heads", None) or num_attention_heads
    head_dim = config_value(config, "head_dim", None) or hidden_size // num_attention_heads
    check_int("num_key_value_heads", num_key_value_heads)
    check_int("head_dim", head_dim)
    check_heads(num_attention_heads, num_key_value_heads)
    return hidden_size, num_attention_heads, num_key_value_heads, head_dim

# Same as attention/models/llama.py::listed_layer_types
def listed_layer_types(config, kinds):
    """`config.layer_types`, checked: a list (or tuple) of `num_hidden_layers` kinds of layer, each one of `kinds`
    (the family's); None where the config lists none."""
    layer_types = config_value(config, "layer_types", None)
    if layer_types is None:
        return None
    if not isinstance(layer_types, (list, tuple)):
        raise TypeError(f"layer_types must be a list of layer kinds, one per layer, got layer_types={layer_types!r}")
    num_hidden_layers = config_value(config, "num_hidden_layers")
    if len(layer_types) != num_hidden_layers:
        raise ValueError(f"layer_types must list one kind per layer (num_hidden_layers={num_hidden_layers}), "
                         f"got {len(layer_types)}: layer_types={layer_types!r}")
    for kind in layer_types:
        if not isinstance(kind, str) or kind not in kinds:
            raise ValueError(f"layer_types holds {kind!r}; the layers of this family are {', '.join(kinds)}")
    return layer_types

# Same as attention/models/llama.py::mapping
def mapping(name, value):
    """A new dict of the config field `name` (`rope_scaling`, `rope_parameters`): `{}` for None, `TypeError` for
    anything but a dict."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict of RoPE fields, got {name}={value!r}")
    return dict(value)

# Same as attention/models/llama.py::check_rope_parameters
def check_rope_parameters(head_dim, parameters):
    """Raise a clear error unless `parameters` (`{"rope_type", "rope_theta", ...}`) can rotate heads of `head_dim`.

    The `rope_type` first (default, linear, llama3 or yarn), then each field it reads, present and in range:
    `rope_theta` and `factor` finite and > 0 (`rope_theta` > 1 for YaRN, which divides by its log),
    `original_max_position_embeddings` a positive int, Llama 3's `low_freq_factor` and `high_freq_factor` finite,
    > 0 and in that order; YaRN's optional `beta_fast`, `beta_slow`, `mscale`, `mscale_all_dim` and
    `attention_factor`, where set (None or 0: the default, but a 0 attention factor), finite and > 0. RoPE turns
    pairs of features, so `head_dim` must be even.
    """
    needs = {"default": (), "linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
             "yarn": ("factor", "original_max_position_embeddings")}
    kind = parameters["rope_type"]
    if kind not in needs:
        raise ValueError(f"rope_type must be one of {', '.join(needs)}, got rope_type={kind!r}")
    for name in ("rope_theta",) + needs[kind]:
        if parameters.get(name) is None:
            raise ValueError(f"config lacks the field {name!r}, which rope_type={kind!r} reads (rope_parameters={parameters})")
        if name == "original_max_position_embeddings":
            check_int(name, parameters[name])
        else:
            check_finite(name, parameters[name], above=1 if (kind, name) == ("yarn", "rope_theta") else 0)
    if kind == "llama3" and parameters["high_freq_factor"] < parameters["low_freq_factor"]:
        raise ValueError(f"high_freq_factor must be at least low_freq_factor (Llama 3.1's blend runs from one to the "
                         f"other), got low_freq_factor={parameters['low_freq_factor']}, "
                         f"high_freq_factor={parameters['high_freq_factor']}")
    if kind == "yarn":
        for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            if parameters.get(name):  # None or 0: the default
                check_finite(name, parameters[name])
        if parameters.get("attention_factor") is not None:  # 0 would zero every query and key: uniform attention
            check_finite("attention_factor", parameters["attention_factor"])
    if head_dim % 2:
        raise ValueError(f"head_dim must be even where RoPE rotates it (pairs of features), got head_dim={head_dim}")

# Same as attention/models/llama.py::check_finite
def check_finite(name, value, above=0):
    """Raise `TypeError` unless `value` is a number (an int or a float; a bool is not), `ValueError` unless it is
    finite and greater than `above`: the config field `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {name}={value!r}")
    if not (math.isfinite(value) and value > above):
        raise ValueError(f"{name} must be finite and > {above}, got {name}={value!r}")

# Same as attention/checks.py::check_int
def check_int(name, value, minimum=1):
    """Raise `TypeError` unless `value` is an int (a bool is not), `ValueError` if it is below `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {name}={value!r}")
    if value < minimum:
        bound = {0: "non-negative", 1: "positive"}.get(minimum, f"at least {minimum}")
        raise ValueError(f"{name} must be {bound}, got {name}={value}")

# Same as attention/models/__init__.py::config_value
def config_value(config, name, default=REQUIRED):
    """`config.name`, or `config[name]` for a mapping; `default` if absent, `ValueError` naming it if required."""
    if isinstance(config, dict):
        value = config.get(name, default)
    else:
        value = getattr(config, name, default)
    if value is REQUIRED:
        kind = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
        raise ValueError(f"config lacks the field {name!r} (model_type={kind!r})")
    return value
