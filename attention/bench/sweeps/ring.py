"""The ring sweep: context-parallel (ring) attention on 1, 2, 4 (`world_sizes`) local processes at one total length.

For each process count P (`world_sizes`) the sweep launches P processes joined by a gloo process group
(`attention.distributed.launch`), each holding its shard of one sequence of `seq_len` positions. Every
process runs the ring forward and backward once for the check (`attention.distributed.check.run_case`: the
shards are joined here and compared with the float64 reference on the whole sequence), then
`measure_ring` (below): per call (forward, and forward + backward) the time of the
slowest process, each process's peak tensor memory, and the bytes each process sent at each exchange,
counted where they are handed to `batch_isend_irecv`, beside what the ring should send (from the shapes).
A row is one process count and one mode. A matmul's rate, timed in this process just before and after
each launch, is the machine's ceiling the row's rate is set against.

On one machine the P processes share its cores: the times show how the cores are shared, not the speed-up
of one device per process. What P changes here is the memory each process needs and the bytes it sends.
"""

import dataclasses
import statistics
import time
from typing import Annotated

import torch
import torch.distributed as dist

from attention.bench import core, metrics
from attention.bench.results import BYTES, MAX_ROWS, POSITIVE, RATE, SHARE, disordered, mismatches, new_row
from attention.schema import BOOLEAN, config_problems, field_rules, in_range, integer, list_of, one_of, record, rule_of
from attention.distributed import check, launch
from attention.distributed.accounting import count_sent_bytes, expected_sent_bytes
from attention.distributed.ring import LAYOUTS, padded_length, ring_attention, shard_sequence
from attention.reference import tolerance

NAME = "ring"
KEY = ("world_size", "mode")  # what tells a row apart in its section
MODES = ("forward", "forward_backward")
MAX_PROCESSES = 64


@dataclasses.dataclass
class Config:
    """What to measure: one sequence (`batch`, `num_heads` query heads, `num_kv_heads` key/value heads, `seq_len`,
    `head_dim`, `causal`, `layout`) on each of `world_sizes` processes; `repeats` timed calls per mode; the side
    of the matmul whose rate is the machine's ceiling, and the seconds each sample of its rate is timed."""

    OPTIONS = {"min_repeats": "repeats"}  # the command line's --repeats

    world_sizes: Annotated[tuple, list_of(integer(1, MAX_PROCESSES), 8)] = (1, 2, 4)
    batch: Annotated[int, POSITIVE] = 1
    num_heads: Annotated[int, POSITIVE] = 8
    num_kv_heads: Annotated[int, POSITIVE] = 2
    seq_len: Annotated[int, POSITIVE] = 2048
    head_dim: Annotated[int, POSITIVE] = 64
    causal: Annotated[bool, BOOLEAN] = True
    layout: Annotated[str, one_of(*LAYOUTS)] = "zigzag"
    repeats: Annotated[int, POSITIVE] = 5
    seed: Annotated[int, integer(0, 2**63)] = 0
    matmul_size: Annotated[int, POSITIVE] = 2048
    min_run_time: Annotated[float, in_range(0, 1e4)] = 0.5

    def resolve(self, device):
        """A copy with the process counts sorted; `ValueError` naming a bad value or a device other than the CPU."""
        resolved = dataclasses.replace(self, world_sizes=tuple(sorted(set(self.world_sizes))))
        problems = config_problems(resolved) + ([] if resolved.world_sizes else ["world_sizes: must not be empty"])
        if not problems and self.num_heads % self.num_kv_heads:
            problems.append(f"num_kv_heads must divide num_heads, got num_heads={self.num_heads}, "
                            f"num_kv_heads={self.num_kv_heads}")
        if torch.device(device).type != "cpu":
            problems.append(f"device: the ring sweep runs local CPU processes over gloo, got device={str(device)!r}; "
                            "on GPUs run torchrun --nproc-per-node P -m attention.distributed --measure")
        if problems:
            raise ValueError("; ".join(problems))
        return resolved


class Row(core.Measured):
    """One process count and one mode: a call of ring attention on every process at once."""

    world_size: Annotated[int, integer(1, MAX_PROCESSES), "P: the processes the sequence is split over."]
    mode: Annotated[str, one_of(*MODES), '`"forward"` or `"forward_backward"` (forward, then backward).']
    local_len: Annotated[int, POSITIVE, "`T / P` after padding (`ring.padded_length`): positions each process holds."]
    threads_per_process: Annotated[int | None, POSITIVE, "torch threads of each process: the machine's cores over P, "
                                   "at least one."]
    shard_bytes: Annotated[int, BYTES, "One process's `q`, `k`, `v` and output gradient: what it holds before the call."]
    rank_peak_memory_bytes: Annotated[list | None, list_of(BYTES, MAX_PROCESSES), "Each process's peak tensor memory "
                                      "during one call beyond what it held before (its shard); `peak_memory_bytes` is "
                                      "the largest."]
    kv_block_bytes: Annotated[int, BYTES, "`2 * B * H_kv * (T / P) * D` elements: one key/value block, what the ring "
                              "sends at each forward step."]
    expected_sent_bytes: Annotated[list, list_of(BYTES, 4 * MAX_PROCESSES), "What each process should send at each "
                                   "exchange of one call, from the shapes (`expected_sent_bytes`): a block at "
                                   "each of the first `P - 1` forward steps; in the backward pass the block again and, "
                                   "at every step, its gradients (float32 at least)."]
    rank_sent_bytes: Annotated[list | None, list_of(list_of(BYTES, 4 * MAX_PROCESSES), MAX_PROCESSES), "Per process, "
                               "the bytes it handed to `batch_isend_irecv` to send at each exchange of one call, counted."]
    sent_as_expected: Annotated[bool | None, BOOLEAN, "Every process's counted bytes equal `expected_sent_bytes`, "
                                "exchange by exchange."]
    flops: Annotated[int, integer(), "Useful FLOPs of one call over the whole sequence, all processes together: "
                     "`4·B·H·T²·D`, halved when causal, times 3.5 for forward + backward (the sequence sweep's "
                     "attention-core count)."]
    tflops: Annotated[float | None, RATE, "`flops / ms_median`, TFLOP/s: the whole ring's rate."]
    matmul_tflops_paired: Annotated[float | None, RATE, "The mean of a matmul's rate (`matmul_size`², all cores, this "
                                    "process) timed just before and just after the row's processes ran, TFLOP/s."]
    share_of_paired_matmul: Annotated[float | None, SHARE, "`tflops / matmul_tflops_paired`: the ring's rate against "
                                      "the machine's matmul rate."]


def run(config, envelope):
    config = config.resolve(envelope.device)
    dtype_name = envelope.result["dtype"]
    if dtype_name not in check.DTYPES:
        raise ValueError(f"dtype: the ring sweep runs {', '.join(name for name in check.DTYPES if name != 'float64')}, "
                         f"got dtype={dtype_name!r}")
    header = dataclasses.asdict(config) | {"world_sizes": list(config.world_sizes), "rows": []}
    section = envelope.open(NAME, header, len(config.world_sizes) * len(MODES))
    case = {"batch": config.batch, "num_heads": config.num_heads, "num_kv_heads": config.num_kv_heads,
            "seq_len": config.seq_len, "head_dim": config.head_dim, "causal": config.causal, "layout": config.layout,
            "dtype": dtype_name, "seed": config.seed, "engine": "ring"}
    expected = check.reference_results(case)  # float64, on the whole sequence: the same for every P
    limits = tolerance(envelope.device, dtype_name)

    def matmul_rate():
        return metrics.matmul_rate(envelope.device, envelope.dtype, config.matmul_size, config.min_run_time,
                                   warmup_time=min(0.1, config.min_run_time))["tflops"]

    matmul = [matmul_rate()]
    for world_size in config.world_sizes:
        rows = {mode: new_row(Row, **shape_fields(section, envelope.dtype, world_size, mode), status="ok",
                              tolerance=limits) for mode in MODES}
        this_case = dict(case, world_size=world_size)
        try:
            per_rank = launch.run_on_processes(check_and_measure_here, world_size, this_case,
                                               config.repeats, timeout_s=600.0)
        except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
            per_rank = None
            for row in rows.values():
                core.failed(row, error)
        matmul.append(matmul_rate())
        if per_rank is not None:
            whole = check.join_shards([this_case], [[result["shards"]] for result in per_rank])[0][0]
            for mode, row in rows.items():
                row.update(checked(whole, expected, limits, mode))
                row.update(measured_fields([result["measured"] for result in per_rank], mode))
                row.update(sent_as_expected=all(counted == row["expected_sent_bytes"] for counted in row["rank_sent_bytes"]),
                           tflops=row["flops"] / (row["ms_median"] * 1e-3) / 1e12,
                           matmul_tflops_paired=statistics.mean(matmul[-2:]))
                row["share_of_paired_matmul"] = row["tflops"] / row["matmul_tflops_paired"]
        for mode, row in rows.items():
            envelope.add(section["rows"], row, f"ring P={world_size} {mode}")
        core.release(envelope.device)


def shape_fields(section, dtype, world_size, mode):
    """The row's numbers that follow from the sizes alone (the validator recomputes them the same way)."""
    B, H, H_kv, T, D = (section[key] for key in ("batch", "num_heads", "num_kv_heads", "seq_len", "head_dim"))
    local_len = padded_length(T, world_size, section["layout"]) // world_size
    element = torch.empty((), dtype=dtype).element_size()
    flops = 4 * B * H * T * T * D // (2 if section["causal"] else 1)
    if mode == "forward_backward":
        flops = int(flops * (1 + metrics.BACKWARD_FACTOR_ATTENTION))
    return dict(world_size=world_size, mode=mode, local_len=local_len, flops=flops,
                shard_bytes=2 * B * (H + H_kv) * local_len * D * element,
                kv_block_bytes=2 * B * H_kv * local_len * D * element,
                expected_sent_bytes=expected_sent_bytes(B, H_kv, local_len, D, dtype, world_size)[mode])


def checked(whole, expected, tolerance, mode):
    """`{correct, max_abs_error, reason}` of the joined output (forward) or output and gradients (forward +
    backward) against the float64 reference's."""
    names = ("out",) if mode == "forward" else check.RESULTS
    compared = {name: core.compared(whole[name], expected[name], tolerance) for name in names}
    errors = [c["max_abs_error"] for c in compared.values() if c["max_abs_error"] is not None]
    return dict(correct=all(c["correct"] for c in compared.values()), max_abs_error=max(errors, default=None),
                reason=next((f"{name}: {c['reason']}" for name, c in compared.items() if c["reason"]), None))


def measured_fields(per_rank, mode):
    """A row's measured fields from every rank's `measure_ring` dict (in rank order)."""
    seconds = per_rank[0][mode]["all_seconds"]  # the slowest rank's time, call by call: the same on every rank
    peaks = [measured[mode]["peak_bytes"] for measured in per_rank]
    return dict(metrics._quartiles(seconds), repeats=len(seconds), calls_per_repeat=1, peak_memory_bytes=max(peaks),
                rank_peak_memory_bytes=peaks, rank_sent_bytes=[measured[mode]["sent_bytes"] for measured in per_rank],
                threads_per_process=per_rank[0]["threads"])


# --- The measurement on every rank ----------------------------------------------------------------------------------

def measure_ring(case, group=None, repeats=3, device="cpu"):
    """Time, peak memory and bytes sent of ring attention on this rank; call it on every rank of `group` at once.

    `case`: `batch`, `num_heads`, `num_kv_heads`, `seq_len`, `head_dim`, and optionally `causal` (default True),
    `layout` ("zigzag"), `dtype` (a name of `check.DTYPES`, "float32") and `seed` (0). Every rank draws the whole sequence's inputs from `seed` and keeps its shard, so nothing is sent to set
    up. Each call is timed between barriers, and its time is the slowest rank's (`all_reduce` of the
    maximum): the ring advances at the pace of its slowest member.

    Peak memory is what one call needed beyond what was allocated before it (the inputs): on CPU the peak
    of live tensor bytes in a profile of the call, on CUDA `max_memory_allocated`, both through the
    measuring core (`attention.bench.metrics`).

    Returns:
        A dict: the sizes and settings, `world_size`, `rank`, `local_len`, `threads`; `shard_bytes` (this rank's
        `q, k, v` and output gradient); per mode (`"forward"`, `"forward_backward"`): `seconds` (median over
        `repeats` of the slowest rank's time), `all_seconds`, `peak_bytes`, `sent_bytes` (counted, per exchange)
        and `expected_sent_bytes`.
    """
    batch, num_heads, num_kv_heads, seq_len, head_dim = (case[key] for key in (
        "batch", "num_heads", "num_kv_heads", "seq_len", "head_dim"))
    causal, layout, seed = case.get("causal", True), case.get("layout", "zigzag"), case.get("seed", 0)
    dtype = check.DTYPES[case.get("dtype", "float32")]
    if group is None and not (dist.is_available() and dist.is_initialized()):
        rank, world_size = 0, 1
    else:
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, num_heads, seq_len, head_dim), (batch, num_kv_heads, seq_len, head_dim),
              (batch, num_kv_heads, seq_len, head_dim), (batch, num_heads, seq_len, head_dim)]
    q, k, v, grad_out = (shard_sequence(torch.randn(shape, generator=generator), rank, world_size, layout)
                         .to(device=device, dtype=dtype) for shape in shapes)
    local_len = q.shape[2]

    def forward():
        return ring_attention(q, k, v, causal, layout=layout, seq_len=seq_len, group=group)

    def forward_backward():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        ring_attention(*leaves, causal, layout=layout, seq_len=seq_len, group=group).backward(grad_out)

    expected = expected_sent_bytes(batch, num_kv_heads, local_len, head_dim, dtype, world_size)
    result = {"batch": batch, "num_heads": num_heads, "num_kv_heads": num_kv_heads, "seq_len": seq_len,
              "head_dim": head_dim, "causal": causal, "layout": layout, "dtype": str(dtype).removeprefix("torch."),
              "device": str(device), "world_size": world_size, "rank": rank, "local_len": local_len,
              "threads": torch.get_num_threads(),
              "shard_bytes": sum(t.numel() * t.element_size() for t in (q, k, v, grad_out))}
    for mode, call in (("forward", forward), ("forward_backward", forward_backward)):
        call()  # warm-up
        with count_sent_bytes() as sent:
            call()
        if torch.device(device).type == "cpu":
            peak = metrics.profile_call(call, device)["cpu_tensor_peak_bytes"]
        else:  # pragma: no cover (cuda: torchrun --measure on GPUs, the allocator's peak)
            peak = metrics.device_peak_memory(call, device)
        seconds = []
        for _ in range(repeats):
            if world_size > 1:
                dist.barrier(group=group)
            started = time.perf_counter()
            call()
            metrics.synchronize(device)
            seconds.append(time.perf_counter() - started)
        if world_size > 1:  # the slowest rank's time, call by call
            slowest = torch.tensor(seconds, dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
            seconds = slowest.tolist()
        result[mode] = {"seconds": statistics.median(seconds), "all_seconds": seconds, "peak_bytes": peak,
                        "sent_bytes": sent, "expected_sent_bytes": expected[mode]}
    return result


def measure_here(configs):
    """On every process at once: `measure_ring(**config)` for each config, on this process's group of
    `config["world_size"]` consecutive ranks (`launch.subgroup`). For
    `launch.run_on_processes(measure_here, P, configs)`; returns this rank's dicts."""
    groups = {size: launch.subgroup(size) for size in sorted({config["world_size"] for config in configs})}
    return [measure_ring(config, groups[config["world_size"]], config.get("repeats", 3)) for config in configs]


def check_and_measure_here(case, repeats=3):
    """On every process of a launch at once, for one case of `check.py` on the whole group: this rank's shards
    of the output and gradients (`check.run_case`, for the caller to join and compare with the reference),
    then `measure_ring` on the same sequence. `run` runs it with `launch.run_on_processes(check_and_measure_here,
    P, case, repeats)`; returns `{"shards", "measured"}`."""
    shards = check.run_case(case)
    measured = measure_ring(case, repeats=repeats)
    return {"shards": shards, "measured": measured}


SECTION = record(field_rules(Config) | {"rows": list_of(rule_of(Row), MAX_ROWS)})


def validate(section, result):
    """The section's rules, then each row's sizes, expected bytes, counts and rates recomputed from its own numbers."""
    problems = SECTION(section, NAME) or ([] if section["rows"] else ["ring.rows: none"])
    if problems or result.get("dtype") not in check.DTYPES:
        return problems or [f"dtype: the ring sweep runs {', '.join(check.DTYPES)}, got {result.get('dtype')!r}"]
    for index, row in enumerate(section["rows"]):
        where = f"ring.rows[{index}] (P={row['world_size']}, {row['mode']})"
        if row["world_size"] not in section["world_sizes"]:
            problems.append(f"{where}: world_size {row['world_size']} is not one of world_sizes {section['world_sizes']}")
            continue
        derived = shape_fields(section, check.DTYPES[result["dtype"]], row["world_size"], row["mode"])
        if row["expected_sent_bytes"] != derived["expected_sent_bytes"]:
            problems.append(f"{where}: expected_sent_bytes {row['expected_sent_bytes']} is not what the ring should send "
                            f"{derived['expected_sent_bytes']}")
        problems += mismatches(where, row, {key: value for key, value in derived.items()
                                            if key not in ("world_size", "mode", "expected_sent_bytes")})
        if row["status"] != "ok":
            continue
        lists = {"rank_peak_memory_bytes": row["rank_peak_memory_bytes"], "rank_sent_bytes": row["rank_sent_bytes"]}
        short = [f"{where}: {name} has {len(value or [])} entries, expected one per process ({row['world_size']})"
                 for name, value in lists.items() if len(value or []) != row["world_size"]]
        if short or disordered(where, row):
            problems += short + disordered(where, row)
            continue
        as_expected = all(counted == row["expected_sent_bytes"] for counted in row["rank_sent_bytes"])
        if row["sent_as_expected"] is not as_expected:
            problems.append(f"{where}: sent_as_expected {row['sent_as_expected']} does not match rank_sent_bytes "
                            f"against expected_sent_bytes ({as_expected})")
        tflops = row["flops"] / (row["ms_median"] * 1e-3) / 1e12
        problems += mismatches(where, row, {"peak_memory_bytes": max(row["rank_peak_memory_bytes"]), "tflops": tflops,
                                            "share_of_paired_matmul": tflops / (row["matmul_tflops_paired"] or float("nan"))})
    return problems
