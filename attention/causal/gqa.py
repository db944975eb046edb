"""Grouped-query and multi-query causal self-attention on SDPA, decoding with a KV cache.

Grouped-query attention (GQA, Ainslie et al., 2023, https://arxiv.org/abs/2305.13245) keeps
`num_heads` query heads but only `num_kv_heads` key/value heads: each K/V head is shared by a group
of `num_heads // num_kv_heads` consecutive query heads. `num_kv_heads == num_heads` is ordinary
multi-head attention; `num_kv_heads == 1` is multi-query attention (MQA, Shazeer, 2019,
https://arxiv.org/abs/1911.02150). Llama 3, Mistral, Gemma 2 and Qwen use GQA: the key and value
projections shrink, and so does the KV cache that decoding reads at every step.

Decoding with a cache: `cache = module.new_cache(batch_size, capacity)`, then `module(x, cache=cache)`
projects `x`'s keys and values, appends them to the cache and attends from `x`'s queries over
everything cached. A prompt goes in one call (prefill), then one token per call, or chunks.
`new_cache(batch_size, window=w, sinks=s)` keeps only the first `s` positions and the last `w`
(a sliding window with attention sinks), so memory stays fixed however long the sequence grows.

The caches and the kernels that attend over them are the decoding family's (`attention/decoding/`), which
this file imports: copy that folder with it.
"""

import torch
import torch.nn.functional as F
from torch import nn

from attention.decoding import (KVCache, SlidingWindowKVCache, check_decode_kernel, decode_linear, decode_path,
                                grouped_decode_attention)

KV_STRATEGIES = ("enable_gqa", "repeat")


class GroupedQueryAttention(nn.Module):
    """Causal grouped-query self-attention on `F.scaled_dot_product_attention`: `(B, T, d_in) -> (B, T, d_out)`.

    The family's constructor, shapes and canonical state dict (`attention.causal.CausalSelfAttention`),
    except that `key.weight` and `value.weight` (and biases) have `num_kv_heads * head_dim` rows.

    Keywords:
        num_kv_heads: K/V heads; must divide `num_heads`. `None` takes groups of 4 query heads per K/V
            head (as Llama 3 8B and Mistral 7B do), or of 2 where 4 does not divide `num_heads`, or
            plain multi-head attention where neither does.
        kv_strategy: how SDPA meets the smaller K/V: `"enable_gqa"` (SDPA's own `enable_gqa=True`,
            PyTorch >= 2.5: the kernel maps each query head to its K/V head without copying) or
            `"repeat"` (copy each K/V head `num_heads // num_kv_heads` times, then plain SDPA).
        decode_kernel: what attends over a cache: `"sdpa"`, `"matmul"` (`grouped_decode_attention`: two
            matmuls that read each cached K/V head once for its whole group of query heads; they write
            out the `(S, group * T)` scores, so they suit few new tokens) or `"auto"`: for calls of at most
            `attention.decoding.AUTO_MATMUL_MAX_TOKENS` new tokens, the faster of the two on this machine,
            timed on the first call of each shape class (`attention.decoding.decode_path`; SDPA's CPU kernel
            reads the cache once per query head, which the matmuls avoid, but which wins depends on the CPU),
            and likewise a single row's projections (`decode_linear`); `"sdpa"` for longer calls. Without a
            cache, SDPA runs.
    """

    position_encoding = None

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, *, num_kv_heads=None,
                 kv_strategy="enable_gqa", decode_kernel="auto"):
        super().__init__()
        init_sizes(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        num_kv_heads = resolve_kv_heads(num_heads, num_kv_heads)
        if kv_strategy not in KV_STRATEGIES:
            raise ValueError(f"kv_strategy must be one of {KV_STRATEGIES}, got kv_strategy={kv_strategy!r}")
        self.num_kv_heads, self.kv_strategy = num_kv_heads, kv_strategy
        self.decode_kernel = check_decode_kernel(decode_kernel)
        kv_dim = num_kv_heads * self.head_dim
        self.query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.key = nn.Linear(d_in, kv_dim, bias=qkv_bias)  # num_kv_heads heads, not num_heads
        self.value = nn.Linear(d_in, kv_dim, bias=qkv_bias)
        self.out = nn.Linear(d_out, d_out)
        self.dropout_p = dropout  # a probability: SDPA applies it itself

    def forward(self, x, cache=None):
        """`x` `(B, T, d_in)` -> `(B, T, d_out)`; with `cache`, `x` continues the cached sequence."""
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        H, H_kv, D = self.num_heads, self.num_kv_heads, self.head_dim
        # Over a cache, one token of one sequence makes each projection a matrix-vector product, which the CPU's BLAS
        # may run on one thread: `decode_linear` splits it into a batch where that is faster (`decode_kernel`).
        project = (lambda layer, inputs: decode_linear(layer, inputs, self.decode_kernel)) if cache is not None else (
            lambda layer, inputs: layer(inputs))
        q = project(self.query, x).view(B, T, H, D).transpose(1, 2)  # (B, T, H*D) -> (B, H, T, D)
        k = project(self.key, x).view(B, T, H_kv, D).transpose(1, 2)  # (B, T, H_kv*D) -> (B, H_kv, T, D)
        v = project(self.value, x).view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
        dropout_p = self.dropout_p if self.training else 0.0  # SDPA has no train/eval switch of its own
        if cache is None:
            keys, values, mask, path = k, v, None, "sdpa"
        else:
            check_cache(self, cache, x)
            keys, values, mask = cache.update(k, v)  # (B, H_kv, S, D) each; mask (T, S) or None
            path = decode_path(self.decode_kernel, q, keys, values, mask, dropout_p)  # "sdpa" or "matmul"
        if path == "matmul":
            attn_output = grouped_decode_attention(q, keys, values, mask, dropout_p)  # (B, H, T, D)
        else:
            if self.kv_strategy == "repeat" and H_kv != H:
                keys = keys.repeat_interleave(H // H_kv, dim=1)  # (B, H_kv, S, D) -> (B, H, S, D): head h reads K/V head h // group
                values = values.repeat_interleave(H // H_kv, dim=1)  # (B, H, S, D)
            # is_causal=True would align the mask top-left: wrong once the cache holds a past
            attn_output = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout_p,
                                                         is_causal=cache is None, enable_gqa=keys.shape[1] != H)  # (B, H, T, D)
        attn_output = attn_output.transpose(1, 2).reshape(B, T, self.d_out)  # (B, T, H*D)
        return project(self.out, attn_output)  # (B, T, d_out)

    def new_cache(self, batch_size, capacity=None, *, window=None, sinks=0):
        """An empty KV cache for `batch_size` sequences, on the module's device and dtype.

        `capacity` positions in all (a `KVCache`, at most `context_length`), or, with `window`, the first
        `sinks` positions and the last `window` (a `SlidingWindowKVCache`, for any length).
        """
        weight = self.key.weight
        sizes = dict(batch_size=batch_size, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                     dtype=weight.dtype, device=weight.device)
        if window is None:
            if capacity is None:
                raise ValueError("new_cache needs capacity (a full cache) or window (a sliding-window cache)")
            if isinstance(capacity, int) and capacity > self.context_length:
                raise ValueError(f"capacity must be at most context_length={self.context_length}, got capacity={capacity}")
            if sinks:
                raise ValueError(f"sinks apply to a sliding-window cache: pass window too, got sinks={sinks}")
            return KVCache(capacity=capacity, **sizes)
        if capacity is not None:
            raise ValueError(f"pass capacity or window, not both: got capacity={capacity}, window={window}")
        return SlidingWindowKVCache(window=window, sinks=sinks, **sizes)

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.canonical_state_dict
    def canonical_state_dict(self):
        """The weights under the names every implementation shares (`attention.causal.CausalSelfAttention`)."""
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    def load_canonical_state_dict(self, state):
        """Load the canonical state dict, with `num_kv_heads * head_dim` rows in `key.*` and `value.*`."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias, kv_dim=self.num_kv_heads * self.head_dim)
        self.load_state_dict(state)


class MultiQueryAttention(GroupedQueryAttention):
    """Causal multi-query self-attention: grouped-query attention with one K/V head for all query heads."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, *, kv_strategy="enable_gqa",
                 decode_kernel="auto"):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias, num_kv_heads=1,
                         kv_strategy=kv_strategy, decode_kernel=decode_kernel)


def resolve_kv_heads(num_heads, num_kv_heads):
    """`num_kv_heads` checked against `num_heads` (a clear error unless it divides it); `None` picks the default."""
    if num_kv_heads is None:
        return num_heads // next(group for group in (4, 2, 1) if num_heads % group == 0)
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int):
        raise TypeError(f"num_kv_heads must be an int, got num_kv_heads={num_kv_heads!r}")
    if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_kv_heads must be a positive divisor of num_heads, got num_kv_heads={num_kv_heads}, "
                         f"num_heads={num_heads}")
    return num_kv_heads


def check_cache(module, cache, x):
    """Raise a clear error unless `cache` keeps the KV-cache contract (`attention.decoding.DecodingCache`: `length`,
    `nbytes`, `update`, `rewind`), fits `module` and `x` where it shows its tensors, and gradients are off."""
    missing = [name for name in ("length", "nbytes", "update", "rewind") if not hasattr(cache, name)]
    if missing:
        raise TypeError(f"cache must come from new_cache() or keep the KV-cache contract (length, nbytes, update, "
                        f"rewind), got {type(cache).__name__} without {', '.join(missing)}")
    keys = getattr(cache, "keys", None)  # this file's caches show their tensors; a cache of the contract alone need not
    if isinstance(keys, torch.Tensor):
        B, H_kv, _, D = keys.shape
        if (H_kv, D) != (module.num_kv_heads, module.head_dim):
            raise ValueError(f"cache holds {H_kv} K/V heads of size {D}, the module has num_kv_heads="
                             f"{module.num_kv_heads}, head_dim={module.head_dim}")
        if x.shape[0] != B:
            raise ValueError(f"x has batch size {x.shape[0]}, the cache was made for batch_size={B}")
        if keys.dtype != x.dtype or keys.device != x.device:
            raise ValueError(f"cache is {keys.dtype} on {keys.device}, x is {x.dtype} on {x.device}")
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in module.parameters())):
        raise ValueError("a KV cache is for inference: call the module under torch.no_grad() or torch.inference_mode()")


# Same as attention/causal/split_heads.py::init_sizes
def init_sizes(module, d_in, d_out, context_length, dropout, num_heads, qkv_bias):
    """Check the family's constructor arguments (clear errors) and keep the sizes on `module`."""
    check_init_args(d_in, d_out, context_length, dropout, num_heads)
    module.d_in, module.d_out, module.context_length = d_in, d_out, context_length
    module.num_heads, module.head_dim, module.qkv_bias = num_heads, d_out // num_heads, qkv_bias


# Same as attention/causal/split_heads.py::check_init_args
def check_init_args(d_in, d_out, context_length, dropout, num_heads):
    """Raise a clear error for constructor arguments that cannot build the module."""
    sizes = {"d_in": d_in, "d_out": d_out, "context_length": context_length, "num_heads": num_heads}
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {name}={value!r}")
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {name}={value}")
    if d_out % num_heads != 0:
        raise ValueError(f"d_out must be divisible by num_heads, got d_out={d_out}, num_heads={num_heads}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise TypeError(f"dropout must be a float, got dropout={dropout!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got dropout={dropout}")


# Same as attention/causal/split_heads.py::check_input
def check_input(x, d_in, context_length):
    """Raise a clear error unless `x` is a floating `(B, T, d_in)` tensor with 0 < T <= context_length."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got x.dtype={x.dtype}")
    if x.dim() != 3 or x.shape[-1] != d_in:
        raise ValueError(f"x must have shape (B, T, d_in={d_in}), got x.shape={tuple(x.shape)}")
    if not 0 < x.shape[1] <= context_length:
        raise ValueError(f"sequence length T must be in [1, context_length={context_length}], got T={x.shape[1]}")


def check_canonical_state(state, d_in, d_out, qkv_bias, kv_dim):
    """Raise a clear error unless `state` holds exactly the canonical keys with the right shapes (K/V: `kv_dim` rows)."""
    shapes = {"query.weight": (d_out, d_in), "key.weight": (kv_dim, d_in), "value.weight": (kv_dim, d_in),
              "out.weight": (d_out, d_out), "out.bias": (d_out,)}
    if qkv_bias:
        shapes.update({"query.bias": (d_out,), "key.bias": (kv_dim,), "value.bias": (kv_dim,)})
    missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or extra:
        raise ValueError(f"canonical state dict: missing keys {missing}, unexpected keys {extra}")
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"canonical state dict: {name} must have shape {shape}, got {tuple(state[name].shape)}")
