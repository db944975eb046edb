"""The measuring core every sweep shares, written once: `Envelope` (a results file while it is measured: the
provenance and load average before the whole run, each sweep's section, a rewrite after every row, the load
average and duration after the whole run, one progress line per row); `measure` (one row: the first call, its
check against the float64 reference, backends and peak memory of a profiled call, then timing blocks
interleaved with a `Yardstick`'s); `failed` (the one failure path); `over_budget` (the one memory budget).
"""

import gc
import json
import math
import sys
import time
from typing import Callable, NamedTuple, TypedDict, Annotated

import torch

from attention import files
from attention.bench import metrics
from attention.bench.provenance import collect_provenance
from attention.machine import load_average, meminfo_bytes
from attention.bench.results import (BYTES, COUNT, DEVICE_TYPES, KERNEL_NAME, MS, RATE, REASON, REASON_CHARS,
                                     SCHEMA_VERSION, SDPA_BACKENDS, SDPA_OP_NAMES, SHARE, TOLERANCE, disordered, mismatches)
from attention.schema import BOOLEAN, SECONDS, config_problems, in_range, list_of, one_of

DEVICES = ("auto", *DEVICE_TYPES)
DTYPES = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device):
    """A `torch.device` for "auto" (CUDA, else MPS, else CPU), "cpu", "cuda" or "mps"; `ValueError` if unavailable."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got device={device!r}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available()
                            else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device='cuda' requested but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device='mps' requested but torch.backends.mps.is_available() is False")
    return torch.device(device)


def check_dtype(dtype, device):
    """`ValueError` unless `dtype` is one of `DTYPES` and runs on `device` (tf32 only on CUDA)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got dtype={dtype!r}")
    if dtype == "tf32" and device.type != "cuda":
        raise ValueError(f"dtype='tf32' (TensorFloat-32 matmuls) exists only on NVIDIA GPUs (Ampere or newer), "
                         f"got device={device.type!r}; use dtype='float32'")


def checked(config):
    """`config` (a sweep's, resolved) if every value keeps its field's rule and `d_model` splits into `num_heads`
    heads, else `ValueError` naming each bad value."""
    problems = config_problems(config)
    if problems or config.d_model % config.num_heads:
        raise ValueError("; ".join(problems) or f"d_model must be divisible by num_heads, got d_model="
                                                f"{config.d_model}, num_heads={config.num_heads}")
    return config


def memory_budget(device):
    """Bytes a row may take: 3/4 of the memory free now on CPU (past RAM the operating system kills the process
    instead of raising) and CUDA (a sweep allocates a cache before a row's `try`); None on MPS."""
    if torch.device(device).type == "cuda":  # pragma: no cover (cuda: the GPU's free memory)
        return torch.cuda.mem_get_info(device)[0] * 3 // 4
    available = meminfo_bytes("MemAvailable") if torch.device(device).type == "cpu" else None
    return available and available * 3 // 4


def size_text(nbytes):
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def over_budget(needed, budget, what):
    """The skip reason when `needed` bytes (`what` says which) exceed `budget`, else None."""
    return f"{what} {size_text(needed)} exceeds the memory budget {size_text(budget)}" if budget and (needed or 0) > budget else None


def error_text(error):
    """An error's type and first line, in the characters a results file allows in a reason, at most 300."""
    text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
    return "".join(char if char in REASON_CHARS or char.isalnum() and char.isascii() else " "
                   for char in text.replace("[", "(").replace("]", ")"))[:300]


def failed(row, error):
    """Record `error` on `row`: status "failed", reason "out of memory" or the error's first line."""
    oom = isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
    row.update(status="failed", reason="out of memory" if oom else error_text(error))


def usable(row):
    """True for a row measured and matched to the reference: the only kind a table ranks or a chart draws."""
    return row is not None and row["status"] == "ok" and row["correct"] is True


class Measured(TypedDict):
    """The fields `measure` writes, shared by every sweep's row type (`null`: not measured)."""

    status: Annotated[str, one_of("ok", "skipped", "failed"), '`"ok"`; `"skipped"` (refused by the constructor or '
                      'the weight loader, or past the memory budget); `"failed"` (a call raised).']
    reason: Annotated[str | None, REASON, 'Why the row was skipped, failed (`"out of memory"`), is not correct or '
                      'was not checked.']
    tolerance: Annotated[dict, TOLERANCE, "`{atol, rtol}` of the run's dtype."]
    correct: Annotated[bool | None, BOOLEAN, "Matched the float64 reference ([Correctness](#correctness)); `null`: "
                       "not checked."]
    max_abs_error: Annotated[float | None, in_range(0, 1e30), "Largest `|out - ref|` over the checked elements."]
    first_call_s: Annotated[float | None, SECONDS, "The first call alone (s), compilation and allocation included."]
    compiled_graphs: Annotated[int | None, COUNT, "TorchDynamo graphs compiled by the first call; `null`: not counted."]
    compile_s: Annotated[float | None, SECONDS, "`first_call_s` when `compiled_graphs > 0`, else `null`."]
    sdpa_backends: Annotated[list | None, SDPA_BACKENDS, 'SDPA backends the profiler saw run (`"flash (cpu)"`, '
                             '`"math"`, `"flash"`, `"efficient"`, `"cudnn"`, ...); `["n/a"]` where none ran.']
    sdpa_ops: Annotated[list | None, SDPA_OP_NAMES, "Their dispatcher ops (`aten::_scaled_dot_product_flash_attention`, "
                        "...)."]
    sdpa_kernels: Annotated[list | None, list_of(KERNEL_NAME, 16), "On CUDA, the GPU kernel names that matched an "
                            "SDPA backend."]
    peak_memory_bytes: Annotated[int | None, BYTES, "Peak tensor memory of one call ([Memory](#memory))."]
    ms_median: Annotated[float | None, MS, "Median per-call time over the timing blocks (ms)."]
    ms_q1: Annotated[float | None, MS, "First quartile of the blocks' per-call times (ms)."]
    ms_q3: Annotated[float | None, MS, "Third quartile of the blocks' per-call times (ms)."]
    ms_iqr: Annotated[float | None, MS, "Interquartile range, `ms_q3 - ms_q1` (ms)."]
    ms_min: Annotated[float | None, MS, "Fastest block's per-call time (ms)."]
    ms_max: Annotated[float | None, MS, "Slowest block's per-call time (ms)."]
    repeats: Annotated[int | None, COUNT, "Number of timing blocks."]
    calls_per_repeat: Annotated[int | None, COUNT, "Back-to-back calls per block."]
    cpu_utilization: Annotated[float | None, SHARE, "CPU only: CPU time the process got while timing / (wall time × "
                               f"`torch_num_threads`); below {metrics.CONTENDED_BELOW}, other processes competed for "
                               "the cores and the time overstates the cost."]


class PairedMatmul(TypedDict):
    """The rates of a row timed beside the matmul yardstick (the sequence and block-sparse sweeps)."""

    tflops: Annotated[float | None, RATE, "`flops / ms_median`, in TFLOP/s."]
    matmul_tflops_paired: Annotated[float | None, RATE, "The matmul rate timed in blocks interleaved with this row's "
                                    "(median over those blocks), TFLOP/s."]
    share_of_paired_matmul: Annotated[float | None, SHARE, "`tflops / matmul_tflops_paired`: the row's rate against "
                                      "the matmul's under the same machine conditions (it can exceed 1)."]


def matmul_rates(row):
    """`tflops` (`flops / ms_median`) and `share_of_paired_matmul` of a measured `PairedMatmul` row, from its own
    numbers: what the sweep records and what the validator expects."""
    tflops = row["flops"] / (row["ms_median"] * 1e-3) / 1e12
    return {"tflops": tflops, "share_of_paired_matmul": tflops / (row["matmul_tflops_paired"] or math.nan)}


def timed_row_problems(where, row, expected):
    """A `PairedMatmul` row's problems: an `ok` row's times out of order, else each number of `expected` (with the
    row's `matmul_rates` for an `ok` row) against the row's own."""
    out_of_order = disordered(where, row) if row["status"] == "ok" else []
    if out_of_order:
        return out_of_order
    return mismatches(where, row, expected | (matmul_rates(row) if row["status"] == "ok" else {}))


class Yardstick(NamedTuple):
    """What a row's rate is measured against, timed in blocks interleaved with the row's (see `measure`)."""

    call: Callable  # one call of the yardstick
    work: int  # its work per call: FLOPs (a matmul) or bytes read (a sum over a large tensor)
    field: str  # the row field of its rate beside the row: "matmul_tflops_paired" or "bandwidth_gbps_paired"
    scale: float  # units of that rate: 1e12 (TFLOP/s) or 1e9 (GB/s)

    def rate(self, ms):
        return self.work / (ms * 1e-3) / self.scale


def matmul_yardstick(device, dtype, size):
    """A dense `(size, size) @ (size, size)` matmul in `dtype`: the arithmetic rate, in TFLOP/s."""
    call, flops = metrics.matmul_call(device, dtype, size)
    return Yardstick(call, flops, "matmul_tflops_paired", 1e12)


def bandwidth_yardstick(device, dtype, nbytes):
    """A sum over `nbytes` in `dtype`: the read bandwidth, in GB/s."""
    call, read = metrics.bandwidth_call(device, dtype, nbytes)
    return Yardstick(call, read, "bandwidth_gbps_paired", 1e9)


def compared(out, expected, tolerance):
    """`{correct, max_abs_error, reason}` of `out` against the float64 `expected` (or the error computing it raised)."""
    if isinstance(expected, Exception):
        return dict(correct=None, max_abs_error=None, reason=f"not checked: {error_text(expected)}")
    correct, error = metrics.compare_to_reference(out, expected, tolerance)
    reason = None if correct else ("output has the wrong shape or is not finite" if error is None
                                   else "output differs from the float64 reference")
    return dict(correct=correct, max_abs_error=error, reason=reason)


def measure(call, check, device, timing, yardstick, reset=lambda: None):
    """Measure one row: returns the `Measured` fields it sets and the yardstick's rate beside it.

    `call()` runs the row once and returns its output; `check(output)` returns `{correct, max_abs_error,
    reason}` (`compared`); `timing` has `min_run_time`, `min_repeats` and `warmup_time` (a sweep's config);
    `reset()` runs before the profiled call and before the memory probe (a backward pass clears its
    gradients, so they do not count as memory in use). The profiled call and the probe count as warm-up.
    """
    graphs = metrics.unique_graphs()
    metrics.synchronize(device)
    started = time.perf_counter()  # the first call alone: a compiled call compiles here
    out = call()
    metrics.synchronize(device)
    first_call_s, after = time.perf_counter() - started, metrics.unique_graphs()
    row = dict(first_call_s=first_call_s, **check(out))
    del out
    if graphs is not None and after is not None:
        row.update(compiled_graphs=after - graphs, compile_s=first_call_s if after > graphs else None)
    warm_start = time.perf_counter()
    reset()
    profiled = metrics.profile_call(call, device)
    row.update(sdpa_backends=profiled["backends"], sdpa_ops=profiled["ops"], sdpa_kernels=profiled["kernels"])
    reset()
    probe_start, per_call = time.perf_counter(), None
    if device.type == "cpu":  # no unprofiled call yet: time_callable times one to size its blocks
        row["peak_memory_bytes"] = profiled["cpu_tensor_peak_bytes"]
    else:  # pragma: no cover (cuda: a GPU's allocator peak, on CUDA or MPS)
        row["peak_memory_bytes"] = metrics.device_peak_memory(call, device)
        per_call = time.perf_counter() - probe_start  # the probe was one plain call
    timed = metrics.time_callable(call, device, timing, paired=yardstick.call,
                                  warm=(time.perf_counter() - warm_start, per_call))
    row.update({key: value for key, value in timed.items() if not key.startswith("paired_")})
    row[yardstick.field] = yardstick.rate(timed["paired_ms_median"])
    return row


def write_result(result, path, force=False):
    """Write `result` as indented JSON to `path` (`attention.files.write_bytes`: atomically, into an existing folder,
    over an existing file only if `force`)."""
    return files.write_bytes(path, json.dumps(result, indent=1, allow_nan=False) + "\n", force)


class Envelope:
    """A results file while it is measured, a context manager around the run: `device` and `dtype` resolved once for
    all its sweeps, `argv` the command line to record (default `sys.argv`), `out` the file to write (None: in memory).
    `progress = False` silences the progress lines (stderr); `force = True` lets the run replace a file that is at
    `out` before it starts (without it, `ValueError`/`FileExistsError` on entering, before anything is measured).
    The run rewrites its own file after every row. It does not continue a partial file: a run starts afresh."""

    def __init__(self, profile, device="auto", dtype="float32", argv=None, out=None):
        self.device = resolve_device(device)
        check_dtype(dtype, self.device)
        self.dtype, self.out, self.progress, self.total, self.done = DTYPES[dtype], out, True, 0, 0
        self.force, self.written = False, False
        self.result = {"schema_version": SCHEMA_VERSION, "complete": False, "profile": profile,
                       "device_type": self.device.type, "dtype": dtype}
        self.argv = argv

    def __enter__(self):
        if self.out:
            files.check_new_file(self.out, self.force)
        self.started = time.perf_counter()
        self.precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if self.result["dtype"] == "tf32" else "highest")
        self.result["provenance"] = collect_provenance(self.device, self.argv)
        return self

    def __exit__(self, kind, error, traceback):
        torch.set_float32_matmul_precision(self.precision)
        self.result["provenance"].update(duration_s=round(time.perf_counter() - self.started, 1),
                                         load_average_end=load_average())
        self.result["complete"] = kind is None
        self.checkpoint()

    def open(self, name, section, rows):
        """Register a sweep's section, `rows` rows to come; returns the dict to fill (the file's top level for the
        sequence sweep)."""
        self.total += rows
        if name == "sequence":
            self.result.update(section)
            return self.result
        self.result[name] = section
        return section

    def say(self, message):
        if self.progress:
            print(f"[{time.perf_counter() - self.started:7.1f}s] {message}", file=sys.stderr, flush=True)

    def add(self, rows, row, what):
        """Append `row` to its section's `rows`, say one progress line (`what`: the row in words), checkpoint."""
        rows.append(row)
        self.done += 1
        detail = f"{row['status']}: {row['reason']}"
        if row["status"] == "ok":
            share = next(key for key in row if key.startswith("share_of_paired_"))
            verdict = {True: "correct", None: "unchecked", False: f"WRONG ({row['reason']}, max abs error "
                                                                  f"{row['max_abs_error']})"}[row["correct"]]
            busy = row["cpu_utilization"]
            detail = (f"{row['ms_median']:9.3f} ms (IQR {row['ms_iqr']:.3f}), {row[share]:.0%} of the paired "
                      f"{share.removeprefix('share_of_paired_')}, {verdict}"
                      + (f", compile {row['compile_s']:.1f}s" if row["compile_s"] else "")
                      + (f", CPU {busy:.0%}" if busy is not None and busy < metrics.CONTENDED_BELOW else ""))
        self.say(f"{self.done}/{self.total} {what:<44} {detail}")
        self.checkpoint()

    def checkpoint(self):
        if self.out:  # the first write replaces a file only with `force`; later ones replace the run's own
            write_result(self.result, self.out, force=self.force or self.written)
            self.written = True

    def run(self, plan):
        """Measure a `profiles.Plan` (a profile, its sweeps and their configs) in this envelope; returns the result."""
        with self:
            for sweep, config in plan.sweeps:
                sweep.run(config, self)
        return self.result


def run(plan, device="auto", dtype="float32", argv=None, out=None, progress=True):
    """Measure a `profiles.Plan` in one `Envelope` (`out`: never over an existing file); returns the result."""
    envelope = Envelope(plan.profile, device, dtype, argv, out)
    envelope.progress = progress
    return envelope.run(plan)


def release(device):  # what the last rows left behind: Python garbage and the device's cache
    gc.collect()
    if device.type in ("cuda", "mps"):  # pragma: no cover (cuda: a GPU's cached blocks, on CUDA or MPS)
        getattr(torch, device.type).empty_cache()
