"""What every rule of this package shares, written once (imports only torch): the checks of its arguments and
`run_form`, the loop over positions or chunks that turns a rule's step and chunk into its forms."""

import torch

FORMS = ("recurrent", "chunked", "quadratic")


def check_inputs(q, k, v, *, form, initial_state, scale, chunk_size, g=None, g_per_channel=False, beta=None):
    """The scale to use (`Dk ** -0.5` by default). `TypeError` for a non-tensor, `ValueError` naming an argument whose
    shape, dtype or values disagree: q and k `(B, H, T, Dk)`, v `(B, H, T, Dv)`, the log-decay `g` (where the rule
    has one) `(B, H, T)` or, `g_per_channel`, `(B, H, T, Dk)`, all `<= 0`; `beta` (where it has one) `(B, H, T)` in
    [0, 1]; `form` one of `FORMS`; `chunk_size` a positive int; `initial_state` `(B, H, Dk, Dv)`."""
    tensors = {name: tensor for name, tensor in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))
               if tensor is not None or name in "qkv"}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got form={form!r}")
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q and k must be (B, H, T, Dk) and v (B, H, T, Dv), got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if g is not None and g.shape != (q.shape if g_per_channel else q.shape[:3]):
        names = "(B, H, T, Dk)" if g_per_channel else "(B, H, T)"
        raise ValueError(f"g must be {names} = {tuple(q.shape if g_per_channel else q.shape[:3])}, got g {tuple(g.shape)}")
    if beta is not None and beta.shape != q.shape[:3]:
        raise ValueError(f"beta must be (B, H, T) = {tuple(q.shape[:3])}, got beta {tuple(beta.shape)}")
    dtypes = {name: tensor.dtype for name, tensor in tensors.items()}
    if len(set(dtypes.values())) != 1 or not q.is_floating_point():
        raise ValueError(f"{', '.join(dtypes)} must share one floating dtype, got {dtypes}")
    if g is not None and (g > 0).any():
        raise ValueError(f"g is a log-decay and must be <= 0 (a decay in (0, 1]), got a largest g of {g.max().item():g}")
    if beta is not None and ((beta < 0) | (beta > 1)).any():
        raise ValueError(f"beta must lie in [0, 1], got values from {beta.min().item():g} to {beta.max().item():g}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got chunk_size={chunk_size!r}")
    expected = (*q.shape[:2], q.shape[-1], v.shape[-1])
    if initial_state is not None and tuple(initial_state.shape) != expected:
        raise ValueError(f"initial_state must be (B, H, Dk, Dv) = {expected}, got {tuple(initial_state.shape)}")
    return q.shape[-1] ** -0.5 if scale is None else scale


def run_form(form, step, chunk, tensors, initial_state, scale, chunk_size):
    """`(out (B, H, T, Dv), final_state)` of a rule in `form`, from its one-position `step(*at_t, state, scale)` and its
    `chunk(scaled q, *rest, state)`; `tensors` are `(q, k, v, ...)` with the positions on dim 2; the state starts at
    `initial_state` (zeros where None)."""
    q, v = tensors[0], tensors[2]
    B, H, T, Dk = q.shape
    state = q.new_zeros(B, H, Dk, v.shape[-1]) if initial_state is None else initial_state.to(q.dtype)
    outs = []
    if form == "recurrent":
        for t in range(T):
            out, state = step(*(tensor[:, :, t] for tensor in tensors), state, scale)
            outs.append(out[:, :, None])
    else:
        size = T if form == "quadratic" else chunk_size
        for start in range(0, T, size):
            q_part, *rest = (tensor[:, :, start:start + size] for tensor in tensors)
            out, state = chunk(q_part * scale, *rest, state)
            outs.append(out)
    return torch.cat(outs, dim=2) if outs else v.new_zeros(B, H, 0, v.shape[-1]), state
