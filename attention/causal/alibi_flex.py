"""Causal multi-head self-attention with ALiBi biases on compiled FlexAttention, through a `score_mod`.

FlexAttention (https://pytorch.org/blog/flexattention/) takes a position bias as a `score_mod`, a
function `(score, b, h, q_idx, kv_idx) -> score` fused into the kernel: here ALiBi's
`score - m_h * (q_idx - kv_idx)` (Press et al., 2022, https://arxiv.org/abs/2108.12409), under the
causal `BlockMask`. No `(T, T)` bias tensor is materialised on the forward pass.

Everything else, the limits included (no dropout; a dense backward on CPU and MPS; short sequences
padded on CPU), is `attention/causal/flex.py`'s `FlexCausalAttention`: this class changes only the
score. Unlike the other files of the family, it imports that machinery, `attention.positional` and
`ALiBiAttention`'s cached bias instead of repeating them, so copy it together with `flex.py`, `alibi.py`
and `positional/alibi.py`.
"""

from attention.causal.alibi import ALiBiAttention
from attention.causal.flex import FlexCausalAttention
from attention.positional.alibi import alibi_score_mod, alibi_slopes


class ALiBiFlexAttention(FlexCausalAttention):
    """Causal multi-head self-attention with ALiBi on compiled FlexAttention: `(B, T, d_in) -> (B, T, d_out)`.

    The family's constructor, shapes and canonical state dict: `attention.causal.CausalSelfAttention`.

    Args:
        dropout: must be 0.0: FlexAttention has no attention-weight dropout.
        num_heads: number of heads; head h uses slope `alibi_slopes(num_heads)[h]`.
    """

    position_encoding = "alibi"
    bias_cache = None  # (H, T, T): the dense backward's latest bias, see score_bias; not in the state dict

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        # Not saved in the state dict: derived from num_heads. A buffer, so it follows .to(device).
        self.register_buffer("slopes", alibi_slopes(num_heads).float(), persistent=False)  # (H,)

    def score_mod(self, dtype):
        # A fresh closure per call reads the current buffer (after .to(device)); it does not recompile.
        return alibi_score_mod(self.slopes.to(dtype))

    # The dense backward's bias: `ALiBiAttention`'s, built once per (T, device, dtype) and kept in `bias_cache`.
    score_bias = ALiBiAttention.score_bias
