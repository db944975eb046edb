"""The causal self-attention family: one class per file, each importing only torch.

`CausalSelfAttention` below is the family's contract, written once; every class in
`attention.registry.IMPLEMENTATIONS` keeps it, the tests check it, and the docstrings, the README
and the benchmark point here instead of restating it.
"""

from typing import ClassVar, Protocol, runtime_checkable

import torch


@runtime_checkable
class CausalSelfAttention(Protocol):
    """What every causal self-attention class provides.

    * **Constructor** `cls(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)`: `d_out`
      output features split into `num_heads` heads of `d_out // num_heads`; sequences of up to
      `context_length` tokens; `dropout` on the attention weights in training (a class whose kernel
      has none raises `ValueError` for `dropout > 0`); biases on the query, key and value projections
      when `qkv_bias`. Arguments that cannot build the module raise `TypeError`/`ValueError` naming
      them. One signature for the whole family, so each class drops into a GPT-style block in place
      of another (within the limits its constructor states).
    * **`forward(x)`**: `(B, T, d_in) -> (B, T, d_out)`; position `t` attends to positions `<= t`.
    * **Canonical state dict**: the weights under names every class shares, so they move between
      implementations and into the float64 reference (`attention.reference`): `query.weight`,
      `key.weight`, `value.weight` `(d_out, d_in)`; `out.weight` `(d_out, d_out)` and `out.bias`
      `(d_out,)`; `query.bias`, `key.bias`, `value.bias` `(d_out,)` when `qkv_bias`.
      `canonical_state_dict()` returns it; `load_canonical_state_dict(state)` loads it and raises
      `ValueError` naming missing, unexpected or misshapen keys.
    * **`position_encoding`**: `None`, `"rope"` or `"alibi"`: the position encoding applied inside the
      attention, which the reference then applies too.
    * **Grouped-query classes** (`attention/causal/gqa.py`, `gqa_flex.py`) add a keyword-only
      `num_kv_heads` with a default; their `key.*` and `value.*` have `num_kv_heads * head_dim` rows.
    * **Decoding** (where a class supports it, `GroupedQueryAttention`): `new_cache(batch_size, capacity)`
      makes an empty KV cache (an `attention.decoding.DecodingCache`) and `forward(x, cache=cache)` continues
      the cached sequence with `x`.

    A new implementation is one file under `attention/causal/` with a class keeping this contract,
    plus one line in `attention/registry.py`. Its small helpers (the argument checks) are marked
    copies, `# Same as attention/causal/split_heads.py::check_input`, which a test keeps identical.
    """

    position_encoding: ClassVar[str | None]

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False) -> None: ...

    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

    def canonical_state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_canonical_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...
