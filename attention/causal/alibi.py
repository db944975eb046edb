"""Causal multi-head self-attention with ALiBi position biases, through `F.scaled_dot_product_attention`.

ALiBi (Press et al., 2022, "Train Short, Test Long", https://arxiv.org/abs/2108.12409) adds no
position vector to the inputs. Each head h adds `-m_h * (i - j)` to the score of query i and key j
(`j <= i`), with slopes `m_h` from a fixed geometric sequence (1/2, 1/4, ..., 1/256 for 8 heads).
The bias is built for the actual length, with `-inf` above the diagonal, and passed to SDPA as a
`(1, H, T, T)` float `attn_mask`, so it also applies the causal mask; being 4-D, it is accepted by the
fused CPU kernel (a 3-D bias would run the math kernel). It depends only on (T, device, dtype), so it
is built once and reused while those stay the same (`ALiBiAttention.score_bias`).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class ALiBiAttention(nn.Module):
    """Causal multi-head self-attention with ALiBi biases: `(B, T, d_in) -> (B, T, d_out)`.

    The family's constructor, shapes and canonical state dict: `attention.causal.CausalSelfAttention`.
    The `(H, T, T)` bias of the latest call is kept (`bias_cache`, not in the state dict) and reused
    while the length, device and dtype stay the same: see `score_bias`.

    Args:
        context_length: longest sequence accepted. ALiBi itself has no length limit; the check keeps
            the family's interface.
        num_heads: number of heads; head h uses slope `alibi_slopes(num_heads)[h]`.
    """

    position_encoding = "alibi"
    bias_cache = None  # (H, T, T): the latest bias, see score_bias; a plain attribute, so not in the state dict

    # Same as attention/causal/sdpa_causal.py::SDPACausalAttention.__init__
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        init_family(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias)  # sizes, q/k/v/out projections
        self.dropout_p = dropout  # a probability: SDPA applies it itself

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        q, k, v = project_heads(self, x)  # (B, H, T, D) each
        # 4-D, not (H, T, T): SDPA's fused kernels take a float mask only as (B|1, H|1, T, T); a 3-D one
        # sends every call to the math kernel, which stores the (B, H, T, T) scores.
        attn_bias = self.score_bias(T, x.device, q.dtype)[None]  # (1, H, T, T), -inf above the diagonal
        dropout_p = self.dropout_p if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, dropout_p=dropout_p)  # (B, H, T, D)
        context = context.transpose(1, 2).reshape(B, T, self.d_out)  # (B, T, H*D)
        return self.out(context)  # (B, T, d_out)

    def score_bias(self, T, device, dtype):
        """ALiBi's bias with the causal mask as one additive `(H, T, T)` tensor, `-inf` above the diagonal.

        Built once per (T, device, dtype) and reused: built in float64 (for one rounding to `dtype`), it
        costs more than the attention itself at T = 1024, and it depends on nothing but its shape. Only
        the latest is kept, so a length that changes every call (generating without a KV cache) holds one.
        """
        bias = self.bias_cache
        if bias is None or (bias.shape, bias.device, bias.dtype) != ((self.num_heads, T, T), torch.device(device), dtype):
            with torch.inference_mode(False):  # an inference tensor could not be saved for a later backward
                bias = alibi_bias(self.num_heads, T, T, causal=True, device=device, dtype=dtype)  # (H, T, T)
            self.bias_cache = bias
        return bias

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.canonical_state_dict
    def canonical_state_dict(self):
        """The weights under the names every implementation shares (`attention.causal.CausalSelfAttention`)."""
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.load_canonical_state_dict
    def load_canonical_state_dict(self, state):
        """Load the canonical state dict (`attention.causal.CausalSelfAttention`)."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias)
        self.load_state_dict(state)


# Same as attention/positional/alibi.py::alibi_slopes
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


# Same as attention/positional/alibi.py::alibi_bias
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


# Same as attention/causal/split_heads.py::init_sizes
def init_sizes(module, d_in, d_out, context_length, dropout, num_heads, qkv_bias):
    """Check the family's constructor arguments (clear errors) and keep the sizes on `module`."""
    check_init_args(d_in, d_out, context_length, dropout, num_heads)
    module.d_in, module.d_out, module.context_length = d_in, d_out, context_length
    module.num_heads, module.head_dim, module.qkv_bias = num_heads, d_out // num_heads, qkv_bias


# Same as attention/causal/split_heads.py::init_family
def init_family(module, d_in, d_out, context_length, dropout, num_heads, qkv_bias):
    """`init_sizes`, then the query, key and value projections `d_in -> d_out` and the output projection."""
    init_sizes(module, d_in, d_out, context_length, dropout, num_heads, qkv_bias)
    module.query = nn.Linear(d_in, d_out, bias=qkv_bias)
    module.key = nn.Linear(d_in, d_out, bias=qkv_bias)
    module.value = nn.Linear(d_in, d_out, bias=qkv_bias)
    module.out = nn.Linear(d_out, d_out)


# Same as attention/causal/split_heads.py::project_heads
def project_heads(module, x):
    """The queries, keys and values of `x` `(B, T, d_in)`, each split into heads: `(B, H, T, D)`."""
    B, T, C = x.shape
    H, D = module.num_heads, module.head_dim
    q = module.query(x).view(B, T, H, D).transpose(1, 2)  # (B, T, d_out) -> (B, T, H, D) -> (B, H, T, D)
    k = module.key(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    v = module.value(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    return q, k, v


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


# Same as attention/causal/split_heads.py::check_canonical_state
def check_canonical_state(state, d_in, d_out, qkv_bias):
    """Raise a clear error unless `state` holds exactly the canonical keys with the right shapes."""
    shapes = {"query.weight": (d_out, d_in), "key.weight": (d_out, d_in), "value.weight": (d_out, d_in),
              "out.weight": (d_out, d_out), "out.bias": (d_out,)}
    if qkv_bias:
        shapes.update({"query.bias": (d_out,), "key.bias": (d_out,), "value.bias": (d_out,)})
    missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or extra:
        raise ValueError(f"canonical state dict: missing keys {missing}, unexpected keys {extra}")
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"canonical state dict: {name} must have shape {shape}, got {tuple(state[name].shape)}")
