"""Causal multi-head self-attention through PyTorch's `nn.MultiheadAttention`.

Two things differ from the rest of this package and trip people up:

* `nn.MultiheadAttention` reads a boolean `attn_mask` the other way round: True = *masked*. This
  wrapper keeps our convention (True = attend) in `causal_mask` and inverts it at the call.
* It already ends in its own output projection (`out_proj`), so this wrapper adds none.

`need_weights=True` makes PyTorch compute and return the `(B, T, T)` weights, which forces the
unfused path; `need_weights=False` lets it call the fused SDPA kernels. Both are registered,
so the benchmark shows the price of asking for the weights.
"""

import math

import torch
from torch import nn


class TorchMultiheadAttention(nn.Module):
    """Causal self-attention on `nn.MultiheadAttention(need_weights=False)`: `(B, T, d_in) -> (B, T, d_out)`.

    `nn.MultiheadAttention` projects the query from `embed_dim` features, so `d_in` must equal
    `d_out`; a different `d_in` raises `ValueError`.

    The family's constructor, shapes and canonical state dict: `attention.causal.CausalSelfAttention`.

    Args:
        d_in: features of the input `x`; must equal `d_out`.
        d_out: features of the output (`embed_dim`).
        qkv_bias: add a bias to the query, key and value projections (`in_proj_bias`).
    """

    position_encoding = None
    need_weights = False

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        check_init_args(d_in, d_out, context_length, dropout, num_heads)
        if d_in != d_out:
            raise ValueError(
                f"nn.MultiheadAttention needs d_in == d_out (its query input has embed_dim features), "
                f"got d_in={d_in}, d_out={d_out}"
            )
        self.d_in, self.d_out, self.context_length = d_in, d_out, context_length
        self.num_heads, self.head_dim, self.qkv_bias = num_heads, d_out // num_heads, qkv_bias
        # bias=qkv_bias switches off both in_proj_bias and out_proj.bias; every implementation here
        # keeps the output bias, so add it back with nn.Linear's own initialisation.
        self.mha = nn.MultiheadAttention(d_out, num_heads, dropout=dropout, bias=qkv_bias, batch_first=True)
        if not qkv_bias:
            bound = 1 / math.sqrt(d_out)
            self.mha.out_proj.bias = nn.Parameter(torch.empty(d_out).uniform_(-bound, bound))
        causal_mask = torch.ones(context_length, context_length, dtype=torch.bool).tril()  # True = attend
        self.register_buffer("causal_mask", causal_mask, persistent=False)

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        masked = ~self.causal_mask[:T, :T]  # (T, T) in nn.MultiheadAttention's convention: True = masked
        out, attn_weights = self.mha(x, x, x, attn_mask=masked, need_weights=self.need_weights)  # (B, T, d_out)
        return out  # the weights, (B, T, T) averaged over heads, are dropped to keep the common interface

    def canonical_state_dict(self):
        """`in_proj_weight`'s three row blocks become `query`, `key` and `value`."""
        state = {"out.weight": self.mha.out_proj.weight.detach().clone(),
                 "out.bias": self.mha.out_proj.bias.detach().clone()}
        for proj, weight in zip(("query", "key", "value"), self.mha.in_proj_weight.detach().chunk(3)):
            state[f"{proj}.weight"] = weight.clone()  # (d_out, d_in)
        if self.qkv_bias:
            for proj, bias in zip(("query", "key", "value"), self.mha.in_proj_bias.detach().chunk(3)):
                state[f"{proj}.bias"] = bias.clone()  # (d_out,)
        return state

    def load_canonical_state_dict(self, state):
        """Load the canonical state dict (`attention.causal.CausalSelfAttention`)."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias)
        with torch.no_grad():
            self.mha.in_proj_weight.copy_(torch.cat([state["query.weight"], state["key.weight"], state["value.weight"]]))
            if self.qkv_bias:
                self.mha.in_proj_bias.copy_(torch.cat([state["query.bias"], state["key.bias"], state["value.bias"]]))
            self.mha.out_proj.weight.copy_(state["out.weight"])
            self.mha.out_proj.bias.copy_(state["out.bias"])


class TorchMultiheadAttentionWithWeights(TorchMultiheadAttention):
    """As `TorchMultiheadAttention`, but with `need_weights=True`: PyTorch materialises the weights."""

    need_weights = True


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
