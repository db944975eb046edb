"""Saving and loading a trained `GPT`: its sizes, the attention class it was trained with, and its
canonical state dict, so the weights load into any causal class that fits them.

`load_gpt()` loads the checkpoint shipped with the package (`CHECKPOINT`, trained by
`python -m attention.gpt.train`; its provenance and training log are `PROVENANCE`).
"""

import json
from pathlib import Path

import torch

from attention.gpt.model import GPT, GPTConfig
from attention.registry import IMPLEMENTATIONS

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
CHECKPOINT = CHECKPOINT_DIR / "tiny_gpt.pt"
PROVENANCE = CHECKPOINT_DIR / "tiny_gpt.json"
FORMAT = "attention.gpt checkpoint, version 1"


def save_checkpoint(model, attention_name, path):
    """Write `model`'s sizes, `attention_name` (its class's registry name) and canonical state dict to `path`."""
    torch.save({"format": FORMAT, "config": model.config.to_dict(), "attention": attention_name,
                "state": model.canonical_state_dict()}, path)


def read_checkpoint(path=CHECKPOINT):
    """The checkpoint's dict (`format`, `config`, `attention`, `state`), read without running pickled code."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise ValueError(f"{path} is not an {FORMAT!r} file (its format: "
                         f"{checkpoint.get('format') if isinstance(checkpoint, dict) else type(checkpoint).__name__!r})")
    return checkpoint


def read_provenance(path=PROVENANCE):
    """The training run's record beside the checkpoint: provenance, final losses and the training log."""
    return json.loads(Path(path).read_text())


def load_gpt(path=CHECKPOINT, attention=None, **attention_sizes):
    """The `GPT` of a checkpoint in eval mode, its attention layers of class `IMPLEMENTATIONS[attention]`.

    Args:
        path: a file written by `save_checkpoint` (default: the shipped `CHECKPOINT`).
        attention: a registry name (`attention.IMPLEMENTATIONS`); default, the class it was trained with.
        attention_sizes: `GPTConfig` fields to override, e.g. `num_kv_heads` (then the weights must fit them).

    Raises:
        KeyError: an unknown `attention` name (listing the valid ones).
        ValueError: a class whose position encoding differs from the trained class's (the weights would
            run a different model), or weights whose shapes do not fit the class (each key named, with
            its expected and actual shape).
    """
    checkpoint = read_checkpoint(path)
    trained_name = checkpoint["attention"]
    name = trained_name if attention is None else attention
    attention_class, trained_class = IMPLEMENTATIONS[name], IMPLEMENTATIONS[trained_name]
    if attention_class.position_encoding != trained_class.position_encoding:
        raise ValueError(f"attention={name!r} ({attention_class.__name__}) applies position_encoding="
                         f"{attention_class.position_encoding!r}, but the checkpoint was trained with {trained_name!r} "
                         f"(position_encoding={trained_class.position_encoding!r}): its weights do not fit that model")
    config = GPTConfig(**{**checkpoint["config"], **attention_sizes, "dropout": 0.0})  # inference: no dropout
    model = GPT(config, attention_class)
    model.load_canonical_state_dict(checkpoint["state"])
    return model.eval()
