"""The kernels sweep: the attention kernel alone on prompts, each way PyTorch and this project compute it.

Every row computes `softmax(q kᵀ / sqrt(D)) v` on `(B, H, T, D)` tensors, no projection, causal or not, forward
alone or forward and backward, at `tokens` tokens per batch (`B = tokens // T`) and `width` channels
(`H = width // D`), as FlashAttention's own benchmark does. The kernels (`KERNELS`): SDPA with each of its backends
forced (`flash`, `cudnn`, `efficient`, `math`; the profiler names the kernel that actually ran), compiled
FlexAttention, this project's Triton kernel (`attention/kernels/triton_flash.py`) and the tiled algorithm in plain
PyTorch (`attention/causal/tiled.py`, eager: compiled, its Python loops over tiles would unroll into a graph of
`(T / block)²` tiles). Before a row is timed, its kernel runs at a small shape (batch 1, two heads, `check_len`
positions, not a multiple of any block) against the float64 reference, output and, for forward and backward, the
gradients of q, k and v; a kernel this device cannot run is skipped with the error as its reason.

FLOPs, as FlashAttention's benchmark counts them: `4 B H T² D` for the forward (two matmuls), half that causal, and
3.5 times the forward for forward and backward (the backward's five matmuls, 2.5 forwards). The rate is a share of
a dense matmul of side `matmul_size` timed beside each row (the GPU's ceiling: 8192 on CUDA).
"""

import dataclasses
from typing import Annotated

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention.bench import core, metrics
from attention.bench.results import BOOLEAN, BYTES, MAX_ROWS, POSITIVE, RATE, SHARE, new_row
from attention.causal.flex import causal as causal_mod, compiled_flex_attention
from attention.causal.tiled import tiled_attention
from attention.reference import reference_kernel, tolerance
from attention.schema import config_problems, field_rules, in_range, integer, list_of, one_of, record, rule_of

NAME = "kernels"
KEY = ("kernel", "mode", "causal", "head_dim", "seq_len")  # what tells a row apart in its section
MODES = ("forward", "forward_backward")
INTERPRETER_MAX_ELEMENTS = 2**16  # without a GPU, Triton's interpreter times a row at most `B * H * T * D` this large
BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
            "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa_math": SDPBackend.MATH}


def sdpa(backend):
    def attend(q, k, v, causal):
        with sdpa_kernel(backend):  # that backend only: an error, not a fallback, where it cannot run
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return attend


_block_masks = {}  # (T, device) -> FlexAttention's causal BlockMask


def flex(q, k, v, causal):
    from torch.nn.attention.flex_attention import create_block_mask

    T = q.shape[-2]
    if causal and (T, q.device) not in _block_masks:
        _block_masks[T, q.device] = create_block_mask(causal_mod, None, None, T, T,
                                                      device=q.device)
    if q.device.type == "cpu" and q.requires_grad:
        raise RuntimeError("compiled FlexAttention has no backward on the CPU")
    return compiled_flex_attention(q, k, v, block_mask=_block_masks[T, q.device] if causal else None)


def triton(q, k, v, causal):
    from attention.kernels.triton_flash import flash_attention  # ImportError naming the extra where Triton is missing

    return flash_attention(q, k, v, causal=causal)


KERNELS = {**{name: sdpa(backend) for name, backend in BACKENDS.items()}, "flex": flex, "triton": triton,
           "tiled": lambda q, k, v, causal: tiled_attention(q, k, v, causal=causal)}


@dataclasses.dataclass
class Config:
    """What to measure (see the module docstring): each of `kernels`, `modes`, `causal` settings, `head_dims` and
    `seq_lens` (`tiled` to `tiled_max_len` only: its Python loop runs `(T / 128)²` tiles, each a few small kernels);
    timing per row; the paired matmul's side (default 8192 on CUDA, 1024 elsewhere)."""

    OPTIONS = {"d_model": "width"}  # the command line's --seq-lens sets `seq_lens`, --d-model `width`

    kernels: Annotated[tuple, list_of(one_of(*KERNELS), len(KERNELS))] = tuple(KERNELS)
    modes: Annotated[tuple, list_of(one_of(*MODES), 2)] = MODES
    causal: Annotated[tuple, list_of(BOOLEAN, 2)] = (True, False)
    head_dims: Annotated[tuple, list_of(POSITIVE, 4)] = (64, 128)
    seq_lens: Annotated[tuple, list_of(POSITIVE, 16)] = (512, 1024, 2048, 4096, 8192, 16384)
    tokens: Annotated[int, POSITIVE] = 16384
    width: Annotated[int, POSITIVE] = 2048
    check_len: Annotated[int, POSITIVE] = 200
    tiled_max_len: Annotated[int, POSITIVE] = 4096
    seed: Annotated[int, integer(0, 2**63)] = 0
    min_run_time: Annotated[float, in_range(0, 1e4)] = 0.1
    min_repeats: Annotated[int, POSITIVE] = 3
    warmup_time: Annotated[float, in_range(0, 1e4)] = 0.02
    matmul_size: Annotated[int | None, POSITIVE] = None
    memory_budget_bytes: Annotated[int | None, BYTES] = None

    def resolve(self, device):
        """A copy with the lengths sorted and the device's defaults filled in; `ValueError` naming a bad value."""
        resolved = dataclasses.replace(
            self, kernels=tuple(self.kernels), modes=tuple(self.modes), causal=tuple(self.causal),
            head_dims=tuple(self.head_dims), seq_lens=tuple(sorted(self.seq_lens)),
            matmul_size=self.matmul_size or (8192 if torch.device(device).type == "cuda" else 1024),
            memory_budget_bytes=self.memory_budget_bytes or core.memory_budget(device))
        problems = config_problems(resolved) + [f"{name}: must not be empty" for name in (
            "kernels", "modes", "causal", "head_dims", "seq_lens") if not getattr(resolved, name)]
        problems += [f"head_dims: {D} does not divide width {resolved.width}" for D in resolved.head_dims
                     if resolved.width % D]
        problems += [f"seq_lens: {T} is longer than tokens {resolved.tokens} (batch = tokens // T)"
                     for T in resolved.seq_lens if T > resolved.tokens]
        if problems:
            raise ValueError("; ".join(problems))
        return resolved


class Row(core.Measured, core.PairedMatmul):
    """One kernel, mode, causal setting, head size and prompt length."""

    kernel: Annotated[str, one_of(*KERNELS), "`sdpa_flash`, `sdpa_cudnn`, `sdpa_efficient`, `sdpa_math` (SDPA with "
                      "that backend forced), `flex` (compiled FlexAttention), `triton` (this project's kernel) or "
                      "`tiled` (the tiled algorithm in eager PyTorch)."]
    mode: Annotated[str, one_of(*MODES), '`"forward"`, or `"forward_backward"`: the forward, then the gradients of q, '
                    "k and v."]
    causal: Annotated[bool, BOOLEAN, "Each query attends to the keys at or before its position (else to all)."]
    batch: Annotated[int, POSITIVE, "B: `tokens // seq_len`."]
    num_heads: Annotated[int, POSITIVE, "H: `width // head_dim`, for queries, keys and values."]
    seq_len: Annotated[int, POSITIVE, "T: queries and keys per head."]
    head_dim: Annotated[int, POSITIVE, "D."]
    flops: Annotated[int, integer(), "`4 B H T² D`, halved when causal, times 3.5 for forward and backward."]


def row_flops(row):
    forward = 4 * row["batch"] * row["num_heads"] * row["seq_len"] ** 2 * row["head_dim"] // (2 if row["causal"] else 1)
    return forward if row["mode"] == "forward" else int(forward * (1 + metrics.BACKWARD_FACTOR_ATTENTION))


def run(config, envelope):
    config = config.resolve(envelope.device)
    header = {key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(config).items()}
    cases = [(kernel, mode, causal, D, T) for D in config.head_dims for causal in config.causal for mode in config.modes
             for T in config.seq_lens for kernel in config.kernels]
    section = envelope.open(NAME, header | {"rows": []}, len(cases))
    yardstick = core.matmul_yardstick(envelope.device, envelope.dtype, config.matmul_size)
    for case in cases:
        row = kernel_row(config, case, envelope, yardstick)
        envelope.add(section["rows"], row, "kernels {} {} {} D={} T={}".format(
            case[0], case[1], "causal" if case[2] else "full", case[3], case[4]))
        core.release(envelope.device)


def inputs(shape, seed, device, dtype):
    """`(q, k, v)` of `shape` drawn from `seed` on the CPU (scores of about unit size), on `device` in `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(shape, generator=generator) / (shape[-1] ** 0.25)).to(device, dtype) for _ in range(3))


def checked(row, shape, device, dtype):
    """`{correct, max_abs_error, reason}` of `row`'s kernel, mode and causal setting at `shape` against the float64
    reference, within the row's tolerance: the output, and for `forward_backward` the gradients of q, k and v for a
    random output gradient; the worst of them."""
    kernel, causal, mode = row["kernel"], row["causal"], row["mode"]
    q, k, v = (tensor.requires_grad_(mode != "forward") for tensor in inputs(shape, 1, device, dtype))
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    exact = [tensor.detach().cpu().double().requires_grad_() for tensor in (q, k, v)]
    mask = torch.ones(shape[2], shape[2], dtype=torch.bool).tril() if causal else None
    expected = reference_kernel(*exact, mask)[0]
    with torch.set_grad_enabled(mode != "forward"):
        out = [KERNELS[kernel](q, k, v, causal)]
    if mode != "forward":
        out[0].backward(grad.to(device, dtype))
        expected.backward(grad.double())
        out, expected = out + [q.grad, k.grad, v.grad], [expected] + [tensor.grad for tensor in exact]
    else:
        expected = [expected]
    verdicts = [core.compared(got, want.detach(), row["tolerance"]) for got, want in zip(out, expected)]
    return next((verdict for verdict in verdicts if not verdict["correct"]),
                max(verdicts, key=lambda verdict: verdict["max_abs_error"]))


def kernel_row(config, case, envelope, yardstick):
    """One case's row: checked at the small shape, then timed at its own beside the matmul."""
    kernel, mode, causal, D, T = case
    device, dtype = envelope.device, envelope.dtype
    row = new_row(Row, kernel=kernel, mode=mode, causal=causal, batch=config.tokens // T, num_heads=config.width // D,
                  seq_len=T, head_dim=D, status="ok", tolerance=tolerance(device, envelope.result["dtype"]))
    row["flops"] = row_flops(row)
    shape = (row["batch"], row["num_heads"], T, D)
    element = torch.empty((), dtype=dtype).element_size()
    needed = (3 if mode == "forward" else 9) * row["batch"] * row["num_heads"] * T * D * (element + 4)
    if skip := core.over_budget(needed, config.memory_budget_bytes, "the inputs, outputs and gradients"):
        row.update(status="skipped", reason=skip)
        return row
    if kernel == "tiled" and T > config.tiled_max_len:
        row.update(status="skipped", reason=f"past tiled_max_len {config.tiled_max_len}: the tiled loop's (T / 128)^2 "
                                            "tiles are too many small calls to time here")
        return row
    if kernel == "triton" and device.type == "cpu" and T * D * row["batch"] * row["num_heads"] > INTERPRETER_MAX_ELEMENTS:
        row.update(status="skipped", reason="Triton's interpreter (no GPU) runs the kernel far too slowly to time at "
                                            "this size: the tests check it, a GPU times it")
        return row
    try:
        verdict = checked(row, (1, 2, config.check_len, D), device, dtype)
    except (RuntimeError, ImportError, NotImplementedError) as error:  # this device or install cannot run it
        row.update(status="skipped", reason=core.error_text(error))
        return row
    q, k, v = (tensor.requires_grad_(mode != "forward") for tensor in inputs(shape, config.seed, device, dtype))
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(config.seed + 1)).to(device, dtype)

    def call():
        with torch.set_grad_enabled(mode != "forward"):
            out = KERNELS[kernel](q, k, v, causal)
            if mode != "forward":
                out.backward(grad)
        return out

    def reset():
        q.grad = k.grad = v.grad = None

    try:
        row.update(core.measure(call, lambda out: verdict, device, config, yardstick, reset))
        row.update(core.matmul_rates(row))
    except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
        core.failed(row, error)
    return row


SECTION = record(field_rules(Config) | {"rows": list_of(rule_of(Row), MAX_ROWS)})


def validate(section, result):
    """The section's rules, then each row's batch, heads, FLOPs, rate and share recomputed from its own numbers."""
    problems = SECTION(section, NAME) or ([] if section["rows"] else ["kernels.rows: none"])
    for index, row in enumerate([] if problems else section["rows"]):
        where = f"kernels.rows[{index}] ({row['kernel']}, {row['mode']}, causal={row['causal']}, D={row['head_dim']}, T={row['seq_len']})"
        expected = {"batch": section["tokens"] // row["seq_len"], "num_heads": section["width"] // row["head_dim"],
                    "flops": row_flops(row)}
        problems += core.timed_row_problems(where, row, expected)
    return problems
