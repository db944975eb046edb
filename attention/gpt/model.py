"""A small GPT-style decoder whose attention layer is any causal self-attention class, torch-only.

The model of nanoGPT (Karpathy, https://github.com/karpathy/nanoGPT, `model.py`) and of GPT-2
(Radford et al., 2019): token embeddings (plus learned position embeddings, unless the attention
class encodes positions itself), a stack of pre-norm blocks `x + attn(ln(x))`, `x + mlp(ln(x))`, a
final layer norm, and a head tied to the token embedding. What differs from nanoGPT is one line:
the attention layer is built from `attention_class`, any class that keeps the causal family's
contract (`attention.causal.CausalSelfAttention`: constructor, `(B, T, C)` forward, canonical state
dict, `position_encoding`), so the same weights run through every implementation.

* Weights move through the **canonical state dict** (`GPT.canonical_state_dict()`): the model's own
  parameters under their names, and each block's attention weights under `blocks.<i>.attn.` in the
  family's canonical names (`query.weight`, ...), whatever layout the class keeps inside.
* **Position encoding**: a class whose `position_encoding` is `"rope"` or `"alibi"` encodes positions
  inside the attention, so the model then has no position embedding.
* **Grouped-query classes** take `num_kv_heads` from `GPTConfig`.
* **Decoding with a KV cache** where the class has one (`new_cache`, as `GroupedQueryAttention`):
  `GPT.new_caches` makes one cache per block and `GPT.forward(idx, caches=caches)` continues the
  cached sequence; `generate` uses them when it can and says so (`GPT.supports_cache`); elsewhere
  it recomputes the whole sequence at every step.

Copy this file with the attention class's file and it runs with `torch` alone.
"""

import inspect
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    """The sizes of a `GPT`.

    Attributes:
        vocab_size: tokens in the vocabulary (256 for bytes).
        context_length: longest sequence, in tokens.
        d_model: width of the residual stream; split into `num_heads` heads of `d_model // num_heads`.
        num_layers: transformer blocks.
        num_heads: query heads per attention layer.
        num_kv_heads: key/value heads, for the classes that take `num_kv_heads` (grouped-query); `None`
            gives them `num_heads` (plain multi-head attention). Other classes ignore it.
        mlp_ratio: hidden width of the MLP over `d_model`.
        dropout: dropout on the residual branches and the embeddings (and passed to the attention
            class, which applies it to its weights) during training.
    """

    vocab_size: int = 256
    context_length: int = 128
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None
    mlp_ratio: int = 4
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "mlp_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {name}={value!r}")
        if self.d_model % self.num_heads != 0:
            raise ValueError(f"GPTConfig.d_model must be divisible by num_heads, got d_model={self.d_model}, "
                             f"num_heads={self.num_heads}")

    def to_dict(self):
        """The sizes as a plain dict (what a checkpoint stores)."""
        return asdict(self)


class MLP(nn.Module):
    """The position-wise feed-forward network: `(B, T, C) -> (B, T, C)` through `mlp_ratio * C` GELU units."""

    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.proj = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.proj(F.gelu(self.fc(x))))  # (B, T, 4C) -> (B, T, C)


class Block(nn.Module):
    """A pre-norm transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`, on `(B, T, C)`."""

    def __init__(self, config, attention_class):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = build_attention(attention_class, config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, cache=None):
        h = self.ln_1(x)  # (B, T, C)
        h = self.attn(h) if cache is None else self.attn(h, cache=cache)  # (B, T, C)
        x = x + self.dropout(h)
        return x + self.mlp(self.ln_2(x))  # (B, T, C)


def build_attention(attention_class, config):
    """One attention layer of `attention_class` for `config`, in the family's constructor signature.

    Grouped-query classes (a `num_kv_heads` keyword) get `config.num_kv_heads`, or `num_heads`
    where that is `None`, so they hold the same weights as the multi-head classes.
    """
    keywords = {}
    if "num_kv_heads" in inspect.signature(attention_class).parameters:
        keywords["num_kv_heads"] = config.num_heads if config.num_kv_heads is None else config.num_kv_heads
    return attention_class(config.d_model, config.d_model, config.context_length, config.dropout, config.num_heads,
                           **keywords)


class GPT(nn.Module):
    """A decoder-only transformer over token ids: `(B, T)` int64 -> logits `(B, T, vocab_size)`.

    Args:
        config: a `GPTConfig`.
        attention_class: a causal self-attention class (`attention.causal.CausalSelfAttention`), e.g.
            `attention.IMPLEMENTATIONS["sdpa_causal"]`; every block gets its own instance.
    """

    def __init__(self, config, attention_class):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        if not isinstance(attention_class, type):
            raise TypeError(f"attention_class must be a class, got {attention_class!r}")
        self.config, self.attention_class = config, attention_class
        self.position_encoding = getattr(attention_class, "position_encoding", None)
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        # Positions are learned here unless the attention encodes them itself (RoPE, ALiBi).
        self.position_embedding = nn.Embedding(config.context_length, config.d_model) if self.position_encoding is None else None
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, attention_class) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied: one matrix embeds tokens and scores them (GPT-2)
        self.apply(init_weights)
        for block in self.blocks:  # GPT-2's scaled init of the projections into the residual stream
            for name, param in block.named_parameters():
                if name in ("attn.out.weight", "mlp.proj.weight"):
                    nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.num_layers))

    @property
    def supports_cache(self):
        """Whether the attention class decodes with a KV cache (it has `new_cache`)."""
        return hasattr(self.blocks[0].attn, "new_cache")

    def forward(self, idx, caches=None):
        """Logits `(B, T, vocab_size)` for token ids `idx` `(B, T)`; with `caches`, `idx` continues the cached sequence."""
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"idx must be a (B, T) int64 tensor of token ids, got {type(idx).__name__} "
                             f"{getattr(idx, 'dtype', '')} {tuple(getattr(idx, 'shape', ()))}")
        B, T = idx.shape
        start = 0 if caches is None else caches[0].length  # the first new token's position
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"caches must hold one cache per block ({len(self.blocks)}), got {len(caches)}")
        if start + T > self.config.context_length:
            raise ValueError(f"sequence of {start + T} tokens (cached {start} + new {T}) is longer than "
                             f"context_length={self.config.context_length}")
        x = self.token_embedding(idx)  # (B, T, C)
        if self.position_embedding is not None:
            x = x + self.position_embedding(torch.arange(start, start + T, device=idx.device))  # (B, T, C) + (T, C)
        x = self.dropout(x)
        for index, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[index])  # (B, T, C)
        return self.head(self.ln_f(x))  # (B, T, vocab_size)

    def new_caches(self, batch_size, capacity=None):
        """One empty KV cache per block (`attention.decoding.DecodingCache`), for up to `capacity` positions.

        `capacity` defaults to `context_length`. `ValueError` where the attention class has no cache.
        """
        if not self.supports_cache:
            raise ValueError(f"{self.attention_class.__name__} has no KV cache (no new_cache method): "
                             f"generate with use_cache=False")
        capacity = self.config.context_length if capacity is None else capacity
        return [block.attn.new_cache(batch_size, capacity) for block in self.blocks]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, *, temperature=0.0, top_k=None, generator=None, use_cache=None):
        """Append `max_new_tokens` tokens to `idx` `(B, T)`, one at a time; returns `(B, T + max_new_tokens)`.

        Args:
            idx: the prompts, a `(B, T)` int64 tensor of token ids in `[0, vocab_size)`, `T >= 1`.
            max_new_tokens: an int >= 0; the prompt and the new tokens must fit in `context_length`.
            temperature: a finite number >= 0. 0 takes the most likely token (greedy); above 0, samples
                from the softmax of `logits / temperature`. A temperature so small that the division
                overflows picks the most likely token too (the limit of sampling as it falls to 0).
            top_k: None, or a positive int: sample among the `top_k` most likely tokens only (all of
                them where `top_k` exceeds the vocabulary).
            generator: a `torch.Generator` for sampling (reproducible text).
            use_cache: True: decode with KV caches (`ValueError` where the class has none); False:
                recompute the whole sequence at every step; None: caches where the class has them.

        Raises:
            TypeError: `idx` not an int64 tensor; `max_new_tokens` not an int (a bool is not);
                `temperature` not a number; `top_k` not an int or None; `use_cache` not a bool or None.
            ValueError: `idx` not 2-D, without a token, or holding an id outside `[0, vocab_size)`;
                `max_new_tokens` negative or past `context_length`; `temperature` negative, NaN or
                infinite; `top_k` below 1; `use_cache=True` for a class without a KV cache.
        """
        check_token_ids(idx, self.config.vocab_size)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got max_new_tokens={max_new_tokens!r}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be non-negative, got max_new_tokens={max_new_tokens}")
        check_sampling(temperature, top_k)
        if use_cache not in (None, True, False):
            raise TypeError(f"use_cache must be True, False or None, got use_cache={use_cache!r}")
        if use_cache is None:
            use_cache = self.supports_cache
        if use_cache and not self.supports_cache:
            raise ValueError(f"use_cache=True, but {self.attention_class.__name__} has no KV cache (no new_cache method)")
        if idx.shape[1] + max_new_tokens > self.config.context_length:
            raise ValueError(f"{idx.shape[1]} prompt tokens + max_new_tokens={max_new_tokens} exceed "
                             f"context_length={self.config.context_length}")
        caches = self.new_caches(idx.shape[0]) if use_cache else None
        logits = self(idx, caches)[:, -1]  # the prompt in one call (prefill): (B, vocab_size)
        for step in range(max_new_tokens):
            next_token = pick_token(logits, temperature, top_k, generator)  # (B, 1)
            idx = torch.cat([idx, next_token], dim=1)  # (B, T + 1)
            if step + 1 < max_new_tokens:  # the last token needs no logits
                logits = (self(next_token, caches) if use_cache else self(idx))[:, -1]  # (B, vocab_size)
        return idx

    def canonical_state_dict(self):
        """The weights under names that do not depend on the attention class.

        The model's own parameters under their names (`token_embedding.weight`, `blocks.0.ln_1.weight`,
        ...; the tied head is `token_embedding.weight`), and each block's attention weights from its
        `canonical_state_dict()` under `blocks.<i>.attn.`.
        """
        state = {name: tensor.detach().clone() for name, tensor in self.state_dict().items()
                 if ".attn." not in name and name != "head.weight"}
        for index, block in enumerate(self.blocks):
            state.update({f"blocks.{index}.attn.{name}": tensor for name, tensor in block.attn.canonical_state_dict().items()})
        return state

    def check_canonical_state(self, state):
        """`ValueError` naming each missing, unexpected or misshapen key of a canonical state dict for this model.

        Reads only the model's shapes: on a model built on the meta device, it checks a state before any memory
        is allocated for the model.
        """
        expected = {name: tuple(tensor.shape) for name, tensor in self.canonical_state_dict().items()}
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        misshapen = [f"{name}: expected {expected[name]}, got {tuple(state[name].shape)}"
                     for name in expected if name in state and tuple(state[name].shape) != expected[name]]
        if missing or unexpected or misshapen:
            problems = [f"missing keys {missing}"] * bool(missing) + [f"unexpected keys {unexpected}"] * bool(unexpected)
            raise ValueError(f"GPT canonical state dict does not fit this model ({self.attention_class.__name__}, "
                             f"{self.config}): " + "; ".join(problems + misshapen))

    def load_canonical_state_dict(self, state):
        """Load a canonical state dict; `ValueError` naming each missing, unexpected or misshapen key."""
        self.check_canonical_state(state)
        own = {name: tensor for name, tensor in state.items() if ".attn." not in name}
        own["head.weight"] = state["token_embedding.weight"]  # the tied head
        self.load_state_dict(own, strict=False)
        for index, block in enumerate(self.blocks):
            prefix = f"blocks.{index}.attn."
            block.attn.load_canonical_state_dict({name[len(prefix):]: tensor for name, tensor in state.items()
                                                  if name.startswith(prefix)})


def check_token_ids(idx, vocab_size):
    """Raise unless `idx` is a `(B, T)` int64 tensor with `T >= 1` and every id in `[0, vocab_size)`."""
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"idx must be a (B, T) int64 tensor of token ids, got idx={type(idx).__name__}")
    if idx.dtype != torch.long:
        raise TypeError(f"idx must be a (B, T) int64 tensor of token ids, got idx.dtype={idx.dtype}")
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(f"idx must be a (B, T) tensor with at least one token (T >= 1), got idx.shape={tuple(idx.shape)}")
    if idx.numel() and (idx.min() < 0 or idx.max() >= vocab_size):
        low, high = idx.min().item(), idx.max().item()
        raise ValueError(f"idx must hold token ids in [0, vocab_size={vocab_size}), got ids from {low} to {high}")


def check_sampling(temperature, top_k):
    """Raise unless `temperature` is a finite number >= 0 and `top_k` is None or an int >= 1."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number, got temperature={temperature!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be finite and >= 0 (0: greedy), got temperature={temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise TypeError(f"top_k must be an int or None, got top_k={top_k!r}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be positive (or None: every token), got top_k={top_k}")


def pick_token(logits, temperature=0.0, top_k=None, generator=None):
    """The next token of each row of `logits` `(B, vocab_size)`: `(B, 1)`, greedy or sampled.

    `temperature` and `top_k` as `GPT.generate` takes them (`check_sampling`).
    """
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    # Shifted so the largest is 0, in float64 (where the temperature, a Python float, cannot round to 0): a
    # temperature so small that the division overflows sends every other token to -inf and keeps the largest at 0,
    # which is greedy, the limit; unshifted, the largest would overflow too and the softmax give NaN.
    dtype, logits = logits.dtype, logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # (B, vocab_size), <= 0
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1).to(dtype)  # (B, vocab_size)
    return torch.multinomial(probs, 1, generator=generator)  # (B, 1)


def init_weights(module):
    """GPT-2's initialisation: normal(0, 0.02) weights, zero biases (layer norms keep ones and zeros)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
