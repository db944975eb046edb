"""The bounds sweep: PyTorch's own kernels alone, each timed beside the yardstick the other profiles measure against.

A class's share of the matmul timed beside it (the sequence, block-sparse and prefill profiles) and a decode step's
share of the read timed beside it (the decode profile) mix two things: what the implementation does around the
kernels it calls (projections, layouts, copies) and how fast PyTorch's kernels run on this machine. This sweep
measures the second alone, so a page can say which is which:

* `sdpa_causal` (bounded by the matmul): `F.scaled_dot_product_attention(q, k, v, is_causal=True)` on
  `(batch, num_heads, seq_len, head_dim)` tensors, no projection, its FLOPs counted as the sequence sweep counts
  the attention core, beside a dense matmul in the run's dtype (on a CPU with AMX or AVX-512 BF16, a bfloat16 run's
  matmul is that hardware's; without them, PyTorch emulates it).
* `sdpa_decode` and `scores_matmul` (bounded by the read): one query per head over a cache of `context` positions,
  the whole attention (`sdpa_decode`, reading keys and values) or its first matmul alone (`scores_matmul`, `q kᵀ`,
  reading the keys), beside a sum over a large tensor (the plain read).

Each row is checked against the float64 reference (`attention.reference.reference_kernel`, or a float64 matmul).
"""

import dataclasses
from typing import Annotated, NamedTuple

import torch
import torch.nn.functional as F

from attention.bench import core
from attention.bench.results import BYTES, MAX_ROWS, POSITIVE, RATE, SHARE, disordered, mismatches, new_row
from attention.reference import reference_kernel, tolerance
from attention.schema import config_problems, field_rules, in_range, integer, list_of, one_of, record, rule_of

NAME = "bounds"
KEY = ("kernel", "keys")  # what tells a row apart in its section


class Kernel(NamedTuple):
    bound: str  # "matmul" (its rate in TFLOP/s beside a matmul's) or "read" (GB/s beside a sum's)
    call: str  # the call, as code
    over: str  # what it runs over, in words


KERNELS = {
    "sdpa_causal": Kernel("matmul", "F.scaled_dot_product_attention(q, k, v, is_causal=True)", "a whole prompt"),
    "sdpa_decode": Kernel("read", "F.scaled_dot_product_attention(q, k, v)", "one query per head over a cache"),
    "scores_matmul": Kernel("read", "q @ k.transpose(-1, -2)", "one query per head over a cache's keys"),
}
UNITS = {"matmul": 1e12, "read": 1e9}  # a rate's scale: TFLOP/s, GB/s


@dataclasses.dataclass
class Config:
    """What to measure: `sdpa_causal` at the default profile's headline shape (`batch` sequences of `seq_len`,
    `num_heads` heads of `head_dim`), the read kernels at one sequence (`decode_batch`) of `decode_heads` query and
    key/value heads of `decode_head_dim` over each of `contexts` cached positions (the decode profile's sizes);
    timing per row; the matmul's side (default 2048 on CPU, 4096 elsewhere) and the read's bytes."""

    kernels: Annotated[tuple, list_of(one_of(*KERNELS), len(KERNELS))] = tuple(KERNELS)
    batch: Annotated[int, POSITIVE] = 8
    num_heads: Annotated[int, POSITIVE] = 12
    seq_len: Annotated[int, POSITIVE] = 1024
    head_dim: Annotated[int, POSITIVE] = 64
    decode_batch: Annotated[int, POSITIVE] = 1
    decode_heads: Annotated[int, POSITIVE] = 32
    decode_head_dim: Annotated[int, POSITIVE] = 128
    contexts: Annotated[tuple, list_of(POSITIVE, 16)] = (16384,)
    seed: Annotated[int, integer(0, 2**63)] = 0
    min_run_time: Annotated[float, in_range(0, 1e4)] = 1.0
    min_repeats: Annotated[int, POSITIVE] = 5
    warmup_time: Annotated[float, in_range(0, 1e4)] = 0.25
    matmul_size: Annotated[int | None, POSITIVE] = None
    bandwidth_bytes: Annotated[int, POSITIVE] = 2**29
    memory_budget_bytes: Annotated[int | None, BYTES] = None

    def resolve(self, device):
        """A copy with the contexts sorted and the device's defaults filled in; `ValueError` naming a bad value."""
        resolved = dataclasses.replace(
            self, kernels=tuple(self.kernels), contexts=tuple(sorted(self.contexts)),
            matmul_size=self.matmul_size or (2048 if torch.device(device).type == "cpu" else 4096),
            memory_budget_bytes=self.memory_budget_bytes or core.memory_budget(device))
        problems = config_problems(resolved) + [f"{name}: must not be empty" for name in ("kernels", "contexts")
                                                 if not getattr(resolved, name)]
        if problems:
            raise ValueError("; ".join(problems))
        return resolved


class Row(core.Measured):
    """One kernel at one shape, timed beside its yardstick."""

    kernel: Annotated[str, one_of(*KERNELS), "`sdpa_causal` (a prompt's attention core), `sdpa_decode` (one query per "
                      "head over a cache) or `scores_matmul` (its `q kᵀ` alone)."]
    bound: Annotated[str, one_of(*UNITS), '`"matmul"`: timed beside a dense matmul, `work` in FLOPs; `"read"`: beside '
                     "a sum over a large tensor, `work` in bytes."]
    batch: Annotated[int, POSITIVE, "B."]
    num_heads: Annotated[int, POSITIVE, "H: query heads, and key/value heads (one each)."]
    queries: Annotated[int, POSITIVE, "Queries per head: the prompt's length, or 1 for a decode step."]
    keys: Annotated[int, POSITIVE, "Keys per head: the prompt's length, or the cache's positions."]
    head_dim: Annotated[int, POSITIVE, "Size of one head."]
    element_bytes: Annotated[int, POSITIVE, "Bytes of one element in the run's dtype."]
    work: Annotated[int, integer(), "`matmul`: `2 * B * H * T * T * head_dim` FLOPs, the causal half of the scores and "
                    "weighted sums (as the sequence sweep counts the attention core); `read`: the cache bytes the call "
                    "reads, `B * H * keys * head_dim * element_bytes` for the keys, twice that with the values."]
    rate: Annotated[float | None, RATE, "`work / ms_median`: TFLOP/s (`matmul`) or GB/s (`read`)."]
    yardstick_rate_paired: Annotated[float | None, RATE, "The yardstick's rate timed in blocks interleaved with this "
                                     "row's (median), in the same unit."]
    share_of_paired_yardstick: Annotated[float | None, SHARE, "`rate / yardstick_rate_paired`: the kernel against the "
                                         "machine's matmul or plain read under the same conditions."]


def row_work(row):
    B, H, D = row["batch"], row["num_heads"], row["head_dim"]
    if row["kernel"] == "sdpa_causal":
        return 4 * B * H * row["queries"] * row["keys"] * D // 2
    return B * H * row["keys"] * D * row["element_bytes"] * (2 if row["kernel"] == "sdpa_decode" else 1)


def rates(row):
    """`rate` and `share_of_paired_yardstick` of a measured row, from its own numbers."""
    rate = row["work"] / (row["ms_median"] * 1e-3) / UNITS[row["bound"]]
    return {"rate": rate, "share_of_paired_yardstick": rate / row["yardstick_rate_paired"]}


def run(config, envelope):
    config = config.resolve(envelope.device)
    device, dtype = envelope.device, envelope.dtype
    header = {key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(config).items()}
    cases = ([(kernel, None) for kernel in config.kernels if KERNELS[kernel].bound == "matmul"]  # the prompt's shape
             + [(kernel, context) for kernel in config.kernels if KERNELS[kernel].bound == "read" for context in config.contexts])
    section = envelope.open(NAME, header | {"rows": []}, len(cases))
    yardsticks = {"matmul": core.matmul_yardstick(device, dtype, config.matmul_size),
                  "read": core.bandwidth_yardstick(device, dtype, config.bandwidth_bytes)}
    for kernel, context in cases:
        row = kernel_row(config, kernel, context, envelope, yardsticks[KERNELS[kernel].bound])
        envelope.add(section["rows"], row, f"bounds {kernel}" + (f" context={context}" if context else ""))
        core.release(device)


def shapes(config, kernel, context):
    """`(q's shape, k's and v's shape)` of a row: `(B, H, Tq, D)` and `(B, H, Tk, D)`."""
    if KERNELS[kernel].bound == "matmul":
        return ((config.batch, config.num_heads, config.seq_len, config.head_dim),) * 2
    return ((config.decode_batch, config.decode_heads, 1, config.decode_head_dim),
            (config.decode_batch, config.decode_heads, context, config.decode_head_dim))


def inputs(config, kernel, context, device, dtype):
    """`(q, k, v)` of a row (`shapes`), drawn from the seed on the CPU, then moved to `device` in `dtype`."""
    generator = torch.Generator().manual_seed(config.seed + list(KERNELS).index(kernel))
    shape_q, shape_kv = shapes(config, kernel, context)
    q = torch.randn(shape_q, generator=generator) / shape_q[-1] ** 0.5  # scores of about unit size
    k, v = (torch.randn(shape_kv, generator=generator) for _ in range(2))
    return tuple(t.to(device, dtype) for t in (q, k, v))


def kernel_row(config, kernel, context, envelope, yardstick):
    """One kernel's row: its call, checked on batch element 0 against float64, timed beside `yardstick`."""
    (B, H, T_q, D), (_, _, T_k, _) = shapes(config, kernel, context)
    element_bytes = torch.empty((), dtype=envelope.dtype).element_size()
    row = new_row(Row, kernel=kernel, bound=KERNELS[kernel].bound, batch=B, num_heads=H, queries=T_q, keys=T_k,
                  head_dim=D, element_bytes=element_bytes, status="ok",
                  tolerance=tolerance(envelope.device, envelope.result["dtype"]))
    row["work"] = row_work(row)
    # The inputs in float32 as drawn and in the run's dtype; the float64 check of batch element 0: its q, k and v, and
    # its scores (H x Tq x Tk) with their weights.
    drawn = B * H * (T_q + 2 * T_k) * D * (4 + element_bytes)
    needed = drawn + 8 * H * (T_q * D + 2 * T_k * D + 2 * T_q * T_k)
    if skip := core.over_budget(needed, config.memory_budget_bytes, "the inputs and the float64 check"):
        row.update(status="skipped", reason=skip)
        return row
    q, k, v = inputs(config, kernel, context, envelope.device, envelope.dtype)
    first = [t[:1].cpu() for t in (q, k, v)]
    if kernel == "scores_matmul":
        call, expected = (lambda: q @ k.transpose(-1, -2)), first[0].double() @ first[1].double().transpose(-1, -2)
    else:
        causal = kernel == "sdpa_causal"
        mask = torch.ones(row["queries"], row["keys"], dtype=torch.bool).tril() if causal else None
        call, expected = (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)), reference_kernel(
            *first, mask)[0]
    try:
        with torch.no_grad():
            row.update(core.measure(call, lambda out: core.compared(out[:1], expected, row["tolerance"]),
                                    envelope.device, config, yardstick))
        row["yardstick_rate_paired"] = row.pop(yardstick.field)
        row.update(rates(row))
    except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
        core.failed(row, error)
    return row


SECTION = record(field_rules(Config) | {"rows": list_of(rule_of(Row), MAX_ROWS)})


def validate(section, result):
    """The section's rules, then each row's bound, work, rate and share recomputed from its own numbers."""
    problems = SECTION(section, NAME) or ([] if section["rows"] else ["bounds.rows: none"])
    element_bytes = torch.empty((), dtype=core.DTYPES[result["dtype"]]).element_size()
    for index, row in enumerate([] if problems else section["rows"]):
        where = f"bounds.rows[{index}] ({row['kernel']}, keys={row['keys']})"
        expected = {"element_bytes": element_bytes, "work": row_work(row)}
        if row["bound"] != KERNELS[row["kernel"]].bound:
            problems.append(f"{where}: bound {row['bound']!r} is not its kernel's ({KERNELS[row['kernel']].bound!r})")
        if row["status"] == "ok":
            problems += disordered(where, row) or mismatches(where, row, expected | rates(row))
        else:
            problems += mismatches(where, row, expected)
    return problems
