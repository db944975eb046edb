"""The linear sweep: linear attention against softmax attention, by prompt length and by cached context.

The rule is the gated delta rule (`attention.linear.gated_delta_rule`: Qwen3-Next's and Qwen3.5's linear layers),
its attention core alone on `(B, H, T, D)` tensors, no projection, q and k L2-normalised as the layers feed it.
Three parts, each a kind of row (`part`):

* `prefill`: a causal prompt of `T` tokens, the rule in each form (`recurrent`, the definition, one position at a
  time, to `recurrent_max_len`; `chunked`, chunks of `chunk_size`; `quadratic`, the whole prompt as one chunk, to
  `quadratic_max_len`: its `(T, T)` decay mask grows as softmax attention's scores do) against SDPA's causal
  attention (`sdpa`) on the same q, k and v;
* `chunk`: the chunked form on a prompt of `chunk_len` tokens, for each of `chunk_sizes`;
* `decode`: one new token after `T` cached positions: the rule's step over its state (`state_step`, the same size at
  every context) against SDPA over a KV cache of `T` positions (`kv_cache_step`).

Each row is first checked at a small shape against the float64 reference (`attention.reference`: the rule by its
definition, `reference_delta_rule`, or `reference_kernel`), then timed beside a dense matmul of side `matmul_size`.
FLOPs are the matmuls' multiply-adds, times 2 (`row_flops`): SDPA `2 B H T² D` causal; the recurrence `7 B H T D²`
(decay, recall, write, read); a chunk of `c` positions `7 c² D + 6 c D²` per head (its five `c x c` products and the
state's four), so the chunked form is linear in `T` and the quadratic form (`c = T`) quadratic.
"""

import dataclasses
from typing import Annotated

import torch
import torch.nn.functional as F

from attention.bench import core
from attention.bench.results import BYTES, MAX_ROWS, POSITIVE, new_row
from attention.linear import gated_delta_rule, gated_delta_step
from attention.reference import reference_delta_rule, reference_kernel, tolerance
from attention.schema import config_problems, field_rules, in_range, integer, list_of, nullable, one_of, record, rule_of

NAME = "linear"
KEY = ("part", "kernel", "seq_len", "chunk_size")  # what tells a row apart in its section
PARTS = ("prefill", "chunk", "decode")
FORMS = ("recurrent", "chunked", "quadratic")
PREFILL_KERNELS = (*FORMS, "sdpa")
DECODE_KERNELS = ("state_step", "kv_cache_step")


@dataclasses.dataclass
class Config:
    """What to measure (see the module docstring): `num_heads` heads of `head_dim` (keys and values alike), batch
    `batch`; the prefill's `seq_lens` and `kernels`, the chunk sizes at `chunk_len`, the decode's `contexts`; timing
    per row; the paired matmul's side (default 1024 on CPU, 8192 on CUDA)."""

    OPTIONS = {"sweep_batch": "batch"}  # the command line's --seq-lens sets `seq_lens`, --heads `num_heads`

    parts: Annotated[tuple, list_of(one_of(*PARTS), 3)] = PARTS
    kernels: Annotated[tuple, list_of(one_of(*PREFILL_KERNELS), 4)] = PREFILL_KERNELS
    batch: Annotated[int, POSITIVE] = 1
    num_heads: Annotated[int, POSITIVE] = 4
    head_dim: Annotated[int, POSITIVE] = 128
    seq_lens: Annotated[tuple, list_of(POSITIVE, 16)] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    chunk_size: Annotated[int, POSITIVE] = 64
    recurrent_max_len: Annotated[int, POSITIVE] = 4096
    quadratic_max_len: Annotated[int, POSITIVE] = 4096
    chunk_len: Annotated[int, POSITIVE] = 4096
    chunk_sizes: Annotated[tuple, list_of(POSITIVE, 16)] = (16, 32, 64, 128, 256)
    contexts: Annotated[tuple, list_of(POSITIVE, 16)] = (1024, 4096, 16384, 65536, 131072)
    check_len: Annotated[int, POSITIVE] = 100
    seed: Annotated[int, integer(0, 2**63)] = 0
    min_run_time: Annotated[float, in_range(0, 1e4)] = 0.5
    min_repeats: Annotated[int, POSITIVE] = 3
    warmup_time: Annotated[float, in_range(0, 1e4)] = 0.1
    matmul_size: Annotated[int | None, POSITIVE] = None
    memory_budget_bytes: Annotated[int | None, BYTES] = None

    def resolve(self, device):
        """A copy with the lengths sorted and the device's defaults filled in; `ValueError` naming a bad value."""
        resolved = dataclasses.replace(
            self, parts=tuple(self.parts), kernels=tuple(self.kernels), seq_lens=tuple(sorted(self.seq_lens)),
            chunk_sizes=tuple(sorted(self.chunk_sizes)), contexts=tuple(sorted(self.contexts)),
            matmul_size=self.matmul_size or (8192 if torch.device(device).type == "cuda" else 1024),
            memory_budget_bytes=self.memory_budget_bytes or core.memory_budget(device))
        problems = config_problems(resolved) + [f"{name}: must not be empty" for name in (
            "parts", "kernels", "seq_lens", "chunk_sizes", "contexts") if not getattr(resolved, name)]
        if problems:
            raise ValueError("; ".join(problems))
        return resolved


class Row(core.Measured, core.PairedMatmul):
    """One part, kernel, length and chunk size."""

    part: Annotated[str, one_of(*PARTS), '`"prefill"` (a prompt), `"chunk"` (the chunked form by chunk size) or '
                    '`"decode"` (one token after a cached context).']
    kernel: Annotated[str, one_of(*PREFILL_KERNELS, *DECODE_KERNELS), "The gated delta rule's form (`recurrent`, "
                      "`chunked`, `quadratic`) or SDPA's causal attention (`sdpa`); decoding, the rule's step over its "
                      "state (`state_step`) or SDPA over a KV cache (`kv_cache_step`)."]
    batch: Annotated[int, POSITIVE, "B."]
    num_heads: Annotated[int, POSITIVE, "H, for queries, keys and values."]
    head_dim: Annotated[int, POSITIVE, "D, of keys and values alike."]
    seq_len: Annotated[int, POSITIVE, "The prompt's tokens, or decoding, the positions cached before the new token."]
    chunk_size: Annotated[int | None, nullable(POSITIVE), "The chunked form's chunk (null for the other kernels)."]
    flops: Annotated[int, integer(), "The matmuls' multiply-adds times 2 (`row_flops`)."]
    memory_bytes: Annotated[int | None, nullable(BYTES), "Decoding: the bytes the step reads that grow with the "
                            "context or not, the state's (`B H D² x 4`, float32) or the KV cache's (`2 B H T D x` the "
                            "element size); null for a prompt."]
    tokens_per_s: Annotated[float | None, in_range(0, 1e15), "`B x tokens / ms_median`: a prompt's tokens, or the "
                            "one new token of each sequence."]


def chunk_flops(length, chunk, D):
    """Per head: the chunks of `length` positions, each `c` long (the last shorter), `7 c² D + 6 c D²` each."""
    full, rest = divmod(length, chunk)
    return sum(7 * c * c * D + 6 * c * D * D for c in [chunk] * full + ([rest] if rest else []))


def row_flops(row):
    B, H, T, D = row["batch"], row["num_heads"], row["seq_len"], row["head_dim"]
    kernel = row["kernel"]
    if kernel == "sdpa":
        return 2 * B * H * T * T * D  # q kᵀ and the weights times v, half of each under the causal mask
    if kernel == "recurrent":
        return 7 * B * H * T * D * D
    if kernel in ("chunked", "quadratic"):
        return B * H * chunk_flops(T, row["chunk_size"] or T, D)
    if kernel == "state_step":
        return 7 * B * H * D * D
    return 4 * B * H * T * D  # kv_cache_step: one query's scores and weighted sum over T positions


def run(config, envelope):
    config = config.resolve(envelope.device)
    header = {key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(config).items()}
    cases = ([("prefill", kernel, T, config.chunk_size if kernel == "chunked" else None)
              for T in config.seq_lens for kernel in config.kernels] * ("prefill" in config.parts)
             + [("chunk", "chunked", config.chunk_len, C) for C in config.chunk_sizes] * ("chunk" in config.parts)
             + [("decode", kernel, T, None) for T in config.contexts for kernel in DECODE_KERNELS]
             * ("decode" in config.parts))
    section = envelope.open(NAME, header | {"rows": []}, len(cases))
    yardstick = core.matmul_yardstick(envelope.device, envelope.dtype, config.matmul_size)
    for case in cases:
        row = linear_row(config, case, envelope, yardstick)
        envelope.add(section["rows"], row, "linear {} {} T={}{}".format(
            case[0], case[1], case[2], "" if case[3] is None else f" chunk={case[3]}"))
        core.release(envelope.device)


def rule_inputs(shape, seed, device, dtype):
    """`(q, k, v, g, beta)` of `shape` `(B, H, T, D)` as a gated DeltaNet layer feeds the rule: q and k L2-normalised
    per head, log-decays `g = logsigmoid(x + 4)` (decays of about 0.98), `beta = sigmoid(x)`; drawn from `seed` on the
    CPU."""
    B, H, T, D = shape
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=generator) for _ in range(3))
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    g = F.logsigmoid(torch.randn(B, H, T, generator=generator) + 4)
    beta = torch.sigmoid(torch.randn(B, H, T, generator=generator))
    return tuple(tensor.to(device, dtype) for tensor in (q, k, v, g, beta))


def attend(kernel, tensors, chunk_size, state=None, cache_len=None):
    """The row's computation on `tensors` (`rule_inputs`): a form of the rule, SDPA's causal attention, the rule's
    step from `state`, or one query over the first `cache_len` keys and values."""
    q, k, v, g, beta = tensors
    if kernel in FORMS:
        return gated_delta_rule(q, k, v, g, beta, form=kernel, chunk_size=chunk_size or 64)[0]
    if kernel == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if kernel == "state_step":
        return gated_delta_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], g[:, :, 0], beta[:, :, 0], state,
                                q.shape[-1] ** -0.5)[0]
    return F.scaled_dot_product_attention(q[:, :, -1:], k[:, :, :cache_len], v[:, :, :cache_len])  # kv_cache_step
    # (the last position's query over every cached key and value: the new token's, its own key appended, alike)


def expected(kernel, tensors, state=None, cache_len=None):
    """The float64 reference of `attend`'s computation."""
    q, k, v, g, beta = tensors
    if kernel in FORMS:
        return reference_delta_rule(q, k, v, g, beta)[0]
    if kernel == "sdpa":
        T = q.shape[2]
        return reference_kernel(q, k, v, torch.ones(T, T, dtype=torch.bool, device=q.device).tril())[0]
    if kernel == "state_step":
        return reference_delta_rule(q[:, :, :1], k[:, :, :1], v[:, :, :1], g[:, :, :1], beta[:, :, :1],
                                    initial_state=state)[0][:, :, 0]
    return reference_kernel(q[:, :, -1:], k[:, :, :cache_len], v[:, :, :cache_len])[0]


def linear_row(config, case, envelope, yardstick):
    """One case's row: checked at the small shape against float64, then timed at its own beside the matmul."""
    part, kernel, T, chunk_size = case
    device, dtype = envelope.device, envelope.dtype
    B, H, D = config.batch, config.num_heads, config.head_dim
    row = new_row(Row, part=part, kernel=kernel, batch=B, num_heads=H, head_dim=D, seq_len=T, chunk_size=chunk_size,
                  status="ok", tolerance=tolerance(device, envelope.result["dtype"]))
    row["flops"] = row_flops(row)
    element = torch.empty((), dtype=dtype).element_size()
    decoding = part == "decode"
    if decoding:
        row["memory_bytes"] = B * H * D * D * 4 if kernel == "state_step" else 2 * B * H * T * D * element
    length = 1 if kernel == "state_step" else T  # the step's one token, or the prompt (the cached positions)
    largest = 6 * B * H * T * T * 4 if kernel == "quadratic" else 0  # its (T, T) masks (SDPA's kernels tile theirs)
    needed = 5 * B * H * length * D * element + largest
    if skip := core.over_budget(needed, config.memory_budget_bytes, "the inputs and the largest intermediates"):
        row.update(status="skipped", reason=skip)
        return row
    for name, limit in (("recurrent", config.recurrent_max_len), ("quadratic", config.quadratic_max_len)):
        if kernel == name and T > limit:
            row.update(status="skipped", reason=f"past {name}_max_len {limit}: "
                       + ("one position at a time is too many small calls to time here" if name == "recurrent"
                          else "its (T, T) decay mask grows as softmax's scores do"))
            return row
    state = torch.randn(B, H, D, D, generator=torch.Generator().manual_seed(config.seed + 3)).to(device, torch.float32)
    small = rule_inputs((1, 2, config.check_len, D), config.seed + 1, device, dtype)
    small_state = state[:1, :2].to(dtype)
    try:
        got = attend(kernel, small, chunk_size, small_state, config.check_len)
        verdict = core.compared(got, expected(kernel, small, small_state, config.check_len), row["tolerance"])
    except Exception as error:  # noqa: BLE001 - this device cannot run it: the row says why
        row.update(status="skipped", reason=core.error_text(error))
        return row
    tensors = rule_inputs((B, H, length, D), config.seed, device, dtype)
    step_state = state.to(dtype)

    def call():
        with torch.no_grad():
            return attend(kernel, tensors, chunk_size, step_state, T)

    try:
        row.update(core.measure(call, lambda out: verdict, device, config, yardstick))
        row.update(core.matmul_rates(row))
        row["tokens_per_s"] = B * (1 if decoding else T) / (row["ms_median"] * 1e-3)
    except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
        core.failed(row, error)
    return row


SECTION = record(field_rules(Config) | {"rows": list_of(rule_of(Row), MAX_ROWS)})


def validate(section, result):
    """The section's rules, then each row's sizes, FLOPs, bytes, rates and share recomputed from its own numbers."""
    problems = SECTION(section, NAME) or ([] if section["rows"] else ["linear.rows: none"])
    element = torch.empty((), dtype=core.DTYPES.get(result["dtype"], torch.float32)).element_size()
    for index, row in enumerate([] if problems else section["rows"]):
        where = f"linear.rows[{index}] ({row['part']}, {row['kernel']}, T={row['seq_len']}, chunk={row['chunk_size']})"
        decoding = row["part"] == "decode"
        if (row["kernel"] in DECODE_KERNELS) != decoding:
            problems.append(f"{where}: kernel {row['kernel']!r} does not belong to part {row['part']!r}")
            continue
        if (row["chunk_size"] is not None) != (row["kernel"] == "chunked"):
            problems.append(f"{where}: chunk_size {row['chunk_size']}: set on the chunked form's rows only")
            continue
        B, H, D, T = row["batch"], row["num_heads"], row["head_dim"], row["seq_len"]
        wanted = {"flops": row_flops(row)}
        if decoding:
            wanted["memory_bytes"] = B * H * D * D * 4 if row["kernel"] == "state_step" else 2 * B * H * T * D * element
        elif row["memory_bytes"] is not None:
            problems.append(f"{where}: memory_bytes {row['memory_bytes']}: set on decode rows only")
        if row["status"] == "ok":
            wanted["tokens_per_s"] = B * (1 if decoding else T) / (row["ms_median"] * 1e-3)
        problems += core.timed_row_problems(where, row, wanted)
    return problems
