"""The model families' attention fused on compiled FlexAttention: windows as block masks, soft-caps as a
`score_mod`, learned sinks as one more key.

`flex_forward(module, x)` computes `module(x)` (no cache) for a layer of `attention/models/` with its
attention on FlexAttention (https://pytorch.org/blog/flexattention/), one compiled kernel that never writes
out the `(T, S)` scores. Where the layer's own `forward` needs them written out (Gemma 2's soft-cap, gpt-oss's
sinks: SDPA has neither), this is the fused path; the tests prove both equal to the float64 reference.

* **A window** is the mask predicate `attention.masks.sliding_window(w)`; its `BlockMask` lets the kernel skip
  every block of keys wholly outside the window, so a local layer's work grows as `T * w`, not `T²`. Llama 4's
  chunks are `causal` and `same_chunk(c)`, whose blocks outside the diagonal chunks are skipped alike.
* **A soft-cap** is the `score_mod` `softcap * tanh(score / softcap)`, applied in the kernel to each score.
* **Learned sinks**: the sink's share of a row's softmax is `sigmoid(sink - lse)`, `lse` the log-sum-exp of the
  row's scores, so `out_with_sink = out * sigmoid(lse - sink)` for any kernel that returns `lse`. Compiled
  FlexAttention on CPU does not return it (PyTorch 2.13: "`return_lse` is not supported yet"), so here the sink is
  one more key at the end of the sequence, every query attends to it, its value is zero and a `score_mod` sets
  its score to `sinks[h]`: its exponential joins each row's denominator and adds nothing to the numerator. The
  same on every device.

Limits of PyTorch's FlexAttention, stated rather than hidden: compiled on CPU it runs float32, bfloat16 and
float16 only, has no backward (`ValueError` where gradients are needed), and gave wrong rows for some short
sequences, so a sequence runs padded to `attention.causal.flex.MIN_CPU_SEQ_LEN` there (the padded keys come after
every real query, which the causal mask keeps them from). Decoding with a cache runs the layer's own `forward`.
This file imports the project's FlexAttention machinery (`attention/causal/flex.py`, `attention/masks/`):
copy them with it.
"""

import torch
import torch.nn.functional as F

from attention.causal.flex import MIN_CPU_SEQ_LEN, compiled_flex_attention
from attention.masks import and_masks, block_mask, causal, or_masks, sliding_window

_block_masks = {}  # (mask name, q_len, kv_len, device) -> BlockMask, built once


def flex_forward(module, x):
    """`module(x)` for a layer of `attention/models/`, its attention on compiled FlexAttention: `(B, T, hidden_size)`.

    Reads the layer's `qkv`, `o_proj`, `scaling`, `sliding_window` and, where it has them,
    `attn_logit_softcapping` (Gemma 2), `sinks` (gpt-oss) and `attention_chunk_size` (Llama 4).
    """
    B, T, C = x.shape
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in module.parameters()))
    if x.device.type == "cpu" and (x.dtype == torch.float64 or needs_grad):
        raise ValueError(f"compiled FlexAttention on CPU runs float32, bfloat16 and float16 without gradients: got "
                         f"{x.dtype}{' with gradients (use torch.no_grad())' if needs_grad else ''}")
    q, k, v = module.qkv(x, 0)  # (B, H, T, D), (B, H_kv, T, D), (B, H_kv, T, D)
    T_run = max(T, MIN_CPU_SEQ_LEN) if x.device.type == "cpu" else T
    q, k, v = (F.pad(t, (0, 0, 0, T_run - T)) for t in (q, k, v))  # (B, *, T_run, D): padding after the real tokens

    mask_mod = causal if module.sliding_window is None else sliding_window(module.sliding_window)
    chunk = getattr(module, "attention_chunk_size", None)
    if chunk is not None:
        mask_mod = and_masks(causal, same_chunk(chunk))
    softcap = getattr(module, "attn_logit_softcapping", None)
    sinks = getattr(module, "sinks", None)
    if sinks is None:
        score_mod = None if softcap is None else softcap_score_mod(softcap)
    else:
        k, v = (F.pad(t, (0, 0, 0, 1)) for t in (k, v))  # (B, H_kv, T_run + 1, D): a zero key and value at T_run
        mask_mod = or_masks(mask_mod, sink_key(T_run))
        # A sink of +inf (the head attends to nothing) would make the kernel's softmax NaN (inf - inf): the kernel
        # gets 0 in its place, and the head's output is zeroed below.
        infinite_sinks = sinks.detach() == float("inf")  # (H,)
        score_mod = sink_score_mod(sinks.detach().masked_fill(infinite_sinks, 0.0), T_run, softcap)
    key = (mask_mod.__name__, T_run, k.shape[2], str(x.device))
    if key not in _block_masks:
        _block_masks[key] = block_mask(mask_mod, T_run, k.shape[2], x.device)
    attn_output = compiled_flex_attention(q, k, v, score_mod=score_mod, block_mask=_block_masks[key],
                                          scale=module.scaling, enable_gqa=k.shape[1] != q.shape[1])  # (B, H, T_run, D)
    if sinks is not None:
        attn_output = attn_output.masked_fill(infinite_sinks.view(1, -1, 1, 1), 0.0)  # (B, H, T_run, D)
    attn_output = attn_output[:, :, :T].transpose(1, 2).reshape(B, T, -1)  # (B, T, H*D)
    return module.o_proj(attn_output)  # (B, T, hidden_size)


def softcap_score_mod(softcap):
    """The FlexAttention `score_mod` of logit soft-capping: `softcap * tanh(score / softcap)`."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return softcap * torch.tanh(score / softcap)

    return score_mod


def same_chunk(chunk):
    """The mask predicate of Llama 4's chunked attention: query and key in the same chunk of `chunk` positions."""
    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx // chunk == kv_idx // chunk

    mask_mod.__name__ = f"same_chunk_{chunk}"
    return mask_mod


def sink_key(index):
    """The mask predicate of a sink key at position `index`: every query attends to it."""
    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx == index

    mask_mod.__name__ = f"sink_key_{index}"
    return mask_mod


def sink_score_mod(sinks, index, softcap=None):
    """The FlexAttention `score_mod` giving the key at `index` head `h`'s sink logit `sinks[h]` (the other scores
    soft-capped where `softcap` is given)."""
    def score_mod(score, b, h, q_idx, kv_idx):
        capped = score if softcap is None else softcap * torch.tanh(score / softcap)
        return torch.where(kv_idx == index, sinks[h].to(score.dtype), capped)

    return score_mod
