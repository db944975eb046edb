"""The float64 reference every implementation is tested against.

Plain PyTorch in float64, written for clarity, not speed: one explicit score matrix, one masked
softmax over the keys. It reads weights in the canonical form (`query.weight`, `key.weight`,
`value.weight`, `out.weight`, optional biases) that every implementation exports. Implementations
never import it; the tests and the benchmark's correctness check do.
"""

import math

import torch


def reference_attention(query, key, value, state, num_heads, mask=None, attn_bias=None, rope_base=None):
    """Multi-head attention in float64.

    Args:
        query: `(B, Tq, d_in)`.
        key, value: `(B, Tk, d_in)`.
        state: canonical weights: `{query,key,value}.weight` `(d_out, d_in)`, `out.weight`
            `(d_out, d_out)`, and optionally the matching `.bias` entries.
        num_heads: H; head_dim D = d_out / H.
        mask: boolean, True = attend, broadcastable to `(B, H, Tq, Tk)`. A query with no key to
            attend to gets zero weights and a zero attention output.
        attn_bias: additive score bias broadcastable to `(B, H, Tq, Tk)` (ALiBi).
        rope_base: if given, rotate each pair `(i, i + D/2)` of queries and keys by the angle
            `position * rope_base ** (-2i / D)` (rotary embeddings, rotate-half layout).

    Returns:
        `(out, weights)`: `(B, Tq, d_out)` and `(B, H, Tq, Tk)`, both float64.
    """
    f64 = {name: tensor.to(torch.float64) for name, tensor in state.items()}
    query, key, value = (t.to(torch.float64) for t in (query, key, value))

    def project(x, name):
        y = x @ f64[f"{name}.weight"].T
        return y + f64[f"{name}.bias"] if f"{name}.bias" in f64 else y

    def split(x):  # (B, T, H*D) -> (B, H, T, D)
        B, T, C = x.shape
        return x.reshape(B, T, num_heads, C // num_heads).permute(0, 2, 1, 3)

    q, k, v = split(project(query, "query")), split(project(key, "key")), split(project(value, "value"))
    head_dim = q.shape[-1]
    if rope_base is not None:
        q, k = rotate_pairs(q, rope_base), rotate_pairs(k, rope_base)

    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)  # (B, H, Tq, Tk)
    if attn_bias is not None:
        scores = scores + attn_bias.to(torch.float64)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
    exp_scores = torch.exp(scores - row_max)  # exp(-inf) = 0 for masked keys
    row_sum = exp_scores.sum(dim=-1, keepdim=True)
    weights = torch.where(row_sum > 0, exp_scores / row_sum.clamp_min(1e-300), torch.zeros_like(exp_scores))

    context = weights @ v  # (B, H, Tq, D)
    B, H, Tq, D = context.shape
    context = context.permute(0, 2, 1, 3).reshape(B, Tq, H * D)
    return project(context, "out"), weights


def rotate_pairs(x, base):
    """Rotate the pair `(x[..., i], x[..., i + D/2])` at position t by `t * base ** (-2i / D)`; x is `(B, H, T, D)`."""
    T, D = x.shape[-2], x.shape[-1]
    half = D // 2
    i = torch.arange(half, dtype=torch.float64)
    t = torch.arange(T, dtype=torch.float64)
    theta = t[:, None] * base ** (-2 * i / D)[None, :]  # (T, D/2)
    cos, sin = torch.cos(theta), torch.sin(theta)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


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
