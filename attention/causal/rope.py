"""Causal multi-head self-attention with rotary position embeddings, through `F.scaled_dot_product_attention`.

RoPE (RoFormer, Su et al., https://arxiv.org/abs/2104.09864) rotates each pair of query and key
features by an angle proportional to the position, `t * 10000 ** (-2i / head_dim)`, so that the
score of query i and key j depends on their positions only through `i - j`. Pairs follow the
rotate-half layout (`x[i]` with `x[i + D/2]`, as in GPT-NeoX and Hugging Face's Llama code; Meta's
reference Llama code pairs adjacent features, the same up to a permutation of the q/k weight rows). The angles are computed
for the actual length on every call; the rotated queries and keys go to SDPA with `is_causal=True`.
"""

import torch
import torch.nn.functional as F
from torch import nn


class RoPEAttention(nn.Module):
    """Causal multi-head self-attention with rotary embeddings: `(B, T, d_in) -> (B, T, d_out)`.

    The family's constructor, shapes and canonical state dict: `attention.causal.CausalSelfAttention`.

    Args:
        d_out: features of the output; split into `num_heads` heads of `d_out // num_heads`,
            which must be even.
        context_length: longest sequence accepted. RoPE itself has no length limit; the check keeps
            the family's interface.
    """

    position_encoding = "rope"
    rope_base = 10000.0

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        init_family(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias)  # sizes, q/k/v/out projections
        if self.head_dim % 2 != 0:
            raise ValueError(f"rotary embeddings need an even head_dim, got head_dim={self.head_dim} (d_out={d_out}, num_heads={num_heads})")
        self.dropout_p = dropout  # a probability: SDPA applies it itself

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        D = self.head_dim
        q, k, v = project_heads(self, x)  # (B, H, T, D) each
        cos, sin = rotary_cos_sin(T, D, self.rope_base, x.device, q.dtype)  # (T, D) each
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)  # (B, H, T, D) each
        dropout_p = self.dropout_p if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)  # (B, H, T, D)
        context = context.transpose(1, 2).reshape(B, T, self.d_out)  # (B, T, H*D)
        return self.out(context)  # (B, T, d_out)

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.canonical_state_dict
    def canonical_state_dict(self):
        """The weights under the names every implementation shares (`attention.causal.CausalSelfAttention`)."""
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.load_canonical_state_dict
    def load_canonical_state_dict(self, state):
        """Load the canonical state dict (`attention.causal.CausalSelfAttention`)."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias)
        self.load_state_dict(state)


# Same as attention/positional/rotary.py::rotary_cos_sin
def rotary_cos_sin(seq_len, head_dim, base, device, dtype):
    """Cosines and sines of the rotary angles `position * base ** (-2i / head_dim)`, each `(seq_len, head_dim)`.

    Computed for the actual `seq_len` on every call, so no cache can truncate a long input.
    """
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)  # (D/2,)
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)  # (T,)
    angles = positions[:, None] * inv_freq[None, :]  # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, D): the rotate-half convention pairs i with i + D/2
    return angles.cos().to(dtype), angles.sin().to(dtype)


# Same as attention/positional/rotary.py::rotate_half
def rotate_half(x):
    """`(x1, x2) -> (-x2, x1)` on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


# Same as attention/positional/rotary.py::apply_rotary
def apply_rotary(x, cos, sin):
    """Rotate each pair `(x[..., i], x[..., i + D/2])` of `(B, H, T, D)` `x` by its position's angle."""
    return x * cos + rotate_half(x) * sin  # (B, H, T, D)


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
