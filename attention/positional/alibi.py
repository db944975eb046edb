"""ALiBi: attention with linear biases (Press et al., 2022, https://arxiv.org/abs/2108.12409).

No position is added to the inputs. Instead head h adds `-m_h * (i - j)` to the score of query i
and key j: the further back a key, the lower its score, at a rate `m_h` fixed per head. The slopes
form a geometric sequence, so some heads look far back and others stay local.
"""

import math

import torch


def alibi_slopes(num_heads):
    """The per-head ALiBi slopes `m_h` of the paper, `(num_heads,)` float64.

    For a power of two n: the geometric sequence `2 ** (-8 / n), 2 ** (-16 / n), ..., 2 ** -8`
    (n = 8 gives 1/2, 1/4, ..., 1/256). Otherwise the slopes of the closest smaller power of two,
    followed by every other slope of twice that power (the paper's reference code,
    https://github.com/ofirpress/attention_with_linear_biases).
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got num_heads={num_heads!r}")

    def power_of_two_slopes(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))  # 2 ** (-8 / n)
        return [start * start ** i for i in range(n)]

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two_slopes(closest)
    if closest < num_heads:
        slopes += power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float64)  # (H,)


def alibi_bias(num_heads, q_len, kv_len, causal=True, device=None, dtype=torch.float32):
    """The additive ALiBi score bias, `(num_heads, q_len, kv_len)`.

    Query i and key j are both counted from position 0 (top-left alignment, as the causal masks).

    Args:
        num_heads: H; head h uses slope `alibi_slopes(H)[h]`.
        q_len: number of queries Tq.
        kv_len: number of keys Tk.
        causal: True (decoders, the paper's form): `-m_h * (i - j)` for keys j <= i and `-inf` for
            j > i, so the bias alone also applies the causal mask (pass it to SDPA as `attn_mask`).
            False (bidirectional encoders, a common symmetric extension, not in the paper):
            `-m_h * |i - j|` everywhere, nothing masked.
        device: device of the result.
        dtype: dtype of the result; computed in float64 first.
    """
    for name, value in (("q_len", q_len), ("kv_len", kv_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    slopes = alibi_slopes(num_heads).to(device)  # (H,)
    q_idx = torch.arange(q_len, device=device)  # (Tq,)
    kv_idx = torch.arange(kv_len, device=device)  # (Tk,)
    distance = (q_idx[:, None] - kv_idx[None, :]).to(torch.float64)  # (Tq, Tk): i - j
    if not causal:
        return (-slopes[:, None, None] * distance.abs()).to(dtype)  # (H, Tq, Tk)
    bias = -slopes[:, None, None] * distance  # (H, Tq, Tk)
    return bias.masked_fill(distance < 0, float("-inf")).to(dtype)  # (H, Tq, Tk): -inf above the diagonal


def alibi_score_mod(slopes):
    """A FlexAttention `score_mod` adding the causal ALiBi bias `-slopes[h] * (q_idx - kv_idx)`.

    Pair it with the `causal` mask (a `BlockMask`), which removes the keys after the query.

    Args:
        slopes: `(H,)` tensor on the attention's device, e.g. `alibi_slopes(H).float().to(device)`.
    """
    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    return alibi
