"""Position encodings: sinusoidal and learned absolute encodings, rotary embeddings, ALiBi biases.

Each has one definition here. The attention modules that use one and stay single files importing
only torch (`attention/causal/rope.py`, `attention/causal/alibi.py`, `attention/general.py`) carry
marked copies of these functions, which a test keeps equal; `attention/causal/alibi_flex.py`
imports them.
"""

from attention.positional.alibi import alibi_bias, alibi_score_mod, alibi_slopes
from attention.positional.learned import LearnedPositionalEmbedding
from attention.positional.rotary import RotaryEmbedding, apply_rotary, rotary_angles, rotary_cos_sin, rotate_half
from attention.positional.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table

__all__ = [
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "alibi_bias",
    "alibi_score_mod",
    "alibi_slopes",
    "apply_rotary",
    "rotary_angles",
    "rotary_cos_sin",
    "rotate_half",
    "sinusoidal_table",
]
