"""Multi-head latent attention (MLA) of DeepSeek-V2, DeepSeek-V3 and Kimi K2: the compressed cache and the absorbed decode.

MLA (DeepSeek-AI, 2024, https://arxiv.org/abs/2405.04434, section 2.1) caches per token and layer one
latent vector `c^KV` (`kv_lora_rank` features) and one rotary key `k^R` (`qk_rope_head_dim` features),
both shared by every head, instead of each head's key and value. The keys' content part and the values
come from the latent through an up-projection (`kv_b_proj`, the paper's `W^UK` and `W^UV`); position
enters through `k^R`, a rotary key shared by all heads and concatenated to each head's content key
("decoupled RoPE": rotating the content keys would tie `W^UK` to each position).

Two ways to attend over that cache, chosen once (`path`):

* `"naive"`: expand every cached latent to per-head keys and values with `kv_b_proj`, then attend, as
  transformers' `DeepseekV3Attention` does (it caches the latent and expands it at every call).
* `"absorbed"`: fold the key up-projection into the query (`q_h W^UK_h`, one `kv_lora_rank`-wide query
  per head) and the value up-projection into the output (attend over the latent, then `W^UV_h`):
  attention runs over the cache itself, one key/value "head" shared by all query heads, as the paper's
  section 2.1.2 describes for inference and DeepSeek's inference code does (`attn_impl="absorb"`).

Both compute the same function; the tests check them against each other, against transformers' layer
and against `attention.reference.reference_latent_attention`, at every decoding step.

The same class serves DeepSeek-V2 (transformers' `DeepseekV2Attention`): the layers have the same
parameters and arithmetic; DeepSeek-V2's rotary embedding always pairs adjacent features, and its
config has no `rope_interleave` field, whose absence this class reads as interleaved.

The file imports only torch and the decoding family (`attention/decoding/`: MLA's `LatentCache` and
`per_head_matmul`); its small helpers (the config reader, RoPE's frequencies and rotations) are marked copies of the
other families'. The end of the file counts what either path costs from a configuration (cache bytes, parameters,
FLOPs, bytes a decode step moves) and holds the published configurations of DeepSeek-V2-Lite,
DeepSeek-V3 and Kimi K2.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from attention.decoding import LatentCache, per_head_matmul

PATHS = ("absorbed", "naive")
# DeepSeek's code builds q_a_layernorm and kv_a_layernorm with RMSNorm's default eps, not the config's
# rms_norm_eps (which only the decoder layer's norms read); transformers does the same.
LATENT_NORM_EPS = 1e-6
REQUIRED = object()  # `config_value`'s default: the field must be present


class DeepseekV3Attention(nn.Module):
    """Multi-head latent attention, causal: `(B, T, hidden_size) -> (B, T, hidden_size)`.

    The model families' contract (`attention.models.ModelAttention`): `from_config`, transformers'
    parameter names (`q_a_proj`, `q_a_layernorm`, `q_b_proj`, or `q_proj` where `q_lora_rank` is None;
    `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`), decoding with `new_cache`.

    Args:
        hidden_size: C, the model's width.
        num_heads: H query heads. MLA has no K/V heads: every head reads the same latent.
        q_lora_rank: width of the compressed query `c^Q`, or None for queries projected directly
            (`q_proj`, DeepSeek-V2-Lite).
        kv_lora_rank: Dc, width of the latent `c^KV` the cache keeps.
        qk_nope_head_dim: Dn, each head's content part of queries and keys (no rotary embedding).
        qk_rope_head_dim: Dr, the rotary part: per head for queries, one for all heads for keys.
        v_head_dim: Dv, each head's value width.
        rope_theta: the rotary base.
        rope_scaling: the config's `rope_parameters` / `rope_scaling` (YaRN for all published MLA
            models), or None.
        rope_interleave: rotary pairs `(2i, 2i + 1)` (True, DeepSeek's layout) or `(i, i + Dr/2)`.
        attention_bias: biases on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj`, as transformers has them.
        path: `"absorbed"` or `"naive"` (see the module docstring): how attention runs, with or
            without a cache. Training (gradients) works on both; a cache is for inference.
        layer_idx: the layer's index in its model (`from_config` sets it), or None: a cache made by
            `new_cache` serves only a layer of the same index.

    Raises `ValueError`/`TypeError` naming the argument for sizes that are not positive ints, an odd
    `qk_rope_head_dim`, RoPE parameters out of range (`rope_theta`, `factor`, ...: see
    `check_rope_parameters`), a `rope_interleave` that is not a bool, or an unknown `path`.
    """

    layer_type = "full_attention"

    def __init__(self, hidden_size, num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                 v_head_dim, *, rope_theta=10000.0, rope_scaling=None, rope_interleave=True, attention_bias=False,
                 path="absorbed", layer_idx=None):
        super().__init__()
        sizes = {"hidden_size": hidden_size, "num_heads": num_heads, "kv_lora_rank": kv_lora_rank,
                 "qk_nope_head_dim": qk_nope_head_dim, "qk_rope_head_dim": qk_rope_head_dim, "v_head_dim": v_head_dim}
        if q_lora_rank is not None:
            sizes["q_lora_rank"] = q_lora_rank
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (rotary pairs), got qk_rope_head_dim={qk_rope_head_dim}")
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got path={path!r}")
        if not isinstance(rope_interleave, bool):
            raise TypeError(f"rope_interleave must be a bool, got rope_interleave={rope_interleave!r}")
        if layer_idx is not None:
            check_int("layer_idx", layer_idx, minimum=0)
        scaling = mapping("rope_scaling", rope_scaling)
        rope = {**scaling, "rope_type": scaling.get("rope_type", scaling.get("type", "default")), "rope_theta": rope_theta}
        # Checked (check_rope_parameters) before any weight is made. Float64 on the CPU and not a buffer:
        # `module.to(torch.float32)` would round the frequencies. `rope_tables` keeps a copy per device.
        self.inv_freq, self.attention_scaling = rope_frequencies(qk_rope_head_dim, rope)
        self.rope_tables = {}
        self.layer_idx = layer_idx
        self.hidden_size, self.num_heads, self.q_lora_rank, self.kv_lora_rank = hidden_size, num_heads, q_lora_rank, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.rope_interleave, self.path = rope_interleave, path
        qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        if q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, num_heads * qk_head_dim, bias=False)
        else:  # queries through a low-rank bottleneck too (paper eqs. 12-13): W^DQ, its norm, then W^UQ and W^QR in one
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=attention_bias)
            self.q_a_layernorm = RMSNorm(q_lora_rank)
            self.q_b_proj = nn.Linear(q_lora_rank, num_heads * qk_head_dim, bias=False)
        # W^DKV and W^KR in one (eqs. 9 and 15): the latent and the shared rotary key, what the cache keeps
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim, bias=attention_bias)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank)
        # W^UK and W^UV (eqs. 10-11), head by head: rows h*(Dn+Dv) .. h*(Dn+Dv)+Dn-1 are head h's key part
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * v_head_dim, hidden_size, bias=attention_bias)
        self.scaling = softmax_scale(qk_head_dim, rope_scaling)

    @classmethod
    def from_config(cls, config, layer_idx=0, *, path="absorbed"):
        """The attention of layer `layer_idx` of a DeepSeek-V2/V3 (or Kimi K2) configuration.

        `config`: transformers' config object or a mapping with its field names (a published
        `config.json`, which has `rope_theta` and `rope_scaling` where transformers 5 has
        `rope_parameters`). Every layer of these models has the same attention.
        """
        args, kwargs = cls.config_arguments(config, layer_idx)
        return cls(*args, **kwargs, path=path)

    @staticmethod
    def config_arguments(config, layer_idx):
        """`(args, kwargs)` of MLA's constructor read from `config` for layer `layer_idx` (all but `path`), each field
        checked: `from_config` here and in DeepSeek-V3.2's layer, which adds its indexer's."""
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
            raise ValueError(f"layer_idx must be a non-negative int, got layer_idx={layer_idx!r}")
        num_layers = config_value(config, "num_hidden_layers", None)
        if num_layers is not None and layer_idx >= num_layers:
            raise ValueError(f"layer_idx must be below num_hidden_layers={num_layers}, got layer_idx={layer_idx}")
        check_no_dropout(config)
        rope_parameters = config_value(config, "rope_parameters", None)
        if rope_parameters is None:  # a config.json as published
            rope_theta, rope_scaling = config_value(config, "rope_theta"), config_value(config, "rope_scaling", None)
        else:  # its rope_theta, if absent, is named missing by check_rope_parameters
            rope_scaling = mapping("rope_parameters", rope_parameters)
            rope_theta = rope_scaling.get("rope_theta")
        args = [config_value(config, name) for name in ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
                                                        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")]
        return args, dict(rope_theta=rope_theta, rope_scaling=rope_scaling,
                          rope_interleave=config_value(config, "rope_interleave", True),
                          attention_bias=config_value(config, "attention_bias", False), layer_idx=layer_idx)

    def forward(self, x, cache=None):
        """`x` `(B, T, hidden_size)` -> `(B, T, hidden_size)`; with `cache`, `x` continues the cached sequence."""
        check_input(x, self.hidden_size, self.o_proj.weight.dtype)
        B, T, C = x.shape
        H, Dn, Dr, Dc = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
        start = 0 if cache is None else cache.length
        if self.q_lora_rank is None:
            q = self.q_proj(x)  # (B, T, H*(Dn+Dr))
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))  # (B, T, q_lora_rank) -> (B, T, H*(Dn+Dr))
        q = q.view(B, T, H, Dn + Dr).transpose(1, 2)  # (B, H, T, Dn+Dr)
        q_nope, q_rope = q.split([Dn, Dr], dim=-1)  # (B, H, T, Dn), (B, H, T, Dr)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([Dc, Dr], dim=-1)  # (B, T, Dc), (B, T, Dr)
        latent = self.kv_a_layernorm(latent).unsqueeze(1)  # (B, 1, T, Dc): one "head", read by every query head
        k_rope = k_rope.unsqueeze(1)  # (B, 1, T, Dr)
        q_rope = self.rotary(q_rope, start)  # (B, H, T, Dr)
        k_rope = self.rotary(k_rope, start)  # (B, 1, T, Dr): rotated once, cached rotated
        if cache is None:
            positions = torch.arange(T, device=x.device)
            mask = positions[:, None] >= positions[None, :]  # (T, T): causal, True = attend
        else:
            check_cache(self, cache, x)
            latent, k_rope, mask = cache.update(latent, k_rope)  # (B, 1, S, Dc), (B, 1, S, Dr), (T, S) or None
        attend = self.attend_naive if self.path == "naive" else self.attend_absorbed
        attn_output = attend(q_nope, q_rope, latent, k_rope, mask)  # (B, H, T, Dv)
        attn_output = attn_output.transpose(1, 2).reshape(B, T, H * self.v_head_dim)  # (B, T, H*Dv)
        return self.o_proj(attn_output)  # (B, T, C)

    def attend_naive(self, q_nope, q_rope, latent, k_rope, mask):
        """Expand the latent of every position to each head's key and value, then attend: `(B, H, T, Dv)`."""
        B, H, T, _ = q_nope.shape
        S, Dn, Dr, Dv = latent.shape[2], self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        kv = self.kv_b_proj(latent).view(B, S, H, Dn + Dv).transpose(1, 2)  # (B, 1, S, Dc) -> (B, H, S, Dn+Dv)
        k_nope, v = kv.split([Dn, Dv], dim=-1)  # (B, H, S, Dn), (B, H, S, Dv)
        k = torch.cat([k_nope, k_rope.expand(B, H, S, Dr)], dim=-1)  # (B, H, S, Dn+Dr): the rotary key shared by all heads
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, Dn+Dr)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)  # (B, H, T, Dv)

    def attend_absorbed(self, q_nope, q_rope, latent, k_rope, mask):
        """Attend over the latent itself, the up-projections folded into the query and the output: `(B, H, T, Dv)`.

        `q_h · (W^UK_h c) = (q_h W^UK_h) · c` and `Σ_j p_j W^UV_h c_j = W^UV_h Σ_j p_j c_j`: every head
        reads the same cached `c` and `k^R`, so the heads fold into the query rows of one matmul
        (multi-query attention with keys `Dc + Dr` wide and values `Dc` wide).
        """
        B, H, T, _ = q_nope.shape
        S, Dn, Dr, Dv, Dc = latent.shape[2], self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim, self.kv_lora_rank
        w_kv = self.kv_b_proj.weight.view(H, Dn + Dv, Dc)  # (H*(Dn+Dv), Dc) -> (H, Dn+Dv, Dc)
        w_uk, w_uv = w_kv[:, :Dn], w_kv[:, Dn:]  # (H, Dn, Dc), (H, Dv, Dc)
        q_latent = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk)  # (B, H, T, Dc): the key up-projection folded into the query
        # The cache's one "head" read as it lies, per sequence in bfloat16 on the CPU (`per_head_matmul`): there a
        # batched matmul over the cache's slice ran ten times slower than over a contiguous cache.
        scores = (per_head_matmul(q_latent.reshape(B, 1, H * T, Dc), latent.transpose(2, 3))  # (B, 1, H*T, Dc) @ (B, 1, Dc, S) -> (B, 1, H*T, S)
                  + per_head_matmul(q_rope.reshape(B, 1, H * T, Dr), k_rope.transpose(2, 3)))  # (B, 1, H*T, Dr) @ (B, 1, Dr, S) -> (B, 1, H*T, S)
        scores = scores.view(B, H, T, S) * self.scaling  # (B, H, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))  # (T, S) broadcast over B, H
        # Low-precision scores are normalised in float32 (as SDPA does); float64 stays float64.
        attn_weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
        attn_weights = attn_weights.to(scores.dtype)  # (B, H, T, S)
        if mask is not None:  # a query with no key to attend to: zeros, not the NaN of a softmax over nothing
            attn_weights = attn_weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        context_latent = per_head_matmul(attn_weights.view(B, 1, H * T, S), latent)  # (B, 1, H*T, S) @ (B, 1, S, Dc) -> (B, 1, H*T, Dc)
        context_latent = context_latent.view(B, H, T, Dc)  # (B, H, T, Dc)
        return torch.einsum("bhtc,hvc->bhtv", context_latent, w_uv)  # (B, H, T, Dv): the value up-projection, after attention

    def rotary(self, x, start):
        """`x` `(B, heads, T, Dr)` at positions `start ..` rotated, times YaRN's attention factor: pairs `(2i, 2i + 1)`
        when `rope_interleave` (DeepSeek's layout), else `(i, i + Dr/2)`. Queries and keys rotate alike, so either
        layout gives the same scores for the same weights' pair order."""
        T = x.shape[2]
        if self.rope_interleave:
            return apply_rotary_interleaved(x, *interleaved_cos_sin(self, start, T, x))  # cos, sin (T, Dr/2)
        return apply_rotary(x, *rotary_cos_sin(self, start, T, x))  # cos, sin (T, Dr)

    def new_cache(self, batch_size, capacity):
        """An empty `LatentCache` for `batch_size` sequences of up to `capacity` positions, on the module's device and dtype."""
        weight = self.kv_b_proj.weight
        cache = LatentCache(batch_size, self.kv_lora_rank, self.qk_rope_head_dim, capacity, dtype=weight.dtype,
                            device=weight.device)
        cache.layer = (type(self).__name__, self.layer_idx)  # check_cache refuses it to any other layer
        return cache


class RMSNorm(nn.Module):
    """`weight * x / sqrt(mean(x²) + eps)` over the last dimension, computed in float32 or wider."""

    def __init__(self, size, eps=LATENT_NORM_EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # bfloat16 -> float32; float64 stays float64
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def softmax_scale(qk_head_dim, rope_scaling):
    """`1 / sqrt(qk_head_dim)`, times `mscale²` where the config's YaRN scaling has `mscale_all_dim`.

    YaRN (https://arxiv.org/abs/2309.00071) sharpens attention at extended contexts by `0.1 ln(factor) + 1`;
    DeepSeek's code scales every score by the square of it at `mscale_all_dim`, and multiplies the
    rotary parts of queries and keys by the rotary embedding's attention factor, `mscale / mscale_all_dim`
    (1 in the published configurations, whose two are equal).
    """
    scale = qk_head_dim ** -0.5
    if not rope_scaling or rope_scaling.get("rope_type", rope_scaling.get("type", "default")) == "default":
        return scale
    mscale_all_dim, factor = rope_scaling.get("mscale_all_dim"), rope_scaling["factor"]
    if mscale_all_dim and factor > 1:
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


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


def check_cache(module, cache, x):
    """Raise a clear error unless `cache` fits `module` and `x`, and gradients are off (a cache is for inference)."""
    if not isinstance(cache, LatentCache):
        raise TypeError(f"cache must come from new_cache(), got {type(cache).__name__}")
    B, _, _, Dc = cache.latent.shape
    if (Dc, cache.rope_keys.shape[-1]) != (module.kv_lora_rank, module.qk_rope_head_dim):
        raise ValueError(f"cache holds latents of {Dc} and rotary keys of {cache.rope_keys.shape[-1]}, the module has "
                         f"kv_lora_rank={module.kv_lora_rank}, qk_rope_head_dim={module.qk_rope_head_dim}")
    if x.shape[0] != B:
        raise ValueError(f"x has batch size {x.shape[0]}, the cache was made for batch_size={B}")
    if cache.latent.dtype != x.dtype or cache.latent.device != x.device:
        raise ValueError(f"cache is {cache.latent.dtype} on {cache.latent.device}, x is {x.dtype} on {x.device}")
    layer = (type(module).__name__, module.layer_idx)
    if cache.layer != layer:
        made_by = "no layer's new_cache()" if cache.layer is None else f"{cache.layer[0]} layer {cache.layer[1]}"
        raise ValueError(f"cache was made by {made_by}, not by this layer ({layer[0]} layer {layer[1]})")
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in module.parameters())):
        raise ValueError("a cache is for inference: call the module under torch.no_grad() or torch.inference_mode()")


# Same as attention/models/llama.py::check_no_dropout
def check_no_dropout(config):
    """Raise a clear error for a config with attention dropout: these layers have none (every published config: 0.0)."""
    dropout = config_value(config, "attention_dropout", 0.0) or 0.0
    if dropout != 0:
        raise ValueError(f"attention_dropout must be 0.0 (these layers have no attention dropout), got {dropout}")


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


# Same as attention/models/llama4.py::interleaved_cos_sin
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


# Same as attention/positional/rotary.py::rotate_half
def rotate_half(x):
    """`(x1, x2) -> (-x2, x1)` on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


# Same as attention/positional/rotary.py::apply_rotary
def apply_rotary(x, cos, sin):
    """Rotate each pair `(x[..., i], x[..., i + D/2])` of `(B, H, T, D)` `x` by its position's angle."""
    return x * cos + rotate_half(x) * sin  # (B, H, T, D)


# Same as attention/models/llama4.py::apply_rotary_interleaved
def apply_rotary_interleaved(x, cos, sin):
    """`x` `(B, heads, T, D)` rotated pair by pair in Meta's layout: `(x_2i, x_2i+1)` turns by the angle of pair `i`."""
    even, odd = x[..., 0::2], x[..., 1::2]  # (B, heads, T, D/2) each
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)  # (B, heads, T, D)


# ---- What it costs, counted from a configuration (per layer; the tests check each count against the code) ----

# The published configurations, attention fields as typed from each model's config.json (no network at build).
# The rest of each model (experts, vocabulary) does not change its attention layers.
PUBLISHED_CONFIGS = {
    "DeepSeek-V2-Lite": {
        "source": "https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json",
        "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
        "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "max_position_embeddings": 163840, "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    },
    "DeepSeek-V3": {
        "source": "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "max_position_embeddings": 163840, "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    },
    "Kimi K2": {
        "source": "https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json",
        "model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 64,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "max_position_embeddings": 131072, "rope_theta": 50000.0,
        "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    },
}


def latent_config(num_heads, head_dim):
    """DeepSeek-V3's attention at `num_heads` heads of `head_dim` (hidden size `num_heads * head_dim`), its other widths
    in units of its head size 128: latent 4 (512), rotary key 1/2 (64), compressed query 12 (1536). The benchmark's
    MLA rows use it (decode and prefill), at the sizes of the other layers they stand beside. `ValueError` unless
    `head_dim` is divisible by 4 (the rotary key is `head_dim / 2` wide, rotated in pairs)."""
    if head_dim % 4:
        raise ValueError(f"head_dim must be divisible by 4 for MLA (rotary key head_dim / 2, in pairs), got {head_dim}")
    return PUBLISHED_CONFIGS["DeepSeek-V3"] | dict(
        hidden_size=num_heads * head_dim, num_attention_heads=num_heads, q_lora_rank=12 * head_dim,
        kv_lora_rank=4 * head_dim, qk_nope_head_dim=head_dim, qk_rope_head_dim=head_dim // 2, v_head_dim=head_dim)


def latent_cache_bytes_per_token(config, dtype):
    """Bytes one position takes in one sequence's `LatentCache`, per layer: `(kv_lora_rank + qk_rope_head_dim) * element size`."""
    width = config_value(config, "kv_lora_rank") + config_value(config, "qk_rope_head_dim")
    return width * torch.empty((), dtype=dtype).element_size()


def kv_cache_bytes_per_token(config, num_kv_heads, dtype):
    """Bytes one position would take per layer in the KV cache of attention with the same query heads and
    `num_kv_heads` K/V heads (`num_attention_heads`: MHA; 8: GQA with 8 groups; 1: MQA).

    Keys and values of `v_head_dim` each (the paper's per-head `d_h`, its Table 1: MHA caches `2 n_h d_h`
    values per token and layer, GQA `2 n_g d_h`, MQA `2 d_h`), as `attention.decoding.KVCache` holds them.
    """
    return 2 * num_kv_heads * config_value(config, "v_head_dim") * torch.empty((), dtype=dtype).element_size()


def layer_parameters(config):
    """Parameters of one attention layer built from `config` (biases included where `attention_bias`)."""
    C, H, q_rank = config_value(config, "hidden_size"), config_value(config, "num_attention_heads"), config_value(config, "q_lora_rank")
    Dc, Dn, Dr, Dv = (config_value(config, name) for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    bias = bool(config_value(config, "attention_bias", False))
    queries = C * H * (Dn + Dr) if q_rank is None else C * q_rank + bias * q_rank + q_rank + q_rank * H * (Dn + Dr)
    latent = C * (Dc + Dr) + bias * (Dc + Dr) + Dc  # kv_a_proj_with_mqa, kv_a_layernorm
    return queries + latent + Dc * H * (Dn + Dv) + H * Dv * C + bias * C  # + kv_b_proj, o_proj


def latent_attention_flops(config, new_tokens, context, path):
    """Matmul FLOPs of one sequence's call: `new_tokens` queries attending over `context` positions.

    `context` counts every position attended, the new tokens' own included (a decode step after `L`
    cached tokens: `new_tokens=1, context=L + 1`). The score matmuls are counted whole, `new_tokens x
    context`, as both paths compute them (the causal mask then discards part). Norms, rotations and
    softmax are not matmuls and are left out. Per path:

    * both: the queries (`q_proj`, or `q_a_proj` then `q_b_proj`), `kv_a_proj_with_mqa`, `o_proj`;
    * `"naive"`: `kv_b_proj` over all `context` latents (`2 * context * Dc * H * (Dn + Dv)`), then
      scores `2 * H * T * S * (Dn + Dr)` and weighted values `2 * H * T * S * Dv`;
    * `"absorbed"`: `W^UK` folded into the queries (`2 * H * T * Dn * Dc`), scores over the latent and
      the rotary key `2 * H * T * S * (Dc + Dr)`, weighted latents `2 * H * T * S * Dc`, then `W^UV`
      (`2 * H * T * Dc * Dv`).
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got path={path!r}")
    if new_tokens <= 0 or context < new_tokens:
        raise ValueError(f"need 0 < new_tokens <= context, got new_tokens={new_tokens}, context={context}")
    C, H, q_rank = config_value(config, "hidden_size"), config_value(config, "num_attention_heads"), config_value(config, "q_lora_rank")
    Dc, Dn, Dr, Dv = (config_value(config, name) for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    T, S = new_tokens, context
    queries = 2 * T * C * H * (Dn + Dr) if q_rank is None else 2 * T * (C * q_rank + q_rank * H * (Dn + Dr))
    projections = queries + 2 * T * C * (Dc + Dr) + 2 * T * H * Dv * C  # + kv_a_proj_with_mqa, o_proj
    if path == "naive":
        return projections + 2 * S * Dc * H * (Dn + Dv) + 2 * H * T * S * (Dn + Dr) + 2 * H * T * S * Dv
    return projections + 2 * H * T * Dn * Dc + 2 * H * T * S * (Dc + Dr) + 2 * H * T * S * Dc + 2 * H * T * Dc * Dv


def decode_step_bytes(config, context, batch_size, dtype, path):
    """Bytes a decode step moves at least, one new token per sequence attending over `context` positions.

    Both paths read the layer's weights once and each sequence's cache (`context` positions of the
    latent and the rotary key). The naive path also writes each sequence's expanded keys and values
    (`context * H * (Dn + Dr + Dv)` values) and reads them back to attend.
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got path={path!r}")
    element_size = torch.empty((), dtype=dtype).element_size()
    read = layer_parameters(config) * element_size + batch_size * context * latent_cache_bytes_per_token(config, dtype)
    if path == "absorbed":
        return read
    H = config_value(config, "num_attention_heads")
    Dn, Dr, Dv = (config_value(config, name) for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    return read + 2 * batch_size * context * H * (Dn + Dr + Dv) * element_size
