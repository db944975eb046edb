"""The registry: a plain dict from a short name to an implementation class.

Adding an implementation is one file under `attention/` plus one line here; the shared tests and
the benchmark iterate over this dict, so they pick it up without further changes.
"""

from attention.causal.alibi import ALiBiAttention
from attention.causal.alibi_flex import ALiBiFlexAttention
from attention.causal.einsum import EinsumAttention
from attention.causal.flex import FlexCausalAttention
from attention.causal.fused_qkv import FusedQKVAttention
from attention.causal.gqa import GroupedQueryAttention, MultiQueryAttention
from attention.causal.gqa_flex import GroupedQueryFlexAttention
from attention.causal.rope import RoPEAttention
from attention.causal.sdpa_causal import SDPACausalAttention
from attention.causal.sdpa_mask import SDPAMaskAttention
from attention.causal.seq_first import SeqFirstAttention
from attention.causal.split_heads import SplitHeadsAttention
from attention.causal.stacked_heads import StackedHeadsAttention
from attention.causal.tiled import TiledAttention
from attention.causal.torch_mha import TorchMultiheadAttention, TorchMultiheadAttentionWithWeights


class Registry(dict):
    """A dict whose failed lookup names the valid keys."""

    def __missing__(self, name):
        raise KeyError(f"unknown implementation {name!r}; valid names: {', '.join(sorted(self))}")


# Every class here keeps the causal family's contract, attention.causal.CausalSelfAttention.
# IMPLEMENTATIONS[name] of a name not here raises KeyError listing the valid names.
IMPLEMENTATIONS = Registry({
    "stacked_heads": StackedHeadsAttention,
    "split_heads": SplitHeadsAttention,
    "fused_qkv": FusedQKVAttention,
    "einsum": EinsumAttention,
    "seq_first": SeqFirstAttention,
    "sdpa_causal": SDPACausalAttention,
    "sdpa_mask": SDPAMaskAttention,
    "torch_mha": TorchMultiheadAttention,
    "torch_mha_weights": TorchMultiheadAttentionWithWeights,
    "flex": FlexCausalAttention,
    "alibi": ALiBiAttention,
    "rope": RoPEAttention,
    "alibi_flex": ALiBiFlexAttention,
    "tiled": TiledAttention,
    "gqa": GroupedQueryAttention,
    "mqa": MultiQueryAttention,
    "gqa_flex": GroupedQueryFlexAttention,
})

