"""Attention layers of current open models, each equal to transformers' own layer: one file per family.

`ModelAttention` below is the family's contract, written once; every class in `MODELS` keeps it, the
tests check it (against transformers' layer and against `attention.reference`), and the pages point
here instead of restating it. The causal family (`attention.causal.CausalSelfAttention`) is a
separate contract: these classes mirror real models (their parameter names, configs and quirks), the
causal classes mirror the textbook.

Each file imports only torch and the decoding family (`attention/decoding/`: the KV caches and the kernels that
attend over them; a hybrid's file also the linear attention rules, `attention/linear/`), so a copy of one runs with
torch and a copy of those folders; small helpers repeated across files
are marked copies (`# Same as attention/models/__init__.py::config_value`), kept identical by tests/test_copies.py
(`python tests/test_copies.py --fix` rewrites them from their originals).
"""

from typing import Any, Protocol, runtime_checkable

import torch

REQUIRED = object()  # `config_value`'s default: the field must be present


@runtime_checkable
class ModelAttention(Protocol):
    """What every model family's attention layer provides.

    * **`cls.from_config(config, layer_idx, **options)`**: the attention of layer `layer_idx` of a model whose
      configuration is `config`: transformers' config object, or any object or mapping with the same
      field names (`hidden_size`, `num_attention_heads`, `num_key_value_heads`, `head_dim`, `rope_theta`
      or `rope_parameters`, `sliding_window`, `layer_types`, ...). The package never imports transformers.
      A missing field raises `ValueError` naming it; an unknown `model_type` in `MODELS` raises
      `KeyError` listing the known ones. Every number the layer reads is checked here, before any weight
      is made: a value that would give silent zeros, NaN, uniform or other attention than transformers'
      (a head count of `4.0`, an odd `head_dim` under RoPE, `rope_theta` 0, a window of 0 on a sliding
      layer, a soft-cap of 0, an unknown `rope_type` or layer kind, `layer_types` of the wrong length) raises
      `ValueError` or `TypeError` naming the field and its value. Values transformers accepts keep its
      meaning (`num_key_value_heads` 0 or None: one per query head; Mistral's `sliding_window` 0 or None: none).
      `options` are the class's own keywords, fixed at construction: `decode_kernel` on the layers that attend
      through SDPA (below), `path` on MLA's.
    * **Parameters** named as transformers names them (`q_proj.weight`, `k_norm.weight`, `sinks`, ...), so
      `module.load_state_dict(hf_layer.state_dict())` loads a real checkpoint's layer unchanged. A
      state dict that does not fit raises naming the key and both shapes.
    * **`module(x)`**: causal self-attention over positions `0 .. T-1`, `(B, T, hidden_size) ->
      (B, T, hidden_size)`, with the layer's window where it is local (`layer_type`). `x` of another dtype
      than the layer's weights raises `ValueError` naming both (outside autocast).
    * **`layer_type`**: transformers' name for the layer's kind, `"full_attention"` or
      `"sliding_attention"` (or the family's own where it has another, e.g. chunked attention).
    * **Decoding**: `module.new_cache(batch_size, capacity)` makes an empty cache
      (`attention.decoding.DecodingCache`); `module(x, cache=cache)` continues the cached sequence with
      `x`. A local layer's cache holds at most its window, whatever `capacity`; a cache made by
      another layer (another shape or kind) is refused with `ValueError`. Layers that attend through SDPA
      take `decode_kernel` (`"auto"`, `"sdpa"` or `"matmul"`, as `GroupedQueryAttention`; another raises
      `ValueError` at construction): over a cache on CPU, a few new tokens go through the grouped matmuls that
      read each K/V head once for its query heads.
    * **What the reference needs and no config field says**, as plain class attributes
      (`attention.reference.model_reference_kwargs` reads them, everything else from the config): `qk_norm`
      (None, `"head"`, `"projection"` or `"l2"`), `norm_offset` (Gemma 3: 1.0) and `rope_interleaved` (Llama 4: True).
    """

    layer_type: str

    @classmethod
    def from_config(cls, config: Any, layer_idx: int, **options: Any) -> "ModelAttention": ...

    def forward(self, x: torch.Tensor, cache: Any = None) -> torch.Tensor: ...

    def new_cache(self, batch_size: int, capacity: int) -> Any: ...


def config_value(config, name, default=REQUIRED):
    """`config.name`, or `config[name]` for a mapping; `default` if absent, `ValueError` naming it if required."""
    if isinstance(config, dict):
        value = config.get(name, default)
    else:
        value = getattr(config, name, default)
    if value is REQUIRED:
        kind = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
        raise ValueError(f"config lacks the field {name!r} (model_type={kind!r})")
    return value


class Registry(dict):
    """A dict whose failed lookup names the valid keys."""

    def __missing__(self, name):
        raise KeyError(f"unknown model_type {name!r}; attention.models.MODELS has: {', '.join(sorted(self))}")


# The families import nothing from this file (each is copyable alone), so importing them here is no cycle.
from attention.models.deepseek_v3 import DeepseekV3Attention  # noqa: E402
from attention.models.deepseek_v32 import DeepseekV32Attention  # noqa: E402
from attention.models.deepseek_v4 import DeepseekV4Attention  # noqa: E402
from attention.models.gemma2 import Gemma2Attention  # noqa: E402
from attention.models.gemma3 import Gemma3Attention  # noqa: E402
from attention.models.gemma4 import Gemma4Attention  # noqa: E402
from attention.models.gpt_oss import GptOssAttention  # noqa: E402
from attention.models.kimi_linear import KimiLinearAttention  # noqa: E402
from attention.models.llama import LlamaAttention  # noqa: E402
from attention.models.llama4 import Llama4TextAttention  # noqa: E402
from attention.models.minimax import MiniMaxAttention  # noqa: E402
from attention.models.olmo2 import Olmo2Attention  # noqa: E402
from attention.models.qwen3 import Qwen3Attention  # noqa: E402
from attention.models.qwen3_next import Qwen3NextAttention  # noqa: E402

# transformers' `model_type` -> the class that builds that model's attention layer (`from_config`).
# MODELS[name] of a name not here raises KeyError listing the known ones.
MODELS = Registry({
    "llama": LlamaAttention,
    "mistral": LlamaAttention,
    "qwen2": LlamaAttention,
    "qwen3": Qwen3Attention,
    # A hybrid: `from_config` builds its gated DeltaNet layers (Qwen3NextGatedDeltaNet) or its gated softmax layers.
    "qwen3_next": Qwen3NextAttention,
    "olmo2": Olmo2Attention,
    "gemma2": Gemma2Attention,
    "gemma3_text": Gemma3Attention,
    # K = V on global layers, two head sizes, and (E2B, E4B) the last layers reusing earlier layers' K/V (`shared_kv`).
    "gemma4_text": Gemma4Attention,
    "gpt_oss": GptOssAttention,
    "llama4_text": Llama4TextAttention,
    # Multi-head latent attention: DeepSeek-V2's layer is DeepSeek-V3's (its rotary pairs always interleaved), and
    # Kimi K2's config.json names its own model_type for DeepSeek-V3's architecture.
    "deepseek_v3": DeepseekV3Attention,
    "deepseek_v2": DeepseekV3Attention,
    "kimi_k2": DeepseekV3Attention,
    # DeepSeek sparse attention: MLA over the positions its lightning indexer picks (`sparse="gather"` or `"mask"`).
    "deepseek_v32": DeepseekV32Attention,
    # One shared K=V head over a sliding window plus compressed entries: CSA (indexer top-k) or HCA (all), by layer.
    "deepseek_v4": DeepseekV4Attention,
    # A hybrid: `from_config` builds its Kimi delta attention layers (KimiDeltaAttention) or its latent attention ones.
    "kimi_linear": KimiLinearAttention,
    # A hybrid: `from_config` builds its lightning attention layers (MiniMaxLightningAttention) or its softmax ones.
    "minimax": MiniMaxAttention,
})
