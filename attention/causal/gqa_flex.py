"""Grouped-query causal self-attention on compiled FlexAttention (`enable_gqa=True`).

The same model as `attention/causal/gqa.py` (`num_heads` query heads share `num_kv_heads` key/value
heads in consecutive groups), run by FlexAttention: its kernel maps query head `h` to K/V head
`h // (num_heads // num_kv_heads)` itself, so the smaller K/V are never copied on the forward pass.

Everything else, the limits included (no dropout; a dense backward on CPU and MPS, where K/V are
repeated per group and their gradients summed back; short sequences padded on CPU), is
`attention/causal/flex.py`'s `FlexCausalAttention`. Like `alibi_flex.py`, it imports that machinery
instead of repeating it, so copy it together with `flex.py` and `gqa.py`. No KV cache here: decoding
runs through `gqa.py`'s SDPA class.
"""

import math

import torch
from torch import nn

from attention.causal.flex import MIN_CPU_SEQ_LEN, FlexCausalAttention, FlexDenseBackward, compiled_flex_attention
from attention.causal.gqa import GroupedQueryAttention, check_input, resolve_kv_heads


class GroupedQueryFlexAttention(FlexCausalAttention):
    """Causal grouped-query self-attention on compiled FlexAttention: `(B, T, d_in) -> (B, T, d_out)`.

    Constructor and canonical state dict as `attention.causal.gqa.GroupedQueryAttention` (`num_kv_heads`
    keyword, same default; `key.*` and `value.*` with `num_kv_heads * head_dim` rows).

    Args:
        dropout: must be 0.0: FlexAttention has no attention-weight dropout.
    """

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, *, num_kv_heads=None):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.num_kv_heads = resolve_kv_heads(num_heads, num_kv_heads)
        self.key = nn.Linear(d_in, self.num_kv_heads * self.head_dim, bias=qkv_bias)  # num_kv_heads heads
        self.value = nn.Linear(d_in, self.num_kv_heads * self.head_dim, bias=qkv_bias)

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        H, H_kv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.query(x).view(B, T, H, D).transpose(1, 2)  # (B, T, H*D) -> (B, H, T, D)
        k = self.key(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, T, H_kv*D) -> (B, H_kv, T, D)
        v = self.value(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
        # Short sequences run padded on CPU (see flex.MIN_CPU_SEQ_LEN): appended zero tokens change nothing
        # under a causal mask, and the extra rows are cut off below.
        T_run = max(T, MIN_CPU_SEQ_LEN) if x.device.type == "cpu" else T
        if T_run > T:
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, T_run - T)) for t in (q, k, v))  # (B, *, T_run, D)
        block_mask = self.block_mask(T_run, x.device)
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        if needs_grad and x.device.type in ("cpu", "mps"):
            k = k.repeat_interleave(H // H_kv, dim=1)  # (B, H, T_run, D): autograd sums the groups' gradients back
            v = v.repeat_interleave(H // H_kv, dim=1)  # (B, H, T_run, D)
            score_bias = self.score_bias(T_run, x.device, q.dtype)  # (1, T_run, T_run)
            context = FlexDenseBackward.apply(q, k, v, block_mask, None, score_bias, 1 / math.sqrt(D))  # (B, H, T_run, D)
        else:
            context = compiled_flex_attention(q, k, v, block_mask=block_mask, enable_gqa=H_kv != H)  # (B, H, T_run, D)
        context = context[:, :, :T]  # (B, H, T, D)
        context = context.transpose(1, 2).reshape(B, T, self.d_out)  # (B, T, H*D)
        return self.out(context)  # (B, T, d_out)

    def load_canonical_state_dict(self, state):
        """Load the canonical state dict, with `num_kv_heads * head_dim` rows in `key.*` and `value.*`."""
        GroupedQueryAttention.load_canonical_state_dict(self, state)
