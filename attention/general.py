"""General-purpose multi-head attention: separate query, key and value inputs.

Self-attention (`key` and `value` default to `query`) and cross-attention (queries from one
sequence, keys and values from another, of a different length), an optional boolean mask
(True = attend), attention weights on request, and optional rotary position embeddings
(RoFormer, https://arxiv.org/abs/2104.09864) on queries and keys.

Without `need_weights` it runs `F.scaled_dot_product_attention`, which picks a fused kernel;
with it, the weights are computed explicitly so they can be returned.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    """Multi-head attention over `(B, Tq, d_model)` queries and `(B, Tk, d_model)` keys and values.

    Args:
        d_model: features of the inputs and the output.
        num_heads: number of heads; must divide `d_model`.
        dropout: probability of zeroing an attention weight in training.
        bias: add biases to the four projections.
        rope: rotate queries and keys by their positions (rotate-half convention) before the scores.
        rope_base: base of the rotary frequencies, `base ** (-2i / head_dim)`.

    Examples:
        >>> mha = MultiHeadAttention(d_model=64, num_heads=4)
        >>> out, weights = mha(torch.randn(2, 5, 64), torch.randn(2, 7, 64), need_weights=True)
        >>> out.shape, weights.shape
        (torch.Size([2, 5, 64]), torch.Size([2, 4, 5, 7]))
    """

    def __init__(self, d_model, num_heads, dropout=0.0, bias=True, *, rope=False, rope_base=10000.0):
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {name}={value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {name}={value}")
        if d_model % num_heads != 0:
            raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise TypeError(f"dropout must be a float, got dropout={dropout!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got dropout={dropout}")
        head_dim = d_model // num_heads
        if rope and head_dim % 2 != 0:
            raise ValueError(f"rope needs an even head_dim, got head_dim={head_dim} (d_model={d_model}, num_heads={num_heads})")
        if rope and not rope_base > 0:
            raise ValueError(f"rope_base must be positive, got rope_base={rope_base}")
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, head_dim
        self.dropout_p, self.rope, self.rope_base = float(dropout), rope, float(rope_base)
        self.query = nn.Linear(d_model, d_model, bias=bias)
        self.key = nn.Linear(d_model, d_model, bias=bias)
        self.value = nn.Linear(d_model, d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key=None, value=None, mask=None, need_weights=False):
        """Attend from `query` to `key`/`value`.

        Args:
            query: `(B, Tq, d_model)`.
            key: `(B, Tk, d_model)`; defaults to `query` (self-attention).
            value: `(B, Tk, d_model)`; defaults to `key`.
            mask: boolean, True = attend, of any shape that broadcasts to `(B, H, Tq, Tk)` as in
                `F.scaled_dot_product_attention`: `(Tq, Tk)`, a padding mask `(B, 1, 1, Tk)`,
                `(B, 1, Tq, Tk)`, `(H, Tq, Tk)`... A `key_padding_mask`-style `(B, Tk)` tensor becomes
                `mask[:, None, None, :]`. A query row with no key to attend to gets a zero output
                (and zero weights).
            need_weights: also return the attention weights.

        Returns:
            `(out, weights)`: `out` is `(B, Tq, d_model)`; `weights` is `(B, H, Tq, Tk)` (before
            dropout, rows summing to 1 or all 0) when `need_weights`, else `None`.
        """
        key = query if key is None else key
        value = key if value is None else value
        self.check_inputs(query, key, value)
        B, Tq, C = query.shape
        Tk = key.shape[1]
        H, D = self.num_heads, self.head_dim
        q = self.query(query).view(B, Tq, H, D).transpose(1, 2)  # (B, H, Tq, D)
        k = self.key(key).view(B, Tk, H, D).transpose(1, 2)  # (B, H, Tk, D)
        v = self.value(value).view(B, Tk, H, D).transpose(1, 2)  # (B, H, Tk, D)
        if self.rope:
            q = apply_rotary(q, *rotary_cos_sin(Tq, D, self.rope_base, q.device, q.dtype))  # (B, H, Tq, D)
            k = apply_rotary(k, *rotary_cos_sin(Tk, D, self.rope_base, k.device, k.dtype))  # (B, H, Tk, D)

        attn_mask, row_has_key = None, None
        if mask is not None:
            self.check_mask(mask, query, B, Tq, Tk)
            mask = mask.view((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (B|1, H|1, Tq|1, Tk|1)
            row_has_key = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, Tq|1, 1)
            # A row with no key would softmax over nothing (NaN). Let it attend everywhere, then zero it:
            # the output is 0 and no NaN reaches the gradients.
            attn_mask = mask | ~row_has_key  # (B|1, H|1, Tq|1, Tk|1)

        dropout_p = self.dropout_p if self.training else 0.0
        attn_weights = None
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, Tq, Tk)
            if attn_mask is not None:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            attn_weights = torch.softmax(scores, dim=-1)  # (B, H, Tq, Tk)
            if row_has_key is not None:
                attn_weights = attn_weights * row_has_key
            context = F.dropout(attn_weights, dropout_p, training=True) @ v  # (B, H, Tq, D)
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)  # (B, H, Tq, D)
            if row_has_key is not None:
                context = context * row_has_key
        context = context.transpose(1, 2).reshape(B, Tq, self.d_model)  # (B, Tq, H*D)
        return self.out(context), attn_weights  # (B, Tq, d_model), (B, H, Tq, Tk) or None

    def check_inputs(self, query, key, value):
        """Raise a clear error unless query, key and value have matching shapes, dtypes and devices."""
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if not tensor.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got {name}.dtype={tensor.dtype}")
            if tensor.dim() != 3 or tensor.shape[-1] != self.d_model or tensor.shape[1] == 0:
                raise ValueError(f"{name} must have shape (B, T>0, d_model={self.d_model}), got {name}.shape={tuple(tensor.shape)}")
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(f"query, key and value must share the batch size, got {query.shape[0]}, {key.shape[0]}, {value.shape[0]}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value must have the same length, got key.shape={tuple(key.shape)}, value.shape={tuple(value.shape)}")
        if not query.device == key.device == value.device:
            raise ValueError(f"query, key and value must be on one device, got {query.device}, {key.device}, {value.device}")

    def check_mask(self, mask, query, B, Tq, Tk):
        """Raise a clear error unless `mask` is boolean, on query's device, and broadcasts to `(B, H, Tq, Tk)`."""
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be a boolean tensor (True = attend), got mask.dtype={mask.dtype}")
        if mask.device != query.device:
            raise ValueError(f"mask must be on the query's device {query.device}, got mask.device={mask.device}")
        target = (B, self.num_heads, Tq, Tk)
        # Broadcasting may stretch a size-1 dimension of the mask, never one of the target.
        fits = mask.dim() <= 4 and all(m in (1, t) for m, t in zip(reversed(mask.shape), reversed(target)))
        if not fits:
            hint = ""
            if mask.dim() == 2 and tuple(mask.shape) == (B, Tk):
                hint = "; a (B, Tk) key padding mask must be passed as mask[:, None, None, :]"
            raise ValueError(
                f"mask must broadcast to (B={B}, H={self.num_heads}, Tq={Tq}, Tk={Tk}), "
                f"got mask.shape={tuple(mask.shape)}{hint}")

    def canonical_state_dict(self):
        """Weights as `query/key/value/out.weight` `(d_model, d_model)` and, with `bias`, `.bias` `(d_model,)`."""
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    def load_canonical_state_dict(self, state):
        """Load the form `canonical_state_dict` returns; a missing or extra key or a wrong shape raises."""
        own = self.state_dict()
        missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or extra:
            raise ValueError(f"canonical state dict: missing keys {missing}, unexpected keys {extra}")
        for name, tensor in own.items():
            if state[name].shape != tensor.shape:
                raise ValueError(f"canonical state dict: {name} must have shape {tuple(tensor.shape)}, got {tuple(state[name].shape)}")
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
