"""The attention layer of Gemma 4's text model, as transformers runs it: K = V on global layers, two head sizes,
and the last layers reusing an earlier layer's keys and values.

Gemma 4 (https://huggingface.co/google/gemma-4-31B-it, config.json's `text_config`) keeps Gemma 3's pattern of
local layers (a window of 512 or 1,024 keys) and global layers, with QK-norm, and saves KV cache in three more ways:

* **Two head sizes**: local layers have `head_dim` 256, global layers `global_head_dim` 512 (transformers 5:
  `config.per_layer_config[layer_idx].head_dim`), and in the larger models fewer K/V heads on the global layers
  (`num_global_key_value_heads`: 4 against 16 in the 31B).
* **K = V on global layers** (`attention_k_eq_v`): the global layers have no `v_proj`; one projection gives the key
  and the value. The key is normed (`k_norm`, with its weight) and rotated; the value is the same projection normed
  without a weight (`v_norm`) and not rotated. A cache could keep one tensor for both before the norms; transformers
  keeps both, as this layer does.
* **Cross-layer K/V sharing** (`num_kv_shared_layers`, the small E2B and E4B models): the last layers compute
  queries only and attend to the keys and values of the last earlier layer of their kind (`kv_sharing`: that layer
  "store"s them, the later ones "reuse" them), so they hold no cache at all: 20 of E2B's 35 layers.

Three smaller changes: the scores are not scaled (`scaling` 1.0: the QK-norms set the scale), the norms multiply by
their weight (`x / rms(x) * weight`, weights starting at 1, where Gemma 2 and 3 stored `weight - 1`), and the global
layers rotate only a quarter of each head (`"proportional"` RoPE: the first `partial_rotary_factor * head_dim / 2`
pairs turn, at the frequencies they would have over the whole head; the rest keep frequency 0).

The contract: `attention.models.ModelAttention`, with one addition for sharing: `module(x, cache, shared_kv)`,
where `shared_kv` is a dict the caller passes to every layer of one forward (or decoding) step, as transformers'
`shared_kv_states`. This file imports only torch and the decoding family (`attention/decoding/`); its helpers are
marked copies of `llama.py`'s.
"""

import math

import torch
from torch import nn

from attention.decoding import KVCache, SlidingWindowKVCache, cached_attention, check_decode_kernel

REQUIRED = object()  # `config_value`'s default: the field must be present
# transformers' defaults where a config leaves them out (Gemma4TextConfig.__post_init__)
DEFAULT_ROPE_PARAMETERS = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
DEFAULT_GLOBAL_HEAD_DIM = 512
KV_SHARING_MODES = (None, "store", "reuse")


class Gemma4Attention(nn.Module):
    """Gemma 4's self-attention layer: `(B, T, hidden_size) -> (B, T, hidden_size)`.

    The parameters of transformers' `Gemma4TextAttention`: `q_proj`, `q_norm.weight` and `o_proj` on every layer;
    `k_proj`, `k_norm.weight` and, unless the layer is global with `attention_k_eq_v`, `v_proj`, on every layer that
    computes its own keys (`v_norm` has no weight). The attention runs on `F.scaled_dot_product_attention`; over a
    cache, `decode_kernel` (`"auto"`, `"sdpa"` or `"matmul"`) picks it or the grouped matmuls
    (`attention.decoding.cached_attention`).

    `kv_sharing`: None (the layer's own K/V, for itself), `"store"` (its own, left in `shared_kv` for the layers
    that reuse them) or `"reuse"` (no K/V projection and no cache: it attends to what the storing layer of its kind
    left in `shared_kv` in the same step).
    """

    MODEL_TYPES = ("gemma4_text",)
    LAYER_TYPES = ("full_attention", "sliding_attention")  # the kinds of layer `layer_types` may list
    qk_norm = "head"  # an RMSNorm over each query and key head, before RoPE
    norm_offset = 0.0  # Gemma 4's norms multiply by their weight (Gemma 2 and 3: by 1 + weight)

    def __init__(self, config, layer_idx, *, decode_kernel="auto"):
        super().__init__()
        self.decode_kernel = check_decode_kernel(decode_kernel)  # over a cache: attention.decoding.DECODE_KERNELS
        check_model_type(config, self.MODEL_TYPES)
        self.layer_idx = check_layer_idx(config, layer_idx)
        check_no_dropout(config)
        check_causal(config)
        layer_types = gemma4_layer_types(config, self.LAYER_TYPES)
        self.layer_type = layer_types[self.layer_idx]
        self.sliding_window = layer_window(config, self.layer_type)
        self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim = gemma4_head_sizes(
            config, self.layer_idx, self.layer_type)
        self.scaling = 1.0  # Gemma 4 does not scale its scores: the QK-norms do
        self.kv_sharing = kv_sharing_modes(config, layer_types)[self.layer_idx]
        self.key_is_value = bool(config_value(config, "attention_k_eq_v", False)) and self.layer_type == "full_attention"

        H, H_kv, D = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        bias = config_value(config, "attention_bias", False)
        rms_norm_eps = config_value(config, "rms_norm_eps")
        check_finite("rms_norm_eps", rms_norm_eps)
        self.q_proj = nn.Linear(self.hidden_size, H * D, bias=bias)
        self.q_norm = Gemma4RMSNorm(D, rms_norm_eps)
        if self.kv_sharing != "reuse":  # a reusing layer has no K/V weights at all
            self.k_proj = nn.Linear(self.hidden_size, H_kv * D, bias=bias)
            self.v_proj = None if self.key_is_value else nn.Linear(self.hidden_size, H_kv * D, bias=bias)
            self.k_norm = Gemma4RMSNorm(D, rms_norm_eps)
            self.v_norm = Gemma4RMSNorm(D, rms_norm_eps, with_scale=False)
        self.o_proj = nn.Linear(H * D, self.hidden_size, bias=bias)

        self.rope_parameters = gemma4_rope_parameters(config, self.layer_type)
        # float64 on the CPU, and not a buffer: `module.to(torch.bfloat16)` would round the frequencies.
        self.inv_freq, self.attention_scaling = gemma4_rope_frequencies(self.head_dim, self.rope_parameters)
        self.rope_tables = {}

    # Same as attention/models/llama.py::LlamaAttention.from_config
    @classmethod
    def from_config(cls, config, layer_idx, **options):
        """Layer `layer_idx` of the model configured by `config` (see `attention.models.ModelAttention`); `options`: the
        class's keyword arguments (`decode_kernel` where the layer attends through SDPA)."""
        return cls(config, layer_idx, **options)

    def forward(self, x, cache=None, shared_kv=None):
        """`x` `(B, T, hidden_size)` -> `(B, T, hidden_size)`; with `cache`, `x` continues the cached sequence.

        `shared_kv`: a dict passed to every layer of the step. A `"store"` layer leaves its keys, values and mask in
        it under its `layer_type`; a `"reuse"` layer (which takes no cache) reads them from it."""
        check_input(x, self.hidden_size, self.o_proj.weight.dtype)
        B, T, C = x.shape
        if self.kv_sharing == "reuse":
            if cache is not None:
                raise ValueError(f"layer {self.layer_idx} reuses another layer's K/V and keeps no cache: pass "
                                 f"cache=None and the step's shared_kv")
            shared = shared_entry(self, shared_kv, x)
            start, keys, values, mask, over_cache = (shared[name] for name in
                                                     ("start", "keys", "values", "mask", "over_cache"))
            q = self.queries(x, start)  # (B, H, T, D)
        else:
            start = 0 if cache is None else check_cache(self, cache, x)  # the position of x's first token
            q, k, v = self.qkv(x, start)  # (B, H, T, D), (B, H_kv, T, D), (B, H_kv, T, D)
            over_cache = cache is not None
            if cache is None:
                keys, values, mask = k, v, window_mask(T, self.sliding_window, x.device)  # mask (T, T) or None: causal
            else:
                keys, values, mask = cache.update(k, v)  # (B, H_kv, S, D) each; mask (T, S) or None
            if self.kv_sharing == "store" and shared_kv is not None:
                shared_kv[self.layer_type] = dict(start=start, keys=keys, values=values, mask=mask,
                                                  over_cache=over_cache, length=T, batch_size=B)
        attn_output = cached_attention(q, keys, values, mask, self.scaling, self.decode_kernel,
                                       over_cache=over_cache)  # (B, H, T, D)
        attn_output = attn_output.transpose(1, 2).reshape(B, T, -1)  # (B, T, H*D)
        return self.o_proj(attn_output)  # (B, T, hidden_size)

    def queries(self, x, start):
        """The queries of `x` `(B, T, hidden_size)` at positions `start ..`, normed and rotated: `(B, H, T, D)`."""
        B, T, C = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, -1, self.head_dim)).transpose(1, 2)  # (B, H, T, D)
        cos, sin = rotary_cos_sin(self, start, T, x)  # (T, D) each
        return apply_rotary(q, cos, sin)

    def qkv(self, x, start):
        """Queries, keys and values of `x` at positions `start ..`: `(B, H, T, D)`, `(B, H_kv, T, D)` twice.

        The key is normed with `k_norm` and rotated; the value is normed without a weight and not rotated. With K = V
        (a global layer where `attention_k_eq_v`), both come from `k_proj`."""
        B, T, C = x.shape
        key_projection = self.k_proj(x).view(B, T, -1, self.head_dim)  # (B, T, H_kv, D)
        value_projection = key_projection if self.v_proj is None else self.v_proj(x).view(B, T, -1, self.head_dim)
        k = self.k_norm(key_projection).transpose(1, 2)  # (B, H_kv, T, D)
        v = self.v_norm(value_projection).transpose(1, 2)  # (B, H_kv, T, D)
        cos, sin = rotary_cos_sin(self, start, T, x)  # (T, D) each
        return self.queries(x, start), apply_rotary(k, cos, sin), v

    def new_cache(self, batch_size, capacity):
        """An empty KV cache for `batch_size` sequences of up to `capacity` positions (a sliding layer keeps only
        its window); None for a layer that reuses another's K/V: it keeps nothing."""
        return None if self.kv_sharing == "reuse" else make_cache(self, batch_size, capacity)

    # Same as attention/models/llama.py::LlamaAttention.load_state_dict
    def load_state_dict(self, state_dict, strict=True, assign=False):
        """`nn.Module.load_state_dict`, with `ValueError` naming a missing, unexpected or misshapen key."""
        check_state_dict(self, state_dict, strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


class Gemma4RMSNorm(nn.Module):
    """`x / sqrt(mean(x²) + eps) * weight` over the last dimension (`with_scale=False`: no weight, Gemma 4's `v_norm`).

    Computed in float32 at least, the weight applied before the result returns to `x`'s dtype, as transformers'
    `Gemma4RMSNorm` does.
    """

    def __init__(self, dim, eps, with_scale=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None
        self.eps = eps

    def forward(self, x):
        compute = torch.promote_types(x.dtype, torch.float32)
        y = x.to(compute)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y if self.weight is None else y * self.weight.to(compute)).to(x.dtype)


def shared_entry(module, shared_kv, x):
    """What the storing layer of `module`'s kind left in `shared_kv` this step, checked against `x`."""
    if not isinstance(shared_kv, dict) or module.layer_type not in shared_kv:
        raise ValueError(f"layer {module.layer_idx} reuses the K/V of the last earlier {module.layer_type} layer: pass "
                         f"the step's shared_kv dict, after that layer has run (got shared_kv={type(shared_kv).__name__}"
                         f"{'' if not isinstance(shared_kv, dict) else ' with ' + repr(sorted(shared_kv))})")
    shared = shared_kv[module.layer_type]
    if (shared["batch_size"], shared["length"]) != tuple(x.shape[:2]):
        raise ValueError(f"shared_kv holds K/V for batch {shared['batch_size']} and {shared['length']} new tokens, "
                         f"x has shape {tuple(x.shape)}")
    if shared["keys"].shape[1] != module.num_key_value_heads or shared["keys"].shape[-1] != module.head_dim:
        raise ValueError(f"shared_kv holds {shared['keys'].shape[1]} K/V heads of size {shared['keys'].shape[-1]}, "
                         f"layer {module.layer_idx} has num_key_value_heads={module.num_key_value_heads}, "
                         f"head_dim={module.head_dim}")
    return shared


def check_causal(config):
    """Raise a clear error for a config whose text attends both ways (`use_bidirectional_attention="all"`): these
    layers are causal (None and `"vision"`, the published settings, leave text causal)."""
    setting = config_value(config, "use_bidirectional_attention", None)
    if setting not in (None, "vision"):
        raise ValueError(f"use_bidirectional_attention must be None or 'vision' (this layer is causal), got "
                         f"use_bidirectional_attention={setting!r}")


def gemma4_layer_types(config, kinds):
    """Every layer's kind: `config.layer_types`, or transformers' default (every 6th layer global); the last layer is
    global whatever the list says, as transformers makes it (`Gemma4TextConfig.__post_init__`)."""
    layer_types = listed_layer_types(config, kinds)
    if layer_types is None:
        num_hidden_layers = config_value(config, "num_hidden_layers")
        layer_types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(num_hidden_layers)]
    return [*layer_types[:-1], "full_attention"]


def gemma4_head_sizes(config, layer_idx, layer_type):
    """`(hidden_size, num_attention_heads, num_key_value_heads, head_dim)` of layer `layer_idx`, checked.

    A global layer's heads: transformers 5's `config.per_layer_config[layer_idx]`; in a config.json,
    `global_head_dim` (default 512) and, where `attention_k_eq_v`, `num_global_key_value_heads` (None: as the local
    layers)."""
    per_layer = config_value(config, "per_layer_config", None)
    if per_layer is not None and not isinstance(per_layer, dict):  # transformers' view: every field resolved
        return head_sizes(per_layer[layer_idx])  # (transformers refuses to read a per-layer field off the config)
    hidden_size, num_attention_heads, num_key_value_heads, head_dim = head_sizes(config)
    if per_layer is not None:  # a mapping of overrides by layer index (str keys once saved as JSON)
        overrides = mapping("per_layer_config", per_layer.get(layer_idx, per_layer.get(str(layer_idx))))
        head_dim = overrides.get("head_dim", head_dim)
        num_key_value_heads = overrides.get("num_key_value_heads", num_key_value_heads)
    elif layer_type == "full_attention":
        head_dim = config_value(config, "global_head_dim", DEFAULT_GLOBAL_HEAD_DIM)
        if config_value(config, "attention_k_eq_v", False):
            num_key_value_heads = config_value(config, "num_global_key_value_heads", None) or num_key_value_heads
    check_int("head_dim", head_dim)
    check_int("num_key_value_heads", num_key_value_heads)
    check_heads(num_attention_heads, num_key_value_heads)
    return hidden_size, num_attention_heads, num_key_value_heads, head_dim


def kv_sharing_modes(config, layer_types):
    """Each layer's part in cross-layer K/V sharing, as transformers' `Gemma4TextConfig.kv_sharing_modes`: the last
    `num_kv_shared_layers` layers `"reuse"` the K/V of the last earlier layer of their kind, which `"store"`s them
    (the last layer of each kind before them stores even where none reuses, as transformers marks it); the others
    None. `ValueError` where a kind that reuses has no earlier layer to store for it."""
    num_hidden_layers = len(layer_types)
    num_shared = config_value(config, "num_kv_shared_layers", 0) or 0
    check_int("num_kv_shared_layers", num_shared, minimum=0)
    if num_shared > num_hidden_layers:
        raise ValueError(f"num_kv_shared_layers must be at most num_hidden_layers={num_hidden_layers}, got "
                         f"num_kv_shared_layers={num_shared}")
    if num_shared == num_hidden_layers:  # every layer reads K/V another model left (transformers' assistant models)
        return ["reuse"] * num_hidden_layers
    first_shared = num_hidden_layers - num_shared
    storing = {kind: index for index, kind in enumerate(layer_types[:first_shared])}  # the last of each kind
    missing = sorted(set(layer_types[first_shared:]) - set(storing))
    if missing:
        raise ValueError(f"num_kv_shared_layers={num_shared} leaves no earlier layer of kind {', '.join(missing)} to "
                         f"share its K/V (layer_types={list(layer_types)})")
    modes = [None if index < first_shared else "reuse" for index in range(num_hidden_layers)]
    for index in storing.values():
        modes[index] = "store"
    return modes


def gemma4_rope_parameters(config, layer_type):
    """The RoPE parameters of a Gemma 4 layer, `config.rope_parameters[layer_type]` (transformers' defaults where the
    config has none), as a new dict."""
    parameters = config_value(config, "rope_parameters", None)
    parameters = DEFAULT_ROPE_PARAMETERS if parameters is None else mapping("rope_parameters", parameters)
    if layer_type not in parameters:
        raise ValueError(f"rope_parameters must hold a dict per layer type, lacks {layer_type!r}: "
                         f"rope_parameters={parameters}")
    parameters = mapping(f"rope_parameters[{layer_type!r}]", parameters[layer_type])
    parameters["rope_type"] = parameters.pop("type", None) or parameters.get("rope_type") or "default"
    return parameters


def gemma4_rope_frequencies(head_dim, parameters):
    """RoPE's inverse frequencies `(head_dim / 2,)` (float64, CPU) and the factor cos and sin are multiplied by.

    `"proportional"` (Gemma 4's global layers): the first `int(partial_rotary_factor * head_dim / 2)` pairs turn at
    `rope_theta ** (-2i / head_dim)`, the frequencies they have over the whole head, the others at 0 (cos 1, sin 0:
    unrotated); every frequency is divided by `factor` (default 1). Any other `rope_type` as `rope_frequencies`."""
    if parameters["rope_type"] != "proportional":
        return rope_frequencies(head_dim, parameters)
    check_finite("rope_theta", parameters.get("rope_theta"))
    proportion = parameters.get("partial_rotary_factor", 1.0)
    check_finite("partial_rotary_factor", proportion)
    factor = parameters.get("factor", 1.0)
    check_finite("factor", factor)
    if proportion > 1 or head_dim % 2:
        raise ValueError(f"partial_rotary_factor must be at most 1 and head_dim even, got partial_rotary_factor="
                         f"{proportion}, head_dim={head_dim}")
    rotated_pairs = int(proportion * head_dim // 2)
    pair = torch.arange(head_dim // 2, dtype=torch.float64, device="cpu")
    inv_freq = parameters["rope_theta"] ** (-2 * pair / head_dim)
    inv_freq[rotated_pairs:] = 0.0  # these pairs never turn
    return inv_freq / factor, 1.0


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


# Same as attention/models/llama.py::window_mask
def window_mask(length, sliding_window, device):
    """The causal mask of `length` positions limited to the last `sliding_window` keys, itself included:
    `(T, T)` bool, True = attend; None without a window (plain causal)."""
    if sliding_window is None:
        return None
    positions = torch.arange(length, device=device)
    distance = positions[:, None] - positions[None, :]  # (T, T): query i - key j
    return (distance >= 0) & (distance < sliding_window)


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


# Same as attention/models/llama.py::layer_window
def layer_window(config, layer_type):
    """The window of a sliding layer, `config.sliding_window` (checked: a positive int); None for any other kind."""
    if layer_type != "sliding_attention":
        return None
    sliding_window = config_value(config, "sliding_window")
    check_int("sliding_window", sliding_window)
    return sliding_window


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
