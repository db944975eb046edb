"""The benchmark run: same inputs and weights for every implementation, checked, then timed.

For each shape (the headline shape, then each sequence length of the sweep) and each implementation
(and, with `compile=True`, its `torch.compile`d version as a separate row), and each mode:

1. Build the module for the shape, load the canonical weights drawn once from `seed`, cast it to the
   run's dtype and device. A constructor or loader that raises gives a `skipped` row with the reason.
2. Time the first call on its own (`first_call_s`; `compile_s` too when it compiled graphs).
3. Compare that call's output with the float64 reference (`attention.reference`) on batch element 0
   and the first `checked_tokens` positions; a mismatch gives `correct: false` and no rank.
4. Record which SDPA backend ran (profiler) and the peak memory of one call, then time it.

Two yardsticks say how far each row is from the device's matmul speed. The paired one: step 4 times
the row's calls in blocks interleaved with blocks of a dense matmul (matmul, row, matmul, ..., matmul),
so `share_of_paired_matmul` compares the two under the same machine conditions, however the machine's
speed drifts during the run. The run-level one: the same matmul timed at the start of the run and
after each shape (the median of those samples), the yardstick of `share_of_matmul_peak`. The rows and
the conventions behind each step are described in docs/benchmark-schema.md.
"""

import contextlib
import dataclasses
import functools
import gc
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from attention.bench import metrics
from attention.bench.provenance import available_memory_bytes, collect_provenance, load_average
from attention.bench.schema import CONTENDED_BELOW, SCHEMA_VERSION, new_row
from attention.causal.flex import recompile_room
from attention.reference import canonical_weights, kv_heads_state

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODES = ("forward", "forward_backward")
MODE_CHOICES = {"forward": ("forward",), "backward": ("forward_backward",), "both": MODES}


@dataclasses.dataclass
class BenchConfig:
    """What to measure. `None` fields take a device-dependent default in `resolve`.

    Attributes:
        device: "auto" (CUDA, else MPS, else CPU), "cpu", "cuda" or "mps".
        dtype: "float32", "tf32" (float32 tensors, TensorFloat-32 matmuls; CUDA only), "bfloat16"
            or "float16".
        modes: subset of ("forward", "forward_backward"). Forward runs under `torch.no_grad()`;
            forward_backward times forward plus `backward` with the input requiring grad.
        compile: also time `torch.compile(module)` of each implementation, as separate rows.
        compile_backend: the `torch.compile` backend ("inductor"; "eager" for quick tests).
        batch, seq_len: the headline shape (GPT-2 small: B=8, T=1024).
        sweep_batch, seq_lens: the sequence-length sweep; default batch 1 on CPU and MPS (the
            naive implementations' `(B, H, T, T)` scores would not fit otherwise), `batch` on CUDA;
            lengths 128..4096 on CPU, 128..8192 on MPS, 128..16384 on CUDA. Empty: no sweep.
        d_model: the model width (GPT-2 small: 768). Every implementation is built with
            d_in = d_out = d_model and maps `(B, T, d_model)` to `(B, T, d_model)`, unless `d_in`
            is set.
        d_in: input features, to measure d_in != d_out; default `d_model`.
        num_heads: H (GPT-2 small: 12).
        implementations: names to run; default every registered one.
        seed: seed of the weights (the input and output gradient use seed + 1 and seed + 2).
        min_run_time, min_repeats, warmup_time: timing effort per row (see `metrics.time_callable`).
        matmul_size: side of the square matmul that measures the device's rate; default 2048 on
            CPU, 4096 elsewhere.
        check_max_scores: bound on H * checked_tokens^2, the float64 reference's score count.
        profile: the profile's name, recorded in the result ("default", "quick", "long" or "custom").
        memory_budget_bytes: on CPU, a row whose peak memory, predicted from the same implementation and
            mode at the previous shape (times the batch ratio and the squared length ratio, the naive
            classes' growth), exceeds this is skipped with the prediction as its reason: past RAM the
            operating system kills the process instead of raising. Default 3/4 of the memory available
            when the run starts. Elsewhere out of memory raises, and the row is "failed".
    """

    device: str = "auto"
    dtype: str = "float32"
    modes: tuple = MODES
    compile: bool = False
    compile_backend: str = "inductor"
    batch: int = 8
    seq_len: int = 1024
    sweep_batch: int | None = None
    seq_lens: tuple | None = None
    d_model: int = 768
    d_in: int | None = None
    num_heads: int = 12
    implementations: tuple | None = None
    seed: int = 0
    min_run_time: float = 1.0
    min_repeats: int = 5
    warmup_time: float = 0.25
    matmul_size: int | None = None
    check_max_scores: int = 12 * 2048 * 2048
    profile: str = "default"
    memory_budget_bytes: int | None = None

    def resolve(self):
        """A copy with the device resolved and defaults filled in; `ValueError` naming any bad value."""
        device = resolve_device(self.device)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got dtype={self.dtype!r}")
        if self.dtype == "tf32" and device.type != "cuda":
            raise ValueError(
                f"dtype='tf32' (TensorFloat-32 matmuls) exists only on NVIDIA GPUs (Ampere or newer), "
                f"got device={device.type!r}; use dtype='float32'"
            )
        modes = tuple(self.modes)
        if not modes or any(mode not in MODES for mode in modes):
            raise ValueError(f"modes must be a non-empty subset of {MODES}, got modes={self.modes!r}")
        longest = {"cpu": 12, "mps": 13}.get(device.type, 14)  # 2**longest: 4096 on CPU, 8192 on MPS, 16384 on CUDA
        resolved = dataclasses.replace(
            self, device=str(device), modes=modes,
            sweep_batch=(self.batch if device.type == "cuda" else 1) if self.sweep_batch is None else self.sweep_batch,
            seq_lens=tuple(self.seq_lens if self.seq_lens is not None else (2**i for i in range(7, longest + 1))),
            d_in=self.d_model if self.d_in is None else self.d_in,
            matmul_size=(2048 if device.type == "cpu" else 4096) if self.matmul_size is None else self.matmul_size,
            implementations=None if self.implementations is None else tuple(self.implementations),
            memory_budget_bytes=self.memory_budget_bytes if self.memory_budget_bytes is not None
            else _default_memory_budget(device),
        )
        for name in ("batch", "seq_len", "d_model", "num_heads", "min_repeats", "check_max_scores", "d_in",
                     "sweep_batch", "matmul_size"):
            value = getattr(resolved, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model must be divisible by num_heads, "
                             f"got d_model={self.d_model}, num_heads={self.num_heads}")
        if any(isinstance(t, bool) or not isinstance(t, int) or t <= 0 for t in resolved.seq_lens):
            raise ValueError(f"seq_lens must be positive ints, got seq_lens={resolved.seq_lens!r}")
        return resolved

    def shapes(self):
        """The `(batch, seq_len)` pairs to measure, headline first, without repeats."""
        shapes = [(self.batch, self.seq_len)] + [(self.sweep_batch, t) for t in self.seq_lens or ()]
        return list(dict.fromkeys(shapes))


def _default_memory_budget(device):
    available = available_memory_bytes() if device.type == "cpu" else None
    return None if available is None else available * 3 // 4


def quick_config(**overrides):
    """The quick profile that the docs build runs on 2 CPU cores in well under 3 minutes.

    GPT-2-small widths (d_model 768, 12 heads) at batch 1, a sweep over T = 256, 512, 1024 whose last
    point is the headline shape, both modes, and short timing (0.1 s, 3 repeats per row). Each new
    length costs FlexAttention classes a recompilation, so the sweep is short.
    """
    settings = dict(batch=1, seq_len=1024, sweep_batch=1, seq_lens=(256, 512, 1024), min_run_time=0.1,
                    min_repeats=3, warmup_time=0.05, profile="quick")
    return BenchConfig(**settings | overrides)


def resolve_device(device):
    """A `torch.device` for "auto", "cpu", "cuda" or "mps"; `ValueError` if unknown or unavailable."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got device={device!r}")
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device='cuda' requested but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device='mps' requested but torch.backends.mps.is_available() is False")
    return torch.device(device)


def select_implementations(implementations, names):
    """`{name: cls}` for `names` (all if None), in the given order; `ValueError` listing valid names."""
    if names is None:
        return dict(implementations)
    unknown = [name for name in names if name not in implementations]
    if unknown:
        raise ValueError(f"unknown implementation(s) {unknown}; valid names: {', '.join(sorted(implementations))}")
    return {name: implementations[name] for name in names}


class _Progress:
    def __init__(self, total, enabled):
        self.total, self.done, self.enabled, self.start = total, 0, enabled, time.perf_counter()

    def say(self, message):
        if self.enabled:
            print(f"[{time.perf_counter() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)

    def row(self, row):
        self.done += 1
        detail = f"{row['status']}: {row['reason']}"
        if row["status"] == "ok":
            error, busy = row["max_abs_error"], row["cpu_utilization"]
            mark = {True: "correct", None: "unchecked",
                    False: "WRONG" + (f" (max abs error {error:.2e})" if error is not None else "")}[row["correct"]]
            detail = (f"{row['ms_median']:9.2f} ms (IQR {row['ms_iqr']:.2f}), {row['tflops']:.3f} TFLOP/s "
                      f"({row['share_of_paired_matmul']:.0%} of matmul {row['matmul_tflops_paired']:.3f}), {mark}"
                      + (f", compile {row['compile_s']:.1f}s" if row["compile_s"] else "")
                      + (f", CPU {busy:.0%}" if busy is not None and busy < CONTENDED_BELOW else ""))
        self.say(f"{self.done}/{self.total} {row['label']:<28} {row['mode']:<16} B={row['batch']:<3} "
                 f"T={row['seq_len']:<6} {detail}")


def _error_text(error):
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:300]


def _unique_graphs():
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - an internal counter; without it compile detection is off, not the run
        return None


def run_benchmark(config=None, implementations=None, progress=True, argv=None, checkpoint=None):
    """Run the benchmark and return the result (a JSON-ready dict, see docs/benchmark-schema.md).

    Args:
        config: a `BenchConfig`; default `BenchConfig()` (GPT-2 small plus the sweep).
        implementations: `{name: cls}` to draw from, each keeping the `attention.causal.CausalSelfAttention`
            contract; default `attention.IMPLEMENTATIONS`, read at call time so new classes are included.
        progress: print one line per measurement to stderr.
        argv: the command line to record; default `sys.argv`.
        checkpoint: a path to rewrite with the partial result after each implementation
            (`"complete": false`), so a long run that dies keeps what it measured.

    Returns:
        The result dict; `result["rows"]` holds one `schema.Row` per (implementation, compiled, mode, shape).
    """
    if implementations is None:
        from attention.registry import IMPLEMENTATIONS as implementations
    config = (config or BenchConfig()).resolve()
    impls = select_implementations(implementations, config.implementations)
    device, dtype = torch.device(config.device), DTYPES[config.dtype]
    shapes, variants = config.shapes(), [False, True] if config.compile else [False]
    yardstick = metrics.matmul_call(device, dtype, config.matmul_size)  # (call, flops), timed beside every row
    reporter = _Progress(len(shapes) * len(impls) * len(variants) * len(config.modes), progress)
    samples = []

    def sample_matmul_rate(when):
        rate = metrics.matmul_rate(device, dtype, config.matmul_size, min_run_time=config.min_run_time,
                                   warmup_time=max(config.warmup_time, 0.1))
        samples.append({"when": when, **rate})
        reporter.say(f"matmul {config.matmul_size}^2 {config.dtype} ({when}): {rate['tflops']:.3f} TFLOP/s")

    previous_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if config.dtype == "tf32" else "highest")
    # Compiled rows at many shapes must not run out of recompiles: past the limit they would run eagerly.
    try:
        with recompile_room() if config.compile else contextlib.nullcontext():
            started = time.perf_counter()
            result = {"schema_version": SCHEMA_VERSION, "complete": False, "device_type": device.type,
                      "dtype": config.dtype, "provenance": collect_provenance(device, argv),
                      "config": _config_record(config, impls), "matmul_peak": None, "rows": [], "rankings": []}
            reporter.say(f"{device.type} ({result['provenance']['device']['name']}), {config.dtype}, "
                         f"{len(impls)} implementations, shapes {shapes}, modes {list(config.modes)}")
            sample_matmul_rate("start")
            state = canonical_weights(config.d_in, config.d_model, config.seed)
            peaks = {}  # (name, compiled, mode) -> (batch, seq_len, peak bytes) of the last measured shape
            for batch, seq_len in shapes:
                inputs = _shape_inputs(config, state, batch, seq_len, device, dtype)
                for (name, cls), compiled in itertools.product(impls.items(), variants):
                    result["rows"] += _run_implementation(config, name, cls, compiled, state, *inputs, reporter,
                                                          yardstick, peaks)
                    if checkpoint:
                        write_result(result, checkpoint)
                    gc.collect()
                    if device.type in ("cuda", "mps"):
                        getattr(torch, device.type).empty_cache()
                sample_matmul_rate(f"after B={batch} T={seq_len}")
    finally:
        torch.set_float32_matmul_precision(previous_precision)
    rates = [sample["tflops"] for sample in samples]
    peak = statistics.median(rates)
    paired = [row["matmul_tflops_paired"] for row in result["rows"] if row["matmul_tflops_paired"] is not None]
    result["matmul_peak"] = {"size": config.matmul_size, "dtype": config.dtype, "statistic": "median of samples",
                             "tflops": peak, "best_tflops": max(rates), "worst_tflops": min(rates), "samples": samples,
                             "paired": {"rows": len(paired), "median_tflops": statistics.median(paired),
                                        "lowest_tflops": min(paired), "highest_tflops": max(paired)} if paired else None}
    for row in result["rows"]:
        if row["tflops"] is not None and peak:
            row["share_of_matmul_peak"] = row["tflops"] / peak
    result.update(rankings=rank_rows(result["rows"]), complete=True)
    result["provenance"].update(duration_s=round(time.perf_counter() - started, 1), load_average_end=load_average())
    if checkpoint:
        write_result(result, checkpoint)
    return result


def _config_record(config, impls):
    record = dataclasses.asdict(config)
    record.update(modes=list(config.modes), seq_lens=list(config.seq_lens), d_out=config.d_model,
                  head_dim=config.d_model // config.num_heads, implementations=list(impls),
                  shapes=[list(shape) for shape in config.shapes()])
    return record


def _shape_inputs(config, state, batch, seq_len, device, dtype):
    """The input, the output gradient, `checked_tokens` and `reference(position_encoding, num_kv_heads)`.

    The reference, the float64 output to check against, covers batch element 0 and the first
    `checked_tokens` positions, and sees exactly what the modules see: input and weights rounded to
    the run's dtype. A `ValueError` it raises (an unsupported position encoding) is returned instead.
    """
    x = torch.randn(batch, seq_len, config.d_in, generator=torch.Generator().manual_seed(config.seed + 1))
    grad_output = torch.randn(batch, seq_len, config.d_model, generator=torch.Generator().manual_seed(config.seed + 2))
    x, grad_output = x.to(device=device, dtype=dtype), grad_output.to(device=device, dtype=dtype)
    checked_tokens = min(seq_len, max(1, math.isqrt(config.check_max_scores // config.num_heads)))
    x_checked = x[:1, :checked_tokens].to("cpu", torch.float64)
    state_rounded = {key: value.to(dtype).to(torch.float64) for key, value in state.items()}

    @functools.cache
    def reference(position_encoding, num_kv_heads):
        from attention.reference import reference_causal_self_attention
        state_heads = kv_heads_state(state_rounded, config.num_heads, num_kv_heads)
        try:
            out, _ = reference_causal_self_attention(x_checked, state_heads, config.num_heads, position_encoding)
            return out[0]  # (checked_tokens, d_out)
        except ValueError as error:
            return error

    return x, grad_output, checked_tokens, reference


def predicted_peak(last, batch, seq_len):
    """Peak bytes at `(batch, seq_len)` predicted from `last = (batch, seq_len, peak)`: linear in the batch,
    quadratic in the length (the `(B, H, T, T)` scores), an upper bound for the O(T) kernels."""
    if last is None:
        return None
    last_batch, last_len, peak = last
    return int(peak * (batch / last_batch) * (seq_len / last_len) ** 2)


def _size(nbytes):
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _run_implementation(config, name, cls, compiled, state, x, grad_output, checked_tokens, reference, reporter,
                        yardstick, peaks=None):
    batch, seq_len = x.shape[:2]
    rows = [new_row(implementation=name, compiled=compiled, label=f"{name} (compiled)" if compiled else name,
                    mode=mode, batch=batch, seq_len=seq_len, d_in=config.d_in, d_out=config.d_model,
                    num_heads=config.num_heads, head_dim=config.d_model // config.num_heads,
                    position_encoding=cls.position_encoding, status="ok",
                    tolerance=metrics.TOLERANCES[config.dtype], checked_tokens=checked_tokens, checked_batch_index=0,
                    **{f"flops_{key}": value for key, value in metrics.attention_flops(
                        batch, seq_len, config.d_in, config.d_model, config.num_heads, mode).items()})
            for mode in config.modes]
    step = "constructor"
    try:
        torch.manual_seed(config.seed)
        module = cls(config.d_in, config.d_model, seq_len, 0.0, config.num_heads, qkv_bias=False)
        num_kv_heads = getattr(module, "num_kv_heads", config.num_heads)  # fewer for grouped-query classes
        for row in rows:
            row.update(num_kv_heads=num_kv_heads, **{f"flops_{key}": value for key, value in metrics.attention_flops(
                batch, seq_len, config.d_in, config.d_model, config.num_heads, row["mode"], num_kv_heads).items()})
        step = "canonical weights"
        module.load_canonical_state_dict(kv_heads_state(state, config.num_heads, num_kv_heads))
        module.to(device=x.device, dtype=x.dtype).eval()
    except Exception as error:  # noqa: BLE001 - any refusal is a skip reason worth recording
        for row in rows:
            row.update(status="skipped", reason=f"{step}: {_error_text(error)}")
            reporter.row(row)
        return rows
    if compiled:
        module = torch.compile(module, backend=config.compile_backend, dynamic=False)

    peaks = {} if peaks is None else peaks
    for row in rows:
        key = (name, compiled, row["mode"])
        predicted = predicted_peak(peaks.get(key), batch, seq_len)
        if config.memory_budget_bytes and predicted and predicted > config.memory_budget_bytes:
            last_batch, last_len, last_peak = peaks[key]
            row.update(status="skipped", reason=(
                f"predicted peak memory {_size(predicted)} (B={last_batch}, T={last_len} took {_size(last_peak)}, "
                f"times the batch ratio and the squared length ratio) exceeds the memory budget "
                f"{_size(config.memory_budget_bytes)}"))
            reporter.row(row)
            continue
        try:
            _measure(config, module, row, x, grad_output, reference, yardstick)
            if row["peak_memory_bytes"]:
                peaks[key] = (batch, seq_len, row["peak_memory_bytes"])
        except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
            oom = isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
            row.update(status="failed", reason="out of memory" if oom else _error_text(error))
            row.update(dict.fromkeys(("ms_median", "ms_q1", "ms_q3", "ms_iqr", "ms_min", "ms_max", "tflops",
                                      "cpu_utilization", "matmul_tflops_paired",
                                      "share_of_paired_matmul")))  # a failed row has no timing
        reporter.row(row)
    return rows


def _make_call(module, mode, x, grad_output):
    """`(call, zero_grads, gradients)`: one call of `module` in `mode`; `gradients()` lists the input's
    and the parameters' gradients after a forward_backward call (none for forward)."""
    if mode == "forward":
        def call():
            with torch.no_grad():
                return module(x)
        return call, lambda: None, list

    x_in = x.detach().clone().requires_grad_(True)
    holders = [x_in] + [p for p in module.parameters() if p.requires_grad]

    def zero_grads():
        for tensor in holders:
            tensor.grad = None

    def call():
        zero_grads()
        out = module(x_in)
        out.backward(grad_output)
        return out.detach()

    return call, zero_grads, lambda: [tensor.grad for tensor in holders]


def _measure(config, module, row, x, grad_output, reference, yardstick):
    device = x.device
    call, zero_grads, gradients = _make_call(module, row["mode"], x, grad_output)

    graphs_before = _unique_graphs()
    row["first_call_s"], out = metrics.time_first_call(call, device)
    graphs_after = _unique_graphs()
    if graphs_before is not None and graphs_after is not None:
        row["compiled_graphs"] = graphs_after - graphs_before
        if row["compiled_graphs"] > 0:
            row["compile_s"] = row["first_call_s"]

    expected = reference(row["position_encoding"], row["num_kv_heads"])
    if isinstance(expected, Exception):
        row["reason"] = f"not checked: {_error_text(expected)}"
    else:
        correct, row["max_abs_error"] = metrics.compare_to_reference(out[0, : row["checked_tokens"]], expected,
                                                                     row["tolerance"])
        if row["max_abs_error"] is None:
            row["reason"] = "output has the wrong shape or is not finite"
        if correct and any(grad is None or not torch.isfinite(grad).all() for grad in gradients()):
            correct, row["reason"] = False, "missing or non-finite gradients"
        row["correct"] = correct
    del out

    warm_start = time.perf_counter()
    zero_grads()  # the previous call's gradients must not count as memory in use before a probe
    profiled = metrics.profile_call(call, device)
    row.update(sdpa_backends=profiled["backends"], sdpa_ops=profiled["ops"], sdpa_kernels=profiled["kernels"])
    zero_grads()
    probe_start = time.perf_counter()
    if device.type == "cpu":  # no unprofiled call yet: time_callable times one to size the timing blocks
        row["peak_memory_bytes"], per_call_hint = profiled["cpu_tensor_peak_bytes"], None
    else:
        row["peak_memory_bytes"] = metrics.device_peak_memory(call, device)
        per_call_hint = time.perf_counter() - probe_start  # the probe was one plain call
    # The profiled call (and the memory probe) count as warm-up. The matmul blocks alternate with the row's.
    matmul, matmul_flops = yardstick
    timing = metrics.time_callable(call, device, min_run_time=config.min_run_time, min_repeats=config.min_repeats,
                                   warmup_time=config.warmup_time, warm_s=time.perf_counter() - warm_start,
                                   per_call_hint=per_call_hint, paired=matmul)
    row.update({key: value for key, value in timing.items() if not key.startswith("paired_")})
    row["tflops"] = row["flops_total"] / (row["ms_median"] * 1e-3) / 1e12
    row["matmul_tflops_paired"] = matmul_flops / (timing["paired_ms_median"] * 1e-3) / 1e12
    row["share_of_paired_matmul"] = row["tflops"] / row["matmul_tflops_paired"]


def rank_rows(rows):
    """Rankings per (mode, batch, seq_len): labels of the `ok` and correct rows, fastest first.

    Returns:
        A list of `{"mode", "batch", "seq_len", "order", "fastest", "excluded"}`; `excluded` maps
        each left-out label to why (skipped, failed, incorrect, unchecked).
    """
    groups = {}
    for row in rows:
        groups.setdefault((row["mode"], row["batch"], row["seq_len"]), []).append(row)
    rankings = []
    for (mode, batch, seq_len), group in groups.items():
        ranked = sorted((r for r in group if r["status"] == "ok" and r["correct"] is True),
                        key=lambda r: r["ms_median"])
        excluded = {}
        for r in group:
            if r["status"] != "ok":
                excluded[r["label"]] = f"{r['status']}: {r['reason']}"
            elif r["correct"] is not True:
                excluded[r["label"]] = ("incorrect" if r["correct"] is False else "unchecked") + (
                    f" (max abs error {r['max_abs_error']:.3g})" if r["max_abs_error"] is not None else "")
        rankings.append({"mode": mode, "batch": batch, "seq_len": seq_len, "order": [r["label"] for r in ranked],
                         "fastest": ranked[0]["label"] if ranked else None, "excluded": excluded})
    return rankings


def write_result(result, path):
    """Write `result` as indented JSON to `path` (directories created), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    temporary.replace(path)
    return path
