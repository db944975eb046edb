"""Causal multi-head self-attention with ALiBi biases on compiled FlexAttention, through a `score_mod`.

FlexAttention (https://pytorch.org/blog/flexattention/) takes a position bias as a `score_mod`, a
function `(score, b, h, q_idx, kv_idx) -> score` fused into the kernel: here ALiBi's
`score - m_h * (q_idx - kv_idx)` (Press et al., 2022, https://arxiv.org/abs/2108.12409), with the
causal mask as a `BlockMask` built once per (sequence length, device) so fully masked blocks are
skipped. No `(T, T)` bias tensor is materialised on the forward pass.

The limits of PyTorch's FlexAttention, stated as in `attention/causal/flex.py`:

* No dropout on the attention weights, so `dropout` must be 0 (else `ValueError`).
* No backward on CPU or MPS, and compiled CPU FlexAttention cannot return the log-sum-exp. There,
  when gradients are needed, the forward still runs the compiled kernel and the backward is computed
  densely with the bias added to the scores (`FlexALiBiDenseBackward`); on CUDA, FlexAttention's
  own backward runs.
"""

import math

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

# Compiled once per process; uncompiled, flex_attention falls back to a slow dense reference.
_compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
# dynamic=False: one kernel per (shape, dtype); past torch's default of 8 recompiles per function,
# flex_attention would silently run its slow uncompiled path, so allow many.
RECOMPILE_LIMIT = 256
# PyTorch 2.13's compiled CPU FlexAttention gave wrong rows (garbage, no error, not on every run) for
# some sequences shorter than 64 tokens (seen at T = 8, 24, 40 and 56 on an AVX2 CPU).
MIN_CPU_SEQ_LEN = 128


# Same as attention/causal/flex.py::compiled_flex_attention
def compiled_flex_attention(*args, **kwargs):
    """`torch.compile(flex_attention)` with room for one compiled kernel per (shape, dtype) in use."""
    with torch._dynamo.config.patch(cache_size_limit=RECOMPILE_LIMIT, accumulated_cache_size_limit=RECOMPILE_LIMIT):
        return _compiled_flex_attention(*args, **kwargs)


class FlexALiBiDenseBackward(torch.autograd.Function):
    """Compiled FlexAttention forward with an ALiBi `score_mod`, the attention backward computed densely.

    The backward recomputes the weights `P = softmax(q k^T * scale + attn_bias)` (the bias holding
    `-inf` above the diagonal), then applies the FlashAttention backward formulas: `dV = P^T dO`,
    `dS = P * (dO V^T - rowsum(dO * O))`, `dQ = dS K * scale`, `dK = dS^T Q * scale`. The bias is a
    constant, so it adds no gradient term.
    """

    @staticmethod
    def forward(ctx, q, k, v, block_mask, score_mod, attn_bias, scale):
        # Detached: FlexAttention refuses inputs that require grad on CPU, even under no_grad.
        out = compiled_flex_attention(q.detach(), k.detach(), v.detach(), score_mod=score_mod, block_mask=block_mask, scale=scale)
        ctx.save_for_backward(q, k, v, out, attn_bias)  # out: (B, H, T, D); attn_bias: (H, T, S)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, attn_bias = ctx.saved_tensors
        scores = (q @ k.transpose(-2, -1)) * ctx.scale + attn_bias  # (B, H, T, S)
        attn_weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        grad_v = attn_weights.transpose(-2, -1) @ grad_out  # (B, H, S, D)
        grad_weights = grad_out @ v.transpose(-2, -1)  # (B, H, T, S)
        row_dot = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, H, T, 1)
        grad_scores = attn_weights * (grad_weights - row_dot)  # (B, H, T, S)
        grad_q = grad_scores @ k * ctx.scale  # (B, H, T, D)
        grad_k = grad_scores.transpose(-2, -1) @ q * ctx.scale  # (B, H, S, D)
        return grad_q, grad_k, grad_v, None, None, None, None


class ALiBiFlexAttention(nn.Module):
    """Causal multi-head self-attention with ALiBi on compiled FlexAttention: `(B, T, d_in) -> (B, T, d_out)`.

    Args:
        d_in: features of the input `x`.
        d_out: features of the output; split into `num_heads` heads of `d_out // num_heads`.
        context_length: longest sequence accepted.
        dropout: must be 0.0: FlexAttention has no attention-weight dropout.
        num_heads: number of heads; head h uses slope `alibi_slopes(num_heads)[h]`.
        qkv_bias: add a bias to the query, key and value projections.
    """

    position_encoding = "alibi"

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        check_init_args(d_in, d_out, context_length, dropout, num_heads)
        if dropout != 0:
            raise ValueError(f"FlexAttention has no dropout on the attention weights: dropout must be 0.0, got dropout={dropout}")
        self.d_in, self.d_out, self.context_length = d_in, d_out, context_length
        self.num_heads, self.head_dim, self.qkv_bias = num_heads, d_out // num_heads, qkv_bias
        self.query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out = nn.Linear(d_out, d_out)
        # Not saved in the state dict: derived from num_heads. A buffer, so it follows .to(device).
        self.register_buffer("slopes", alibi_slopes(num_heads).float(), persistent=False)  # (H,)
        self.block_masks = {}  # (T, device) -> BlockMask, built on first use

    def block_mask(self, T, device):
        """The causal `BlockMask` for length `T` on `device`, built once and reused."""
        cache_key = (T, str(device))
        if cache_key not in self.block_masks:
            self.block_masks[cache_key] = create_block_mask(causal, B=None, H=None, Q_LEN=T, KV_LEN=T, device=device)
        return self.block_masks[cache_key]

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        H, D = self.num_heads, self.head_dim
        q = self.query(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = self.key(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        v = self.value(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        # Short sequences run padded on CPU (see MIN_CPU_SEQ_LEN): zero tokens appended after the last
        # one change nothing under a causal mask, and the extra rows are cut off below.
        T_run = max(T, MIN_CPU_SEQ_LEN) if x.device.type == "cpu" else T
        if T_run > T:
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, T_run - T)) for t in (q, k, v))  # (B, H, T_run, D)
        block_mask = self.block_mask(T_run, x.device)
        # A fresh closure per call reads the current buffer (after .to(device)); it does not recompile.
        score_mod = alibi_score_mod(self.slopes.to(q.dtype))
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        if needs_grad and x.device.type in ("cpu", "mps"):
            attn_bias = alibi_bias(H, T_run, T_run, causal=True, device=x.device, dtype=q.dtype)  # (H, T_run, T_run)
            context = FlexALiBiDenseBackward.apply(q, k, v, block_mask, score_mod, attn_bias, 1 / math.sqrt(D))  # (B, H, T_run, D)
        else:
            context = compiled_flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)  # (B, H, T_run, D)
        context = context[:, :, :T]  # (B, H, T, D)
        context = context.transpose(1, 2).reshape(B, T, self.d_out)  # (B, T, H*D)
        return self.out(context)  # (B, T, d_out)

    def canonical_state_dict(self):
        """Weights under the names every implementation shares."""
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    def load_canonical_state_dict(self, state):
        """Load the shared form: see `SplitHeadsAttention.load_canonical_state_dict`."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias)
        self.load_state_dict(state)


# Same as attention/causal/flex.py::causal
def causal(b, h, q_idx, kv_idx):
    """FlexAttention mask predicate: True where query `q_idx` may attend to key `kv_idx`."""
    return q_idx >= kv_idx


# Same as attention/positional/alibi.py::alibi_score_mod
def alibi_score_mod(slopes):
    """A FlexAttention `score_mod` adding the causal ALiBi bias `-slopes[h] * (q_idx - kv_idx)`.

    Pair it with the `causal` mask (a `BlockMask`), which removes the keys after the query.

    Args:
        slopes: `(H,)` tensor on the attention's device, e.g. `alibi_slopes(H).float().to(device)`.
    """
    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    return alibi


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
