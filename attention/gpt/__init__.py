"""A tiny GPT trained by the project: any causal attention class swapped in, text generated with a KV cache.

* `attention.gpt.model`: the model (`GPT`, `GPTConfig`), torch-only, readable top to bottom.
* `attention.gpt.data`: the training text (the Python language reference in `pydoc_data.topics`), as bytes.
* `attention.gpt.train`: the training script, `python -m attention.gpt.train` (see its docstring).
* `attention.gpt.checkpoint`: `load_gpt(attention=name)` loads the shipped checkpoint into any class that fits it.

The page "A tiny GPT, end to end" (`examples/tiny_gpt.py`) loads the checkpoint and shows what it does.
"""

from attention.gpt.checkpoint import CHECKPOINT, PROVENANCE, load_gpt, read_provenance
from attention.gpt.model import GPT, GPTConfig

__all__ = ["CHECKPOINT", "GPT", "GPTConfig", "PROVENANCE", "load_gpt", "read_provenance"]
