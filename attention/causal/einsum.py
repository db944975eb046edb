"""Causal multi-head self-attention written with `torch.einsum` throughout.

Every contraction names its indices, so the shapes are on the page: `b` batch, `t`/`s` query/key
position, `h` head, `d` head feature, `c` input feature. The softmax runs over the key index `s`
(the einsum page's pitfalls show what taking it over the heads does).
"""

import math

import torch
from torch import nn


class EinsumAttention(nn.Module):
    """Causal multi-head self-attention in einsum notation: `(B, T, d_in) -> (B, T, d_out)`.

    The family's constructor, shapes and canonical state dict: `attention.causal.CausalSelfAttention`.
    """

    position_encoding = None

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.__init__
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        init_family(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias)  # sizes, q/k/v/out projections
        self.dropout = nn.Dropout(dropout)
        # True = attend. Not saved in the state dict: it is derived from context_length.
        causal_mask = torch.ones(context_length, context_length, dtype=torch.bool).tril()
        self.register_buffer("causal_mask", causal_mask, persistent=False)

    def project_heads(self, x, layer):
        """`(B, T, d_in) -> (B, H, T, D)` through `layer`'s weight viewed as `(H, D, d_in)`.

        The `nn.Linear` layers only hold the parameters (and their usual initialisation); einsum applies them.
        """
        weight = layer.weight.view(self.num_heads, self.head_dim, self.d_in)  # (H, D, C)
        projected = torch.einsum("btc,hdc->bhtd", x, weight)  # (B, H, T, D)
        if layer.bias is not None:
            projected = projected + layer.bias.view(1, self.num_heads, 1, self.head_dim)
        return projected

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        q = self.project_heads(x, self.query)  # (B, H, T, D)
        k = self.project_heads(x, self.key)  # (B, H, S=T, D)
        v = self.project_heads(x, self.value)  # (B, H, S=T, D)

        scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(self.head_dim)  # (B, H, T, S)
        scores = scores.masked_fill(~self.causal_mask[:T, :T], float("-inf"))
        attn_weights = self.dropout(torch.softmax(scores, dim=-1))  # softmax over keys s: (B, H, T, S)

        context = torch.einsum("bhts,bhsd->bthd", attn_weights, v)  # (B, T, H, D)
        out_weight = self.out.weight.view(self.d_out, self.num_heads, self.head_dim)  # (d_out, H, D)
        return torch.einsum("bthd,ohd->bto", context, out_weight) + self.out.bias  # (B, T, d_out)

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.canonical_state_dict
    def canonical_state_dict(self):
        """The weights under the names every implementation shares (`attention.causal.CausalSelfAttention`)."""
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.load_canonical_state_dict
    def load_canonical_state_dict(self, state):
        """Load the canonical state dict (`attention.causal.CausalSelfAttention`)."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias)
        self.load_state_dict(state)


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
