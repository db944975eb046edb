"""Turning a mask predicate into a dense boolean mask or a FlexAttention `BlockMask`, and combining predicates.

A mask is written once, as the FlexAttention predicate `mask_mod(b, h, q_idx, kv_idx) -> bool tensor`
(True = attend; https://pytorch.org/blog/flexattention/, meta-pytorch/attention-gym `attn_gym/masks/`).
Inside FlexAttention the four indices are scalar tensors; here `dense_mask` passes index tensors
shaped to broadcast against each other, so the same predicate yields a whole `(Tq, Tk)` or
`(B, H, Tq, Tk)` mask in one vectorised call, with no Python loop over positions.
"""

import torch
from torch.nn.attention.flex_attention import create_block_mask

from attention.checks import check_int


def dense_mask(mask_mod, q_len, kv_len, device=None, batch=None, heads=None):
    """Evaluate `mask_mod` on every (query, key) pair at once.

    Args:
        mask_mod: predicate `(b, h, q_idx, kv_idx) -> bool tensor`, True = attend.
        q_len: number of queries Tq.
        kv_len: number of keys Tk.
        device: device of the result (and of the index tensors passed to `mask_mod`).
        batch: B; when given (or `heads` is), `b` runs over `range(batch)` and the result is 4-D.
        heads: H; when given (or `batch` is), `h` runs over `range(heads)` and the result is 4-D.

    Returns:
        Boolean tensor, True = attend: `(Tq, Tk)` when neither `batch` nor `heads` is given (then
        `b` and `h` are 0), else `(B, H, Tq, Tk)` with B or H equal to 1 where not given.
    """
    check_int("q_len", q_len)
    check_int("kv_len", kv_len)
    q_idx = torch.arange(q_len, device=device)  # (Tq,)
    kv_idx = torch.arange(kv_len, device=device)  # (Tk,)
    if batch is None and heads is None:
        zero = torch.zeros((), dtype=torch.long, device=device)
        mask = mask_mod(zero, zero, q_idx[:, None], kv_idx[None, :])  # broadcasts to (Tq, Tk)
        return torch.as_tensor(mask, device=device).to(torch.bool).expand(q_len, kv_len).contiguous()
    B = 1 if batch is None else batch
    H = 1 if heads is None else heads
    check_int("batch", B)
    check_int("heads", H)
    b = torch.arange(B, device=device).view(B, 1, 1, 1)  # (B, 1, 1, 1)
    h = torch.arange(H, device=device).view(1, H, 1, 1)  # (1, H, 1, 1)
    mask = mask_mod(b, h, q_idx.view(1, 1, q_len, 1), kv_idx.view(1, 1, 1, kv_len))  # broadcasts to (B, H, Tq, Tk)
    return torch.as_tensor(mask, device=device).to(torch.bool).expand(B, H, q_len, kv_len).contiguous()


def block_mask(mask_mod, q_len, kv_len, device, B=None, H=None):
    """The FlexAttention `BlockMask` of `mask_mod`: which (128 x 128) blocks hold any attended pair.

    Args:
        mask_mod: predicate `(b, h, q_idx, kv_idx) -> bool tensor`, True = attend.
        q_len: number of queries Tq.
        kv_len: number of keys Tk.
        device: device the attention will run on.
        B: batch size, if the mask depends on `b`; None broadcasts one mask over the batch.
        H: number of heads, if the mask depends on `h`; None broadcasts one mask over the heads.

    Returns:
        A `torch.nn.attention.flex_attention.BlockMask` for `flex_attention(..., block_mask=...)`.
    """
    check_int("q_len", q_len)
    check_int("kv_len", kv_len)
    return create_block_mask(mask_mod, B=B, H=H, Q_LEN=q_len, KV_LEN=kv_len, device=device)


def density(mask_mod, q_len, kv_len=None, batch=None, heads=None):
    """Share of (query, key) pairs that `mask_mod` lets attend, in [0, 1] (`kv_len` defaults to `q_len`)."""
    kv_len = q_len if kv_len is None else kv_len
    return dense_mask(mask_mod, q_len, kv_len, batch=batch, heads=heads).float().mean().item()


def and_masks(*mask_mods):
    """A predicate that attends where every one of `mask_mods` attends; named `a_and_b_...`."""
    check_mask_mods("and_masks", mask_mods)

    def mask_mod(b, h, q_idx, kv_idx):
        result = mask_mods[0](b, h, q_idx, kv_idx)
        for other in mask_mods[1:]:
            result = result & other(b, h, q_idx, kv_idx)
        return result

    mask_mod.__name__ = "_and_".join(mod.__name__ for mod in mask_mods)
    return mask_mod


def or_masks(*mask_mods):
    """A predicate that attends where any one of `mask_mods` attends; named `a_or_b_...`."""
    check_mask_mods("or_masks", mask_mods)

    def mask_mod(b, h, q_idx, kv_idx):
        result = mask_mods[0](b, h, q_idx, kv_idx)
        for other in mask_mods[1:]:
            result = result | other(b, h, q_idx, kv_idx)
        return result

    mask_mod.__name__ = "_or_".join(mod.__name__ for mod in mask_mods)
    return mask_mod




def check_mask_mods(combinator, mask_mods):
    """Raise a clear error unless `mask_mods` is a non-empty sequence of callables."""
    if not mask_mods:
        raise ValueError(f"{combinator} needs at least one mask_mod, got none")
    for position, mod in enumerate(mask_mods):
        if not callable(mod):
            raise TypeError(f"{combinator}: mask_mods[{position}] must be callable, got {type(mod).__name__}")
