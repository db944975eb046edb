"""The text attention of Llama 4, as transformers runs it: chunked local layers with RoPE and an L2 norm, global NoPE layers.

Meta's Llama 4 (https://ai.meta.com/blog/llama-4-multimodal-intelligence/, and
https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E/blob/main/config.json) interleaves two kinds of layer,
three of one for each of the other (`no_rope_layer_interval` 4):

* **Chunked local layers** rotate queries and keys (RoPE, pairs `(2i, 2i + 1)`, Meta's interleaved layout) and
  attend only within their chunk of `attention_chunk_size` positions (8,192): query `i` sees keys `j <= i` with
  `j // chunk == i // chunk`, so its first query sees one key and its last the whole chunk. Their queries and
  keys are then L2-normalised per head (`use_qk_norm`: an RMSNorm without weight, after RoPE, unlike Qwen3's).
* **Global NoPE layers** (every 4th) have no position encoding at all and see every earlier key; instead
  their queries are scaled up with the position, `1 + attn_scale * log(1 + floor((p + 1) / floor_scale))`
  (attention temperature tuning, https://arxiv.org/abs/2501.19399), so attention stays sharp over millions
  of keys.

A chunked layer's cache holds at most one chunk (the ring buffer of `attention/causal/gqa.py`, masked to the
current chunk). The contract: `attention.models.ModelAttention`. This file imports only torch and the KV caches
of `attention/causal/gqa.py`; its helpers are marked copies of `llama.py`'s.
"""

import math

import torch
from torch import nn

from attention.causal.gqa import KVCache, SlidingWindowKVCache, cached_attention

REQUIRED = object()  # `config_value`'s default: the field must be present


class Llama4TextAttention(nn.Module):
    """Llama 4's text self-attention layer: `(B, T, hidden_size) -> (B, T, hidden_size)`.

    The parameters of transformers' `Llama4TextAttention`: `q_proj`, `k_proj`, `v_proj`, `o_proj` (biases where
    `attention_bias`); the L2 norm has no weight. The attention runs on `F.scaled_dot_product_attention`;
    over a cache, `decode_kernel` picks it or the grouped matmuls (`attention.causal.gqa.cached_attention`).
    """

    MODEL_TYPES = ("llama4_text",)
    decode_kernel = "auto"  # over a cache: "sdpa", "matmul" or "auto" (attention.causal.gqa.DECODE_KERNELS)

    def __init__(self, config, layer_idx):
        super().__init__()
        check_model_type(config, self.MODEL_TYPES)
        self.layer_idx = check_layer_idx(config, layer_idx)
        self.hidden_size = config_value(config, "hidden_size")
        self.num_attention_heads = config_value(config, "num_attention_heads")
        self.num_key_value_heads = config_value(config, "num_key_value_heads", None) or self.num_attention_heads
        self.head_dim = config_value(config, "head_dim", None) or self.hidden_size // self.num_attention_heads
        check_heads(self.num_attention_heads, self.num_key_value_heads)
        check_no_dropout(config)
        self.scaling = self.head_dim**-0.5
        # The differences from Llama: RoPE or none, chunks instead of a window, an L2 norm, a query temperature.
        self.use_rope = bool(rope_layers(config)[self.layer_idx])
        self.layer_type = chunked_layer_type(config, self.layer_idx)
        self.sliding_window = None
        self.attention_chunk_size = (config_value(config, "attention_chunk_size")
                                     if self.layer_type == "chunked_attention" else None)
        self.qk_norm = "l2" if self.use_rope and config_value(config, "use_qk_norm", True) else None
        self.norm_eps = config_value(config, "rms_norm_eps")
        self.attn_temperature_tuning = not self.use_rope and bool(config_value(config, "attn_temperature_tuning", True))
        self.floor_scale, self.attn_scale = config_value(config, "floor_scale", 8192), config_value(config, "attn_scale", 0.1)

        H, H_kv, D = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        qkv_bias = o_bias = config_value(config, "attention_bias", False)
        self.q_proj = nn.Linear(self.hidden_size, H * D, bias=qkv_bias)
        self.k_proj = nn.Linear(self.hidden_size, H_kv * D, bias=qkv_bias)
        self.v_proj = nn.Linear(self.hidden_size, H_kv * D, bias=qkv_bias)
        self.o_proj = nn.Linear(H * D, self.hidden_size, bias=o_bias)

        self.rope_parameters = rope_parameters(config, self.layer_type) if self.use_rope else None
        # float64 on the CPU, and not a buffer: `module.to(torch.bfloat16)` would round the frequencies, and with
        # them every angle. `rope_tables` keeps a copy per device, made on first use.
        self.inv_freq, self.attention_scaling = (rope_frequencies(self.head_dim, self.rope_parameters)
                                                 if self.use_rope else (None, 1.0))
        self.rope_tables = {}

    # Same as attention/models/llama.py::LlamaAttention.from_config
    @classmethod
    def from_config(cls, config, layer_idx):
        """Layer `layer_idx` of the model configured by `config` (see `attention.models.ModelAttention`)."""
        return cls(config, layer_idx)

    def forward(self, x, cache=None):
        """`x` `(B, T, hidden_size)` -> `(B, T, hidden_size)`; with `cache`, `x` continues the cached sequence."""
        check_input(x, self.hidden_size)
        B, T, C = x.shape
        start = 0 if cache is None else check_cache(self, cache, x)  # the position of x's first token
        q, k, v = self.qkv(x, start)  # (B, H, T, D), (B, H_kv, T, D), (B, H_kv, T, D)
        if cache is None:
            keys, values, mask = k, v, chunk_mask(torch.arange(T, device=x.device), torch.arange(T, device=x.device),
                                                  self.attention_chunk_size)  # mask (T, T), or None: causal
        else:
            slots_before = cache.positions.clone() if isinstance(cache, SlidingWindowKVCache) and T > 1 else None
            keys, values, mask = cache.update(k, v)  # (B, H_kv, S, D) each; mask (T, S) or None
            if self.attention_chunk_size is not None:  # the cache's mask is causal; keep the chunk's keys only
                key_positions = cached_positions(cache, slots_before, start, T)  # (S,)
                in_chunk = chunk_mask(torch.arange(start, start + T, device=x.device), key_positions,
                                      self.attention_chunk_size)  # (T, S)
                mask = in_chunk if mask is None else mask & in_chunk
        # SDPA; over a cache, the grouped matmuls for a few new tokens on CPU (`decode_kernel`, as GroupedQueryAttention)
        context = cached_attention(q, keys, values, mask, self.scaling, self.decode_kernel,
                                   over_cache=cache is not None)  # (B, H, T, D)
        context = context.transpose(1, 2).reshape(B, T, -1)  # (B, T, H*D)
        return self.o_proj(context)  # (B, T, hidden_size)

    def qkv(self, x, start):
        """Queries, keys and values of `x` `(B, T, hidden_size)` at positions `start ..`: rotated and L2-normed
        (chunked layers) or with the query temperature (NoPE layers): `(B, H, T, D)`, `(B, H_kv, T, D)` twice."""
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, T, H*D) -> (B, H, T, D)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, T, H_kv*D) -> (B, H_kv, T, D)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H_kv, T, D)
        if self.use_rope:
            cos, sin = interleaved_cos_sin(self, start, T, x)  # (T, D/2) each
            q, k = rotate_interleaved(q, cos, sin), rotate_interleaved(k, cos, sin)
        if self.qk_norm == "l2":  # after RoPE: a unit-RMS query and key per head, no weight
            q, k = l2_norm(q, self.norm_eps), l2_norm(k, self.norm_eps)
        if self.attn_temperature_tuning:  # NoPE layers: queries sharpen with the position
            positions = torch.arange(start, start + T, device=x.device, dtype=torch.float64)  # (T,)
            scales = torch.log1p(torch.floor((positions + 1) / self.floor_scale)) * self.attn_scale + 1  # (T,)
            q = q * scales.to(q.dtype).view(1, 1, T, 1)  # (B, H, T, D)
        return q, k, v

    def new_cache(self, batch_size, capacity):
        """An empty KV cache for `batch_size` sequences of up to `capacity` positions (a chunked layer keeps at most
        `attention_chunk_size` positions, however long the sequence)."""
        sizes = dict(batch_size=batch_size, num_kv_heads=self.num_key_value_heads, head_dim=self.head_dim,
                     dtype=self.k_proj.weight.dtype, device=self.k_proj.weight.device)
        chunk = self.attention_chunk_size
        if chunk is not None and not (isinstance(capacity, int) and capacity <= chunk):
            cache = SlidingWindowKVCache(window=chunk, **sizes)  # the last `chunk` positions hold the current chunk
        else:
            cache = KVCache(capacity=capacity, **sizes)
        cache.layer = (type(self).__name__, self.layer_idx)  # check_cache refuses it to any other layer
        return cache

    # Same as attention/models/llama.py::LlamaAttention.load_state_dict
    def load_state_dict(self, state_dict, strict=True, assign=False):
        """`nn.Module.load_state_dict`, with `ValueError` naming a missing, unexpected or misshapen key."""
        check_state_dict(self, state_dict, strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


def rope_layers(config):
    """Per layer, 1 where it rotates (RoPE), 0 where it has no position encoding: `config.no_rope_layers` (named
    for the 0s), or, where absent, 0 on every `no_rope_layer_interval`-th layer (transformers' default: 4)."""
    listed = config_value(config, "no_rope_layers", None)
    if listed:
        return listed
    interval = config_value(config, "no_rope_layer_interval", 4)
    return [int((i + 1) % interval != 0) for i in range(config_value(config, "num_hidden_layers"))]


def chunked_layer_type(config, layer_idx):
    """transformers' kind of layer `layer_idx`: `config.layer_types[layer_idx]`, or, where absent,
    `"chunked_attention"` for the RoPE layers (given a chunk size) and `"full_attention"` for the NoPE ones."""
    layer_types = config_value(config, "layer_types", None)
    if layer_types is not None:
        return layer_types[layer_idx]
    chunked = rope_layers(config)[layer_idx] and config_value(config, "attention_chunk_size", None) is not None
    return "chunked_attention" if chunked else "full_attention"


def chunk_mask(query_positions, key_positions, chunk):
    """Query `i` attends to keys `j <= i` of its own chunk, `j // chunk == i // chunk`: `(T, S)` bool, True = attend;
    None without chunks (plain causal, for SDPA's `is_causal`). Keys at position -1 (empty cache slots): never."""
    if chunk is None:
        return None
    q, k = query_positions[:, None], key_positions[None, :]
    return (k >= 0) & (k <= q) & (k // chunk == q // chunk)


def cached_positions(cache, slots_before, start, length):
    """The position of each key `cache.update` just returned for a chunk of `length` queries starting at `start`:
    `0 .. length - 1` of a `KVCache`; the ring's slots (and, for several queries, the chunk's own keys after them,
    as `SlidingWindowKVCache.update` returns them) of a sliding cache. `slots_before`: its slots' positions
    before the update."""
    if isinstance(cache, KVCache):
        return torch.arange(cache.length, device=cache.keys.device)
    if length == 1:
        return cache.positions
    return torch.cat([slots_before, torch.arange(start, start + length, device=slots_before.device)])


def interleaved_cos_sin(module, start, length, like):
    """cos and sin `(length, D/2)` of each pair's angle at positions `start .. start + length - 1`, in `like`'s dtype,
    computed in float64 (float32 on MPS) from `module.inv_freq`, times `module.attention_scaling`."""
    dtype = torch.float32 if like.device.type == "mps" else torch.float64
    if (like.device, dtype) not in module.rope_tables:
        module.rope_tables[(like.device, dtype)] = module.inv_freq.to(like.device, dtype)
    positions = torch.arange(start, start + length, device=like.device, dtype=dtype)  # (T,)
    angles = positions[:, None] * module.rope_tables[(like.device, dtype)][None, :]  # (T, D/2)
    scale = module.attention_scaling
    return (angles.cos() * scale).to(like.dtype), (angles.sin() * scale).to(like.dtype)


def rotate_interleaved(x, cos, sin):
    """`x` `(B, heads, T, D)` rotated pair by pair in Meta's layout: `(x_2i, x_2i+1)` turns by the angle of pair `i`."""
    even, odd = x[..., 0::2], x[..., 1::2]  # (B, heads, T, D/2) each
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)  # (B, heads, T, D)


def l2_norm(x, eps):
    """`x / sqrt(mean(x²) + eps)` over the last dimension, computed in float32 at least (Llama 4's `L2Norm`)."""
    y = x.to(torch.promote_types(x.dtype, torch.float32))
    return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


# Same as attention/models/llama.py::rope_parameters
def rope_parameters(config, layer_type):
    """The RoPE parameters of a layer: `{"rope_type", "rope_theta", ...}` (a new dict).

    transformers 5 keeps them in `config.rope_parameters` (one dict, or one per layer type); a published
    config.json has transformers 4's `rope_theta` and `rope_scaling`.
    """
    parameters = config_value(config, "rope_parameters", None)
    if parameters is None:
        parameters = dict(config_value(config, "rope_scaling", None) or {})
        parameters["rope_theta"] = config_value(config, "rope_theta")
    elif layer_type in parameters:
        parameters = parameters[layer_type]
    parameters = dict(parameters)
    parameters["rope_type"] = parameters.pop("type", None) or parameters.get("rope_type") or "default"
    if "rope_theta" not in parameters:
        raise ValueError(f"config lacks the field 'rope_theta' (rope_parameters={parameters})")
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
    """
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
    raise ValueError(f"rope_type must be default, linear, llama3 or yarn, got rope_type={kind!r}")


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
def check_input(x, hidden_size):
    """Raise a clear error unless `x` is a floating `(B, T, hidden_size)` tensor with T > 0."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got x.dtype={x.dtype}")
    if x.dim() != 3 or x.shape[-1] != hidden_size or x.shape[1] == 0:
        raise ValueError(f"x must have shape (B, T > 0, hidden_size={hidden_size}), got x.shape={tuple(x.shape)}")


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
