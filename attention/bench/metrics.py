"""Measurements: time, FLOPs, the yardsticks (a matmul's rate, a large read's bandwidth), peak memory and the
SDPA backend that ran. Each measures one thing about one callable; `core.measure` strings them together, and
docs/benchmark-schema.md states the conventions (FLOPs, timing, correctness, memory)."""

import gc
import math
import os
import re
import time
from pathlib import Path
from typing import NamedTuple

import torch

# Backward FLOPs as multiples of the forward's: the attention core's is the FlashAttention benchmark
# convention (the recomputation of P is not counted); the projections compute input and weight gradients.
BACKWARD_FACTOR_ATTENTION = 2.5
BACKWARD_FACTOR_PROJECTIONS = 2.0
# A CPU row whose process got less than this share of its threads' time was measured while other work
# competed for the cores: its time overstates the implementation's cost.
CONTENDED_BELOW = 0.8


def attention_flops(shape, mode):
    """`{"attention", "projections", "total"}`: useful FLOPs (ints) of one call of causal self-attention.

    `shape` holds `batch`, `seq_len`, `d_in`, `d_out`, `num_heads` and `num_kv_heads` (None: `num_heads`), as a
    row of the sequence sweep does; `mode` is "forward" or "forward_backward". What is counted:
    docs/benchmark-schema.md#flops.
    """
    batch, seq_len, d_in, d_out, num_heads = (shape[key] for key in ("batch", "seq_len", "d_in", "d_out", "num_heads"))
    num_kv_heads = shape.get("num_kv_heads")
    d_kv = d_out if num_kv_heads is None else num_kv_heads * (d_out // num_heads)
    projections = 2 * batch * seq_len * d_in * (d_out + 2 * d_kv) + 2 * batch * seq_len * d_out * d_out
    core = 4 * batch * num_heads * seq_len * seq_len * (d_out // num_heads) // 2
    if mode == "forward_backward":
        projections = projections * (1 + BACKWARD_FACTOR_PROJECTIONS)
        core = core * (1 + BACKWARD_FACTOR_ATTENTION)
    elif mode != "forward":
        raise ValueError(f"mode must be 'forward' or 'forward_backward', got mode={mode!r}")
    return {"attention": int(core), "projections": int(projections), "total": int(core + projections)}


def compare_to_reference(output, reference, tolerance):
    """`(correct, max_abs_error)`: whether `|output - reference| <= atol + rtol * |reference|` holds
    everywhere (`tolerance` = `{"atol", "rtol"}`, `reference` float64 on CPU), and by how much. A wrong
    shape, NaN or infinity gives `(False, None)`."""
    output = output.detach().to("cpu", torch.float64)
    if output.shape != reference.shape or not torch.isfinite(output).all():
        return False, None
    error = (output - reference).abs()
    allowed = tolerance["atol"] + tolerance["rtol"] * reference.abs()
    return bool((error <= allowed).all()), float(error.max()) if error.numel() else 0.0


def synchronize(device):
    """Wait for queued work on `device` (CUDA, MPS); no-op on CPU."""
    device = torch.device(device)
    if device.type == "cuda":  # pragma: no cover (cuda: waits for the GPU's queue)
        torch.cuda.synchronize(device)
    elif device.type == "mps":  # pragma: no cover (platform: Apple silicon's MPS device, macOS only)
        torch.mps.synchronize()


class Timing(NamedTuple):
    """How long to time one measurement: seconds of measurement, blocks at least, seconds of warm-up. A
    sweep's config carries the same three fields, and serves as well."""

    min_run_time: float = 1.0
    min_repeats: int = 5
    warmup_time: float = 0.25


def time_callable(fn, device, timing=Timing(), paired=None, warm=(0.0, None)):
    """Median and spread of the time of one call of `fn`, and with `paired` (a yardstick) of one of its calls, timed
    in blocks interleaved with `fn`'s: the scheme docs/benchmark-schema.md#timing states. Unlike
    `torch.utils.benchmark.Timer.blocked_autorange` it guarantees `min_repeats` blocks (a spread to report); the
    interleaving keeps the ratio of the two steady while the machine's speed drifts during a long run.

    `timing` is a `Timing` (or a sweep's config); `warm` is `(seconds, per_call)`: seconds of calls of `fn`
    just made (they count as warm-up) and one call's seconds as the caller measured it (None: timed here).
    Returns `ms_median`, `ms_q1`, `ms_q3`, `ms_iqr`, `ms_min`, `ms_max` (per call, over the blocks),
    `repeats`, `calls_per_repeat`, `cpu_utilization` (CPU only; `fn`'s blocks), and with `paired` its
    `paired_ms_median`, `paired_ms_iqr` and `paired_repeats`.
    """
    min_run_time, min_repeats, warmup_time = timing.min_run_time, timing.min_repeats, timing.warmup_time
    warm_s, per_call_hint = warm
    clock = time.perf_counter

    def run_block(callable_, calls):
        synchronize(device)
        start = clock()
        for _ in range(calls):
            callable_()
        synchronize(device)
        return clock() - start

    warmup_times, warmup_start = [], clock()
    while (per_call_hint is None and not warmup_times) or warm_s + clock() - warmup_start < warmup_time:
        warmup_times.append(run_block(fn, 1))
    per_call = max(sorted(warmup_times)[len(warmup_times) // 2] if warmup_times else per_call_hint, 1e-7)
    calls_per_repeat = max(1, math.ceil(min(min_run_time / min_repeats, 0.05) / per_call))
    if paired is not None:
        paired_per_call = max(run_block(paired, 1), 1e-7)  # also its warm-up after fn's calls
        paired_calls = max(1, math.ceil(min(calls_per_repeat * per_call, 0.05) / paired_per_call))
        paired_times = []

    block_times, total, cpu_seconds = [], 0.0, 0.0
    while len(block_times) < min_repeats or total < min_run_time:
        if paired is not None:
            paired_times.append(run_block(paired, paired_calls) / paired_calls)
        cpu_start = time.process_time()
        elapsed = run_block(fn, calls_per_repeat)
        cpu_seconds += time.process_time() - cpu_start
        total += elapsed
        block_times.append(elapsed / calls_per_repeat)
    # CPU time this process got per second of measurement and thread: near 1 when the cores were ours,
    # well below 1 when other processes competed for them (the timings then overstate the cost).
    cpu_utilization = cpu_seconds / (total * torch.get_num_threads()) if torch.device(device).type == "cpu" else None
    timing = {"repeats": len(block_times), "calls_per_repeat": calls_per_repeat, "cpu_utilization": cpu_utilization}
    timing.update(_quartiles(block_times))
    if paired is not None:
        paired_times.append(run_block(paired, paired_calls) / paired_calls)
        quartiles = _quartiles(paired_times)
        timing.update(paired_ms_median=quartiles["ms_median"], paired_ms_iqr=quartiles["ms_iqr"],
                      paired_repeats=len(paired_times))
    return timing


def _quartiles(seconds):
    """`ms_median`, `ms_q1`, `ms_q3`, `ms_iqr`, `ms_min`, `ms_max` of per-call times given in seconds."""
    times = torch.tensor(seconds, dtype=torch.float64) * 1e3
    q1, median, q3 = (float(torch.quantile(times, q)) for q in (0.25, 0.5, 0.75))
    return {"ms_median": median, "ms_q1": q1, "ms_q3": q3, "ms_iqr": q3 - q1,
            "ms_min": float(times.min()), "ms_max": float(times.max())}


def matmul_call(device, dtype, size):
    """`(call, flops)`: one dense `(size, size) @ (size, size)` matmul in `dtype` on `device` (inputs drawn
    once from seed 0) and its FLOPs, `2 * size**3`."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    return (lambda: torch.mm(a, b)), 2 * size**3


def bandwidth_call(device, dtype, nbytes=2**29):
    """`(call, bytes)`: a sum over one `nbytes` tensor (512 MiB: far past any cache level) in `dtype` on
    `device`, and the bytes it reads. A read, like a decode step: a copy would also write."""
    elements = nbytes // torch.empty((), dtype=dtype).element_size()
    data = torch.rand(elements, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    return (lambda: data.sum()), data.nbytes


def bandwidth_rate(device, dtype, sizes=(2**29,), min_run_time=0.5):
    """`{"read_gbps", "copy_gbps"}`: the best rate of a sum (a read) and of a copy (read + write bytes) over one
    tensor of each of `sizes` bytes, GB/s."""
    rates = {"read_gbps": 0.0, "copy_gbps": 0.0}
    for nbytes in sizes:
        read, read_bytes = bandwidth_call(device, dtype, nbytes)
        source = torch.rand(nbytes // 4, generator=torch.Generator().manual_seed(1)).to(device)  # float32
        target = torch.empty_like(source)
        for name, call, moved in (("read_gbps", read, read_bytes), ("copy_gbps", lambda: target.copy_(source),
                                                                    2 * source.nbytes)):
            timing = time_callable(call, device, Timing(min_run_time, 5, 0.1))
            rates[name] = max(rates[name], moved / (timing["ms_median"] * 1e-3) / 1e9)
        del read, source, target
    return rates


def last_level_cache_bytes(device):
    """The largest cache between the cores and memory, in bytes (the CPU's last level, read from sysfs, or a GPU's L2),
    or None where it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", None) or None
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if text and text[-1] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
    return max(sizes, default=None)


def ceiling_sizes(last_level_cache, smallest=2**27):
    """Three read sizes past the last-level cache for the bandwidth ceiling: the first power of two at least four times
    the cache (and at least `smallest`), then twice and four times that."""
    base = smallest
    while last_level_cache and base < 4 * last_level_cache:
        base *= 2
    return (base, 2 * base, 4 * base)


def unique_graphs():
    """TorchDynamo's count of graphs compiled so far in this process, or None where it cannot be read."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - an internal counter; without it compile detection is off, not the run
        return None


def matmul_rate(device, dtype, size, min_run_time=1.0, warmup_time=0.5):
    """`{"size", "ms_median", "ms_iqr", "tflops", "cpu_utilization"}` of one dense `(size, size) @ (size,
    size)` matmul in `dtype` on `device` (TensorFloat-32 for float32 only if the caller enabled it).

    The benchmark's "peak": what this device reaches on the easiest large matmul in this run, so a
    row's share of it says how far that implementation is from matmul speed on the same machine under
    the same conditions.
    """
    call, flops = matmul_call(device, dtype, size)
    timing = time_callable(call, device, Timing(min_run_time, 10, warmup_time))
    return {"size": size, "ms_median": timing["ms_median"], "ms_iqr": timing["ms_iqr"],
            "tflops": flops / (timing["ms_median"] * 1e-3) / 1e12, "cpu_utilization": timing["cpu_utilization"]}


def device_peak_memory(fn, device):
    """Bytes of device memory `fn()` needed at its peak beyond what was in use before it; None on CPU (see
    `profile_call`). CUDA: the allocator's peak after a reset, minus what was allocated before; MPS: growth of
    the driver's allocation after `empty_cache()`, an upper bound (freed blocks stay in it)."""
    device = torch.device(device)
    gc.collect(0)  # the young generation only: a full collection costs ~0.2 s with torch loaded
    if device.type == "cuda":  # pragma: no cover (cuda: the CUDA allocator's peak)
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type == "mps":  # pragma: no cover (platform: the MPS driver's allocation, macOS only)
        synchronize(device)
        torch.mps.empty_cache()
        before = torch.mps.driver_allocated_memory()
        fn()
        synchronize(device)
        return max(0, torch.mps.driver_allocated_memory() - before)
    return None


def _allocation_peak(prof, device_type):
    """Peak of the running sum of allocations minus frees on `device_type` in a profile, or None."""
    try:
        records = [event for event in prof.profiler.kineto_results.events() if event.name() == "[memory]"]
        records.sort(key=lambda event: event.start_ns())
        live = peak = 0
        for event in records:
            if event.device_type() == device_type:
                live += event.nbytes()
                peak = max(peak, live)
        return peak
    except (AttributeError, RuntimeError):  # the profiler's result object is not public API
        return None


# Dispatcher ops of F.scaled_dot_product_attention's backends, forward and backward (`_backward`).
SDPA_OPS = {f"aten::{op}{suffix}": label for op, label in (
    ("_scaled_dot_product_flash_attention_for_cpu", "flash (cpu)"), ("_scaled_dot_product_flash_attention", "flash"),
    ("_scaled_dot_product_efficient_attention", "efficient"), ("_scaled_dot_product_cudnn_attention", "cudnn"),
    ("_scaled_dot_product_fused_attention_overrideable", "fused (overrideable)")) for suffix in ("", "_backward")} | {
    "aten::_flash_attention_forward": "flash", "aten::_flash_attention_backward": "flash",
    "aten::_efficient_attention_forward": "efficient", "aten::_efficient_attention_backward": "efficient",
    "aten::_scaled_dot_product_attention_math": "math", "aten::_scaled_dot_product_attention_math_for_mps": "math (mps)"}

# GPU kernel names, checked in this order (cuDNN's SDPA kernels also contain "flash").
SDPA_KERNEL_PATTERNS = [
    ("cudnn", re.compile(r"cudnn.*(sdpa|fmha|flash|attention)|(sdpa|fmha).*cudnn", re.IGNORECASE)),
    ("flash", re.compile(r"flash_(fwd|bwd)|flash::|flash_attn", re.IGNORECASE)),
    ("efficient", re.compile(r"fmha_cutlass|MemEffAttention|AttentionKernel|efficient_attention", re.IGNORECASE)),
]


def profile_call(fn, device):
    """Profile one call of `fn`: `{"backends", "ops", "kernels", "cpu_tensor_peak_bytes"}`, the SDPA backends that
    appear in the trace (dispatcher ops, `SDPA_OPS`; on CUDA GPU kernels, `SDPA_KERNEL_PATTERNS`), in order of
    first appearance (`["n/a"]`: none), and on CPU the peak of the running sum of allocations and frees."""
    from torch.profiler import ProfilerActivity, profile

    # Kineto, the profiler's C++ backend, prints "USDT: ... profiler_start" and "... profiler_stop" to stderr
    # on every profiled call, two lines per row among the progress lines. A warnings filter cannot reach C++
    # output, so this raises Kineto's log threshold above all its levels (its errors too), read once, at the
    # profiler's first use in the process. A value set by the user wins: KINETO_LOG_LEVEL=4 shows errors.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    device = torch.device(device)
    on_cpu = device.type == "cpu"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    gc.collect(0)
    with profile(activities=activities, profile_memory=on_cpu) as prof:
        fn()
        synchronize(device)
    names = []
    for event in prof.events():
        names.append(event.name)
        names.extend(kernel.name for kernel in getattr(event, "kernels", []) or [])
    ops = list(dict.fromkeys(name for name in names if name in SDPA_OPS))
    kernels = {}  # kernel name -> backend, in order of first appearance
    for name in names if device.type == "cuda" else []:  # pragma: no cover (cuda: kernels appear in CUDA traces only)
        label = next((label for label, pattern in SDPA_KERNEL_PATTERNS if pattern.search(name)), None)
        if label is not None:
            kernels.setdefault(name, label)
    labels = list(dict.fromkeys([SDPA_OPS[name] for name in ops] + list(kernels.values())))
    peak = _allocation_peak(prof, torch.autograd.DeviceType.CPU) if on_cpu else None
    return {"backends": labels or ["n/a"], "ops": ops, "kernels": list(kernels), "cpu_tensor_peak_bytes": peak}
