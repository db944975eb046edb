"""The layers of Kimi Linear, as transformers runs them: Kimi delta attention beside latent attention without RoPE.

Kimi Linear (Kimi Team, https://arxiv.org/abs/2510.26692) keeps one softmax layer in four (`layer_types`, from the
checkpoint's `linear_attn_config`): the other three are `KimiDeltaAttention`, the delta rule with a decay per key
channel (`attention/linear/kimi_delta.py`). What the layer adds around the rule, each step commented below:

* separate `q_proj`, `k_proj`, `v_proj`, then a short causal depthwise convolution (`conv1d`, 4 taps, then SiLU) over
  the three side by side, whose last `kernel - 1` inputs are a decoder's second state;
* the decay through a low-rank `forget_gate`: `g = -exp(A_log) * softplus(f_b_proj(f_a_proj(x)) + dt_bias)`, one
  log-decay per head and key channel (`A_log` one per head), and `beta = sigmoid(b_proj(x))` per head;
* q and k L2-normalised per head, the rule run in float32 at least, and the output through an RMSNorm gated by
  `sigmoid(g_b_proj(g_a_proj(x)))`, a low-rank gate per feature.

The softmax layers (`KimiLinearAttention`) are multi-head latent attention (`attention/models/deepseek_v3.py`)
with no rotation at all ("NoPE"): the keys' shared part `k^R` is cached and attended to unturned, so the position
comes from the linear layers alone. The scale is `1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)`.

`MODELS["kimi_linear"].from_config(config, layer_idx)` builds either kind. The contract:
`attention.models.ModelAttention`; a linear layer's `new_cache` holds its states
(`attention.decoding.RecurrentStateCache`), a softmax layer's the latent and the shared key
(`attention.decoding.LatentCache`). This file imports only torch, the decoding family and the rule
(`attention/linear/`); its helpers are marked copies of `llama.py`'s.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from attention.decoding import LatentCache, RecurrentStateCache
from attention.linear.checks import FORMS  # how a linear layer may run its rule
from attention.linear.kimi_delta import kimi_delta_rule

REQUIRED = object()  # `config_value`'s default: the field must be present
LAYER_TYPES = ("linear_attention", "full_attention")  # the kinds of layer `layer_types` may list


class KimiLinearAttention(nn.Module):
    """Kimi Linear's softmax layer, latent attention without RoPE: `(B, T, hidden_size) -> (B, T, hidden_size)`.

    The parameters of transformers' `KimiLinearAttention`: `q_proj` (or `q_a_proj`, `q_a_layernorm`, `q_b_proj` where
    `q_lora_rank` is set), `kv_a_proj_with_mqa` (the latent and the shared key part), `kv_a_layernorm`, `kv_b_proj`,
    `o_proj`. `from_config` builds a `KimiDeltaAttention` for a linear layer.
    """

    MODEL_TYPES = ("kimi_linear",)
    LAYER_TYPES = LAYER_TYPES

    def __init__(self, config, layer_idx):
        super().__init__()
        check_model_type(config, self.MODEL_TYPES)
        self.layer_idx = check_layer_idx(config, layer_idx)
        self.layer_type = kimi_layer_type(config, self.layer_idx)
        if self.layer_type != "full_attention":
            raise ValueError(f"layer {layer_idx} is a {self.layer_type} layer: build it with "
                             "KimiLinearAttention.from_config (or KimiDeltaAttention)")
        check_no_dropout(config)
        self.hidden_size, self.num_heads = config_value(config, "hidden_size"), config_value(config, "num_attention_heads")
        self.q_lora_rank = config_value(config, "q_lora_rank", None)
        self.kv_lora_rank, self.qk_rope_head_dim = config_value(config, "kv_lora_rank"), config_value(config, "qk_rope_head_dim")
        self.qk_nope_head_dim, self.v_head_dim = config_value(config, "qk_nope_head_dim"), config_value(config, "v_head_dim")
        for name in ("hidden_size", "num_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            check_int(name, getattr(self, name))
        if self.q_lora_rank is not None:
            check_int("q_lora_rank", self.q_lora_rank)
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.scaling = self.qk_head_dim**-0.5
        H, bias = self.num_heads, config_value(config, "attention_bias", False)

        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(self.hidden_size, H * self.qk_head_dim, bias=False)
        else:  # the queries through a low-rank bottleneck, normalised in the middle
            self.q_a_proj = nn.Linear(self.hidden_size, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = KimiLinearRMSNorm(self.q_lora_rank)
            self.q_b_proj = nn.Linear(self.q_lora_rank, H * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(self.hidden_size, self.kv_lora_rank + self.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = KimiLinearRMSNorm(self.kv_lora_rank)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, H * (self.qk_nope_head_dim + self.v_head_dim), bias=False)
        self.o_proj = nn.Linear(H * self.v_head_dim, self.hidden_size, bias=bias)

    @classmethod
    def from_config(cls, config, layer_idx, **options):
        """Layer `layer_idx` of the model configured by `config`: this class on a `"full_attention"` layer,
        `KimiDeltaAttention` on a `"linear_attention"` one (`options`: `form`, `chunk_size`)."""
        check_layer_idx(config, layer_idx)
        if kimi_layer_type(config, layer_idx) == "linear_attention":
            return KimiDeltaAttention(config, layer_idx, **options)
        return cls(config, layer_idx, **options)

    def forward(self, x, cache=None):
        """`x` `(B, T, hidden_size)` -> `(B, T, hidden_size)`; with `cache`, `x` continues the cached sequence."""
        check_input(x, self.hidden_size, self.o_proj.weight.dtype)
        if cache is not None:
            check_latent_cache(self, cache, x)
        B, T, C = x.shape
        H = self.num_heads
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, H, self.qk_head_dim).transpose(1, 2)  # (B, H, T, D_nope + D_rope): nothing is rotated
        latent, shared_key = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent).view(B, 1, T, self.kv_lora_rank)  # c^KV: what the cache keeps
        shared_key = shared_key.view(B, 1, T, self.qk_rope_head_dim)  # k^R, one for every head, unturned
        mask = None
        if cache is not None:
            latent, shared_key, mask = cache.update(latent, shared_key)  # (B, 1, S, ...) each; mask (T, S) or None
        S = latent.shape[2]
        kv = self.kv_b_proj(latent[:, 0]).view(B, S, H, -1).transpose(1, 2)  # (B, H, S, D_nope + D_v)
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, shared_key.expand(-1, H, -1, -1)], dim=-1)  # (B, H, S, D_nope + D_rope)
        causal = cache is None and T > 1  # a prompt: the causal mask; over a cache: `mask` (None: every position)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * self.v_head_dim))  # (B, T, hidden_size)

    def new_cache(self, batch_size, capacity):
        """An empty `LatentCache` for `batch_size` sequences of up to `capacity` positions: per position, the latent
        (`kv_lora_rank` values) and the shared key part (`qk_rope_head_dim`)."""
        weight = self.o_proj.weight
        cache = LatentCache(batch_size, self.kv_lora_rank, self.qk_rope_head_dim, capacity, dtype=weight.dtype,
                            device=weight.device)
        cache.layer = (type(self).__name__, self.layer_idx)  # check_latent_cache refuses it to any other layer
        return cache

    # Same as attention/models/llama.py::LlamaAttention.load_state_dict
    def load_state_dict(self, state_dict, strict=True, assign=False):
        """`nn.Module.load_state_dict`, with `ValueError` naming a missing, unexpected or misshapen key."""
        check_state_dict(self, state_dict, strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


class KimiDeltaAttention(nn.Module):
    """Kimi Linear's linear layer (Kimi delta attention): `(B, T, hidden_size) -> (B, T, hidden_size)`.

    The parameters of transformers' `KimiLinearDeltaAttention`: `q_proj`, `k_proj`, `v_proj`, `conv1d.weight`
    `(3 H D, 1, kernel)`, `forget_gate.f_a_proj`, `forget_gate.f_b_proj`, `forget_gate.dt_bias` `(H D,)`,
    `forget_gate.A_log` `(1, 1, H, 1)`, `b_proj`, `g_a_proj`, `g_b_proj`, `o_norm.weight` `(D,)`, `o_proj`. `form`
    (`"chunked"` by default, `"recurrent"` or `"quadratic"`: the same function, `attention.linear.kimi_delta_rule`)
    and `chunk_size` choose how a prompt runs; a cached step of one token is always the recurrence.
    """

    MODEL_TYPES = ("kimi_linear",)
    LAYER_TYPES = LAYER_TYPES

    def __init__(self, config, layer_idx, *, form="chunked", chunk_size=64):
        super().__init__()
        check_model_type(config, self.MODEL_TYPES)
        self.layer_idx = check_layer_idx(config, layer_idx)
        self.layer_type = kimi_layer_type(config, self.layer_idx)
        if self.layer_type != "linear_attention":
            raise ValueError(f"layer {layer_idx} is a {self.layer_type} layer: build it with "
                             "KimiLinearAttention.from_config (or KimiLinearAttention)")
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got form={form!r}")
        check_int("chunk_size", chunk_size)
        self.form, self.chunk_size = form, chunk_size
        self.hidden_size = config_value(config, "hidden_size")
        self.num_heads, self.head_dim, self.conv_kernel_size = linear_sizes(config)
        check_int("hidden_size", self.hidden_size)
        activation = config_value(config, "hidden_act", "silu")
        if activation != "silu":
            raise ValueError(f"hidden_act must be 'silu' (the convolution's activation in every published Kimi Linear), "
                             f"got hidden_act={activation!r}")
        rms_norm_eps = config_value(config, "rms_norm_eps")
        check_finite("rms_norm_eps", rms_norm_eps)
        H, D = self.num_heads, self.head_dim
        self.inner = H * D
        self.conv_dim = 3 * self.inner  # the convolution runs over q, k and v side by side
        self.state_shape = (H, D, D)  # one sequence's recurrent state

        self.q_proj = nn.Linear(self.hidden_size, self.inner, bias=False)
        self.k_proj = nn.Linear(self.hidden_size, self.inner, bias=False)
        self.v_proj = nn.Linear(self.hidden_size, self.inner, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.conv_kernel_size, groups=self.conv_dim, bias=False,
                                padding=self.conv_kernel_size - 1)  # depthwise: one filter of `kernel` taps per channel
        self.forget_gate = KimiForgetGate(self.hidden_size, H, D)
        self.b_proj = nn.Linear(self.hidden_size, H, bias=False)
        self.g_a_proj = nn.Linear(self.hidden_size, D, bias=False)  # the output gate, through a rank-D bottleneck
        self.g_b_proj = nn.Linear(D, self.inner, bias=False)
        self.o_norm = KimiRMSNormGated(D, rms_norm_eps)
        self.o_proj = nn.Linear(self.inner, self.hidden_size, bias=False)

    @classmethod
    def from_config(cls, config, layer_idx, **options):
        """Layer `layer_idx` of the model configured by `config`, whichever its kind (`KimiLinearAttention.from_config`)."""
        return KimiLinearAttention.from_config(config, layer_idx, **options)

    def forward(self, x, cache=None):
        """`x` `(B, T, hidden_size)` -> `(B, T, hidden_size)`; with `cache`, `x` continues the cached sequence (its
        states are read and replaced)."""
        check_input(x, self.hidden_size, self.o_proj.weight.dtype)
        if cache is not None:
            check_state_cache(self, cache, x)
        B, T, C = x.shape
        H, D = self.num_heads, self.head_dim
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)  # (B, T, 3 H D)

        # The causal depthwise convolution: each channel sees its last `kernel` inputs (zeros before the first, or
        # the cache's last inputs), then SiLU.
        mixed = mixed.transpose(1, 2)  # (B, 3 H D, T)
        past = (mixed.new_zeros(B, self.conv_dim, self.conv_kernel_size - 1) if cache is None
                else cache.conv_state.to(mixed.dtype))
        padded = torch.cat([past, mixed], dim=-1)  # (B, 3 H D, kernel - 1 + T)
        mixed = F.silu(F.conv1d(padded, self.conv1d.weight, groups=self.conv_dim)).transpose(1, 2)  # (B, T, 3 H D)

        # The rule runs in float32 at least, on (B, H, T, D) heads, q and k L2-normalised.
        compute = torch.promote_types(x.dtype, torch.float32)
        q, k, v = (t.reshape(B, T, H, D).to(compute).transpose(1, 2) for t in mixed.split(self.inner, dim=-1))
        q, k = l2_normalized(q), l2_normalized(k)  # (B, H, T, D)
        g = self.forget_gate(x, compute).transpose(1, 2)  # (B, H, T, D): a log-decay per key channel, <= 0
        beta = torch.sigmoid(self.b_proj(x).to(compute)).transpose(1, 2)  # (B, H, T)
        state = None if cache is None else cache.recurrent_state.to(compute)
        form = "recurrent" if cache is not None and T == 1 else self.form
        out, state = kimi_delta_rule(q, k, v, g, beta, form=form, initial_state=state, chunk_size=self.chunk_size)
        if cache is not None:  # the convolution's last kernel - 1 inputs, and the state after the last position
            cache.replace(padded[..., padded.shape[-1] - (self.conv_kernel_size - 1):], state, T)

        gate = self.g_b_proj(self.g_a_proj(x)).view(B, T, H, D)  # one gate per output feature
        out = self.o_norm(out.transpose(1, 2), gate)  # (B, T, H, D): RMSNorm over each head, times sigmoid(gate)
        return self.o_proj(out.reshape(B, T, -1).to(x.dtype))  # (B, T, hidden_size)

    def new_cache(self, batch_size, capacity=None):
        """Empty states for `batch_size` sequences (`attention.decoding.RecurrentStateCache`): the recurrent state
        `(B, H, D, D)`, float32 at least, and the convolution's last `kernel - 1` inputs `(B, 3 H D, kernel - 1)`.
        `capacity` is ignored: a state holds no positions, so its size is the same at every context."""
        weight = self.o_proj.weight
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


class KimiForgetGate(nn.Module):
    """The decay of Kimi delta attention: `-exp(A_log[h]) * softplus(f_b_proj(f_a_proj(x)) + dt_bias)`, a log-decay
    per head and key channel (`(B, T, H, D)`, computed in `compute`, float32 at least), through a rank-D bottleneck."""

    def __init__(self, hidden_size, num_heads, head_dim):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.f_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, num_heads * head_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(num_heads * head_dim))
        self.A_log = nn.Parameter(torch.zeros(1, 1, num_heads, 1))

    def forward(self, x, compute):
        B, T, C = x.shape
        logits = self.f_b_proj(self.f_a_proj(x)).to(compute) + self.dt_bias.to(compute)  # (B, T, H D)
        return -self.A_log.to(compute).exp() * F.softplus(logits.view(B, T, self.num_heads, self.head_dim))


class KimiLinearRMSNorm(nn.Module):
    """`x / sqrt(mean(x²) + eps) * weight` over the last dimension, computed in float32 at least, the weight applied in
    `x`'s dtype (transformers' `KimiLinearRMSNorm`; the latent attention's norms keep its default eps, 1e-6)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x):
        y = x.to(torch.promote_types(x.dtype, torch.float32))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * y.to(x.dtype)


class KimiRMSNormGated(nn.Module):
    """The linear layer's output norm: RMSNorm over each head's features, times `sigmoid(gate)`, all in float32 at
    least (transformers' `KimiLinearRMSNormGated`)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x, gate):
        compute = torch.promote_types(x.dtype, torch.float32)
        y = x.to(compute)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight.to(compute) * y * torch.sigmoid(gate.to(compute))


def l2_normalized(x, eps=1e-6):
    """`x / sqrt(sum(x²) + eps)` over the last dimension (flash-linear-attention's and transformers' `l2norm`)."""
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def linear_sizes(config):
    """`(linear_num_heads, linear_head_dim, linear_conv_kernel_dim)` of the linear layers, each a positive int: the
    checkpoint's `linear_attn_config` (`num_heads`, `head_dim`, `short_conv_kernel_size`) where it has them, which
    transformers' config reads before its own fields, else those fields (the kernel 4 by default)."""
    nested = config_value(config, "linear_attn_config", None) or {}
    sizes = []
    for name, key, default in (("linear_num_heads", "num_heads", None), ("linear_head_dim", "head_dim", None),
                               ("linear_conv_kernel_dim", "short_conv_kernel_size", 4)):
        value = nested.get(key, config_value(config, name, default))
        if value is None:
            raise ValueError(f"config lacks the field {name!r} (nor linear_attn_config[{key!r}])")
        check_int(name, value)
        sizes.append(value)
    return tuple(sizes)


def kimi_layer_type(config, layer_idx):
    """transformers' kind of layer `layer_idx`: `config.layer_types[layer_idx]` where listed; else the checkpoint's
    `linear_attn_config["full_attn_layers"]` (1-based); else transformers' default, every fourth from layer 4 on
    (`i % 4 == 0`, `i > 0`) softmax attention."""
    layer_types = listed_layer_types(config, LAYER_TYPES)
    if layer_types is not None:
        return layer_types[layer_idx]
    nested = config_value(config, "linear_attn_config", None) or {}
    if "full_attn_layers" in nested:
        return "full_attention" if layer_idx + 1 in nested["full_attn_layers"] else "linear_attention"
    return "full_attention" if layer_idx and layer_idx % 4 == 0 else "linear_attention"


def check_latent_cache(module, cache, x):
    """Raise a clear error unless `cache` was made by this layer (`new_cache`) for `x`'s batch, dtype and device, and
    gradients are off (a cache is for inference)."""
    if not isinstance(cache, LatentCache):
        raise TypeError(f"cache must come from the layer's new_cache(), got {type(cache).__name__}")
    check_made_by(module, cache, x, cache.latent)


def check_state_cache(module, cache, x):
    """Raise a clear error unless `cache` was made by this linear layer (`new_cache`) for `x`'s batch, dtype and device,
    and gradients are off (a cache is for inference)."""
    if not isinstance(cache, RecurrentStateCache):
        raise TypeError(f"cache must come from the layer's new_cache(), got {type(cache).__name__}")
    check_made_by(module, cache, x, cache.conv_state)


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

# Same as attention/models/llama.py::check_no_dropout
def check_no_dropout(config):
    """Raise a clear error for a config with attention dropout: these layers have none (every published config: 0.0)."""
    dropout = config_value(config, "attention_dropout", 0.0) or 0.0
    if dropout != 0:
        raise ValueError(f"attention_dropout must be 0.0 (these layers have no attention dropout), got {dropout}")

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
