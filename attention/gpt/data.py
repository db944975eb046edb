"""The text the tiny GPT learns, as bytes: the language reference of Python's standard library.

`pydoc_data.topics` holds the text of the Python language reference that `help()` shows (statements,
operators, special methods...), about 0.5 MB of English and code in every Python install. The model
reads it as UTF-8 bytes (a vocabulary of 256 tokens, nothing to store); the last `VALIDATION_SHARE`
of the bytes is held out for validation.
"""

import hashlib

import torch

VOCAB_SIZE = 256  # one token per byte value
VALIDATION_SHARE = 0.1


def training_text():
    """The language reference text of `pydoc_data.topics`: every topic, sorted by name, joined by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def text_sha256(text):
    """SHA-256 (hex) of the text's UTF-8 bytes: which text a checkpoint was trained on (it differs between Pythons)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def encode(text):
    """Token ids of `text`: its UTF-8 bytes, `(N,)` int64."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(ids):
    """Text of token ids (a tensor or a list of ints); bytes that do not form UTF-8 show as U+FFFD."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    return bytes(ids).decode("utf-8", errors="replace")


def split(data, validation_share=VALIDATION_SHARE):
    """`(train, validation)`: the first `1 - validation_share` of the tokens, and the rest."""
    cut = int(len(data) * (1 - validation_share))
    return data[:cut], data[cut:]


def random_batch(data, batch_size, context_length, generator):
    """`(inputs, targets)`, each `(batch_size, context_length)`: windows at random offsets, targets one token on."""
    starts = torch.randint(len(data) - context_length, (batch_size,), generator=generator)  # (B,)
    offsets = starts[:, None] + torch.arange(context_length)[None, :]  # (B, T)
    return data[offsets], data[offsets + 1]


def windows(data, context_length, count=None):
    """`(inputs, targets)` of consecutive windows of `data`, `(N, context_length)`: all of them, or
    `count` spread evenly over `data`, so an evaluation covers the same tokens every time."""
    total = (len(data) - 1) // context_length
    picks = torch.arange(total) if count is None or count >= total else torch.linspace(0, total - 1, count).long()
    offsets = picks[:, None] * context_length + torch.arange(context_length)[None, :]  # (N, T)
    return data[offsets], data[offsets + 1]


@torch.no_grad()
def evaluate(model, data, count=None, batch_size=64):
    """Mean cross-entropy (nats per byte) of `model` over the windows of `data` (`windows`), in eval mode."""
    was_training = model.training
    model.eval()
    inputs, targets = windows(data, model.config.context_length, count)
    total, tokens = 0.0, 0
    for start in range(0, len(inputs), batch_size):
        logits = model(inputs[start:start + batch_size])  # (b, T, vocab)
        batch_targets = targets[start:start + batch_size]
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch_targets.flatten(),
                                                   reduction="sum").item()
        tokens += batch_targets.numel()
    model.train(was_training)
    return total / tokens
