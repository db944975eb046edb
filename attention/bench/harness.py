"""The benchmark run: same inputs and weights for every implementation, checked, then timed.

For each shape (the headline shape, then each sequence length of the sweep) and each implementation
(and, with `compile=True`, its `torch.compile`d version as a separate row), and each mode:

1. Build the module for the shape, load the canonical weights drawn once from `seed`, cast it to the
   run's dtype and device. A constructor or loader that raises gives a `skipped` row with the reason.
2. Time the first call on its own (`first_call_s`): it includes any compilation. Where the first
   call compiled graphs (`torch.compile`d rows; FlexAttention, which compiles inside its class) it
   is also reported as `compile_s`, kept apart from the timed runs.
3. Compare that call's output with the float64 reference (`attention.reference`) on batch element 0
   and the first `checked_tokens` positions. Causal attention makes output position t depend only on
   inputs 0..t, so the prefix comparison is exact for those rows while bounding the float64 cost.
   A mismatch gives `correct: false` and the row leaves the rankings.
4. Record which SDPA backend ran (profiler), the peak memory of one call, then time it (warm-up,
   device synchronization, median and interquartile range over several blocks of calls).

A dense matmul timed at the start of the run and after each shape gives the device's matmul rate
(the median of those samples), and each row's `share_of_matmul_peak` divides the row's useful
TFLOP/s by it.
"""

import dataclasses
import gc
import json
import math
import sys
import time
from pathlib import Path

import torch

from attention.bench import metrics
from attention.bench.provenance import SCHEMA_VERSION, collect_provenance, load_average

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODES = ("forward", "forward_backward")
MODE_CHOICES = {"forward": ("forward",), "backward": ("forward_backward",), "both": MODES}
# A CPU row whose process got less than this share of its threads' time was measured while other work
# competed for the cores: its time overstates the implementation's cost.
CONTENDED_BELOW = 0.8


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
        d_model: output features d_out (GPT-2 small: 768).
        d_in: input features; default `d_model`.
        num_heads: H (GPT-2 small: 12).
        implementations: names to run; default every registered one.
        seed: seed of the weights (the input and output gradient use seed + 1 and seed + 2).
        min_run_time, min_repeats, warmup_time: timing effort per row (see `metrics.time_callable`).
        matmul_size: side of the square matmul that measures the device's rate; default 2048 on
            CPU, 4096 elsewhere.
        check_max_scores: bound on H * checked_tokens^2, the float64 reference's score count.
        profile: the profile's name, recorded in the result ("default", "quick" or "custom").
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
        sizes = {"batch": self.batch, "seq_len": self.seq_len, "d_model": self.d_model, "num_heads": self.num_heads,
                 "min_repeats": self.min_repeats, "check_max_scores": self.check_max_scores}
        for name in ("d_in", "sweep_batch", "matmul_size"):
            if getattr(self, name) is not None:
                sizes[name] = getattr(self, name)
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model must be divisible by num_heads, "
                             f"got d_model={self.d_model}, num_heads={self.num_heads}")
        seq_lens = self.seq_lens
        if seq_lens is None:
            longest = {"cpu": 4096, "mps": 8192}.get(device.type, 16384)
            seq_lens = tuple(2**i for i in range(7, int(math.log2(longest)) + 1))
        if any(isinstance(t, bool) or not isinstance(t, int) or t <= 0 for t in seq_lens):
            raise ValueError(f"seq_lens must be positive ints, got seq_lens={seq_lens!r}")
        sweep_batch = self.sweep_batch
        if sweep_batch is None:
            sweep_batch = self.batch if device.type == "cuda" else 1
        return dataclasses.replace(
            self, device=str(device), modes=modes, seq_lens=tuple(seq_lens), sweep_batch=sweep_batch,
            d_in=self.d_in or self.d_model, matmul_size=self.matmul_size or (2048 if device.type == "cpu" else 4096),
            implementations=None if self.implementations is None else tuple(self.implementations),
        )

    def shapes(self):
        """The `(batch, seq_len)` pairs to measure, headline first, without repeats."""
        shapes = [(self.batch, self.seq_len)] + [(self.sweep_batch, t) for t in self.seq_lens or ()]
        return list(dict.fromkeys(shapes))


def quick_config(**overrides):
    """The quick profile that the docs build runs on 2 CPU cores in well under 3 minutes.

    GPT-2-small widths (d_model 768, 12 heads) at batch 1, a sweep over T = 256, 512, 1024 whose last
    point is the headline shape, both modes, and short timing (0.1 s, 3 repeats per row). Each new
    length costs FlexAttention classes a recompilation, so the sweep is short.
    """
    settings = dict(batch=1, seq_len=1024, sweep_batch=1, seq_lens=(256, 512, 1024), min_run_time=0.1,
                    min_repeats=3, warmup_time=0.05, profile="quick")
    settings.update(overrides)
    return BenchConfig(**settings)


def resolve_device(device):
    """A `torch.device` for "auto", "cpu", "cuda" or "mps"; `ValueError` if unknown or unavailable."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got device={device!r}")
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device='cuda' requested but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device='mps' requested but torch.backends.mps.is_available() is False")
    return torch.device(device)


def canonical_weights(d_in, d_out, seed):
    """The shared weights, drawn as `nn.Linear` would (uniform in ±1/sqrt(fan_in)), float32 on CPU."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(*shape, fan_in):
        bound = 1 / math.sqrt(fan_in)
        return (torch.rand(*shape, generator=generator) * 2 - 1) * bound

    return {"query.weight": uniform(d_out, d_in, fan_in=d_in), "key.weight": uniform(d_out, d_in, fan_in=d_in),
            "value.weight": uniform(d_out, d_in, fan_in=d_in), "out.weight": uniform(d_out, d_out, fan_in=d_out),
            "out.bias": uniform(d_out, fan_in=d_out)}


def select_implementations(implementations, names):
    """`{name: cls}` for `names` (all if None), in the given order; `ValueError` listing valid names."""
    if names is None:
        return dict(implementations)
    unknown = [name for name in names if name not in implementations]
    if unknown:
        raise ValueError(f"unknown implementation(s) {unknown}; valid names: {', '.join(sorted(implementations))}")
    return {name: implementations[name] for name in names}


def row_label(name, compiled):
    """How a row is named in rankings and tables."""
    return f"{name} (compiled)" if compiled else name


class _Progress:
    def __init__(self, total, enabled):
        self.total, self.done, self.enabled, self.start = total, 0, enabled, time.perf_counter()

    def say(self, message):
        if self.enabled:
            print(f"[{time.perf_counter() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)

    def row(self, row):
        self.done += 1
        where = f"{row['label']:<28} {row['mode']:<16} B={row['batch']:<3} T={row['seq_len']:<6}"
        if row["status"] == "ok":
            error = row["max_abs_error"]
            mark = {True: "correct", None: "unchecked",
                    False: "WRONG" + (f" (max abs error {error:.2e})" if error is not None else "")}[row["correct"]]
            compile_note = f", compile {row['compile_s']:.1f}s" if row.get("compile_s") else ""
            busy = row.get("cpu_utilization")
            busy_note = f", CPU {busy:.0%}" if busy is not None and busy < CONTENDED_BELOW else ""
            detail = (f"{row['ms_median']:9.2f} ms (IQR {row['ms_iqr']:.2f}), {row['tflops']:.3f} TFLOP/s, "
                      f"{mark}{compile_note}{busy_note}")
        else:
            detail = f"{row['status']}: {row['reason']}"
        self.say(f"{self.done}/{self.total} {where} {detail}")


def _error_text(error):
    text = f"{type(error).__name__}: {error}".strip()
    first_line = text.splitlines()[0] if text else type(error).__name__
    return first_line[:300]


def _is_out_of_memory(error):
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def _free_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


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
        implementations: `{name: cls}` to draw from; default `attention.IMPLEMENTATIONS`, read at call
            time so newly registered classes are included. Each class is built as
            `cls(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)`, maps `(B, T, d_in)`
            to `(B, T, d_out)`, and has `load_canonical_state_dict` and `position_encoding`.
        progress: print one line per measurement to stderr.
        argv: the command line to record; default `sys.argv`.
        checkpoint: a path to rewrite with the partial result after each implementation
            (`"complete": false`), so a long run that dies keeps what it measured.

    Returns:
        The result dict; `result["rows"]` holds one dict per (implementation, compiled, mode, shape).
    """
    if implementations is None:
        from attention.registry import IMPLEMENTATIONS as implementations
    config = (config or BenchConfig()).resolve()
    impls = select_implementations(implementations, config.implementations)
    device, dtype = torch.device(config.device), DTYPES[config.dtype]
    shapes = config.shapes()
    variants = [False, True] if config.compile else [False]
    reporter = _Progress(len(shapes) * len(impls) * len(variants) * len(config.modes), progress)

    previous_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if config.dtype == "tf32" else "highest")
    previous_recompile_limit = _set_recompile_limit(256) if config.compile else None
    try:
        started = time.perf_counter()
        result = {
            "schema_version": SCHEMA_VERSION,
            "complete": False,
            "device_type": device.type,
            "dtype": config.dtype,
            "provenance": collect_provenance(device, argv),
            "config": _config_record(config, impls),
            "conventions": {"flops": metrics.FLOP_CONVENTION,
                            "memory": metrics.MEMORY_METHODS.get(device.type, "not measured"),
                            "rss_memory": metrics.RSS_METHOD if device.type == "cpu" else None,
                            "timing": TIMING_CONVENTION, "correctness": CORRECTNESS_CONVENTION},
            "matmul_peak": None,
            "rows": [],
            "rankings": [],
        }
        reporter.say(f"{device.type} ({result['provenance']['device']['name']}), {config.dtype}, "
                     f"{len(impls)} implementations, shapes {shapes}, modes {list(config.modes)}")
        samples = []

        def sample_matmul_rate(when):
            rate = metrics.matmul_rate(device, dtype, config.matmul_size, min_run_time=config.min_run_time,
                                       warmup_time=max(config.warmup_time, 0.1))
            samples.append({"when": when, **rate})
            reporter.say(f"matmul {config.matmul_size}^2 {config.dtype} ({when}): {rate['tflops']:.3f} TFLOP/s")

        sample_matmul_rate("start")
        state = canonical_weights(config.d_in, config.d_model, config.seed)
        for batch, seq_len in shapes:
            shape_rows = _run_shape(config, impls, variants, state, batch, seq_len, device, dtype, reporter, result,
                                    checkpoint)
            result["rows"].extend(shape_rows)
            sample_matmul_rate(f"after B={batch} T={seq_len}")
        result["matmul_peak"] = _matmul_record(config, samples)
        _finish(result)
        result["complete"] = True
        result["provenance"]["duration_s"] = round(time.perf_counter() - started, 1)
        result["provenance"]["load_average_end"] = load_average()
        if checkpoint:
            write_result(result, checkpoint)
        return result
    finally:
        torch.set_float32_matmul_precision(previous_precision)
        if previous_recompile_limit is not None:
            _set_recompile_limit(previous_recompile_limit)


TIMING_CONVENTION = (
    "Per row: the first call is timed alone (first_call_s; compile_s when it compiled graphs); one "
    "profiled call and one memory-probe call follow (neither timed), and count as warm-up: more calls run until warmup_time "
    "seconds of calls have passed. Then blocks of "
    "calls_per_repeat back-to-back calls with the device synchronized around each block (the scheme of "
    "torch.utils.benchmark.Timer.blocked_autorange), at least min_repeats blocks and min_run_time seconds. "
    "ms_median, ms_q1, ms_q3, ms_iqr, ms_min and ms_max are over the blocks' per-call times. forward "
    "runs under torch.no_grad(); forward_backward sets every gradient to None, then runs forward and "
    "backward(grad_output) with the input requiring grad."
)

CORRECTNESS_CONVENTION = (
    "The first call's output, on batch element 0 and the first checked_tokens positions, against "
    "attention.reference.reference_causal_self_attention in float64 with the same weights and input "
    "rounded to the run's dtype, and the class's position_encoding: correct when "
    "|out - ref| <= atol + rtol*|ref| everywhere (tolerance per dtype, recorded per row). Causal "
    "attention makes positions < checked_tokens depend only on inputs < checked_tokens, so the prefix "
    "check is exact for those positions. forward_backward rows also require finite gradients. Rows "
    "with correct != true are left out of the rankings."
)


def _set_recompile_limit(limit):
    """Raise dynamo's recompile limit so compiled rows at many shapes never fall back to eager."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    previous = getattr(dynamo_config, name)
    setattr(dynamo_config, name, limit)
    return previous


def _config_record(config, impls):
    record = dataclasses.asdict(config)
    record["modes"], record["seq_lens"] = list(config.modes), list(config.seq_lens)
    record["d_out"] = config.d_model
    record["head_dim"] = config.d_model // config.num_heads
    record["implementations"] = list(impls)
    record["shapes"] = [list(shape) for shape in config.shapes()]
    return record


def _matmul_record(config, samples):
    rates = sorted(sample["tflops"] for sample in samples)
    middle = len(rates) // 2
    median = rates[middle] if len(rates) % 2 else (rates[middle - 1] + rates[middle]) / 2
    return {"size": config.matmul_size, "dtype": config.dtype, "statistic": "median of samples",
            "tflops": median, "best_tflops": rates[-1], "worst_tflops": rates[0], "samples": samples,
            "note": "the median of the square matmul's rate timed at the start of the run and after each shape. "
                    "Every row is a median taken under the same conditions as these samples (other work on the "
                    "machine slows both alike), so a row's share of this median compares like with like; the "
                    "best sample is stored too, as best_tflops"}


def _run_shape(config, impls, variants, state, batch, seq_len, device, dtype, reporter, result, checkpoint):
    generator = torch.Generator().manual_seed(config.seed + 1)
    x = torch.randn(batch, seq_len, config.d_in, generator=generator)
    generator = torch.Generator().manual_seed(config.seed + 2)
    grad_output = torch.randn(batch, seq_len, config.d_model, generator=generator)
    x_device = x.to(device=device, dtype=dtype)
    grad_device = grad_output.to(device=device, dtype=dtype)
    checked_tokens = min(seq_len, max(1, math.isqrt(config.check_max_scores // config.num_heads)))
    # The reference sees exactly what the modules see: input and weights rounded to the run's dtype.
    x_checked = x_device[:1, :checked_tokens].to("cpu", torch.float64)
    state_rounded = {key: value.to(dtype).to(torch.float64) for key, value in state.items()}
    references = {}

    def reference(position_encoding):
        if position_encoding not in references:
            from attention.reference import reference_causal_self_attention
            try:
                out, _ = reference_causal_self_attention(x_checked, state_rounded, config.num_heads, position_encoding)
                references[position_encoding] = out[0]  # (checked_tokens, d_out)
            except ValueError as error:
                references[position_encoding] = error
        return references[position_encoding]

    rows = []
    for name, cls in impls.items():
        for compiled in variants:
            new_rows = _run_implementation(config, name, cls, compiled, state, x_device, grad_device, checked_tokens,
                                           reference, device, dtype, reporter)
            rows.extend(new_rows)
            if checkpoint:
                write_result({**result, "rows": result["rows"] + rows}, checkpoint)
            _free_memory(device)
    return rows


def _base_row(config, name, cls, compiled, mode, batch, seq_len, checked_tokens):
    return {
        "implementation": name, "compiled": compiled, "label": row_label(name, compiled), "mode": mode,
        "batch": batch, "seq_len": seq_len, "d_in": config.d_in, "d_out": config.d_model,
        "num_heads": config.num_heads, "head_dim": config.d_model // config.num_heads,
        "position_encoding": getattr(cls, "position_encoding", None),
        "status": "ok", "reason": None, "correct": None, "max_abs_error": None,
        "tolerance": metrics.TOLERANCES[config.dtype], "checked_tokens": checked_tokens, "checked_batch_index": 0,
        "first_call_s": None, "compiled_graphs": None, "compile_s": None,
        "ms_median": None, "ms_q1": None, "ms_q3": None, "ms_iqr": None, "ms_min": None, "ms_max": None,
        "repeats": None, "calls_per_repeat": None, "cpu_utilization": None,
        **{f"flops_{key}": value for key, value in
           metrics.attention_flops(batch, seq_len, config.d_in, config.d_model, config.num_heads, mode).items()},
        "tflops": None, "share_of_matmul_peak": None,
        "peak_memory_bytes": None, "peak_rss_growth_bytes": None,
        "sdpa_backends": None, "sdpa_ops": None, "sdpa_kernels": None,
    }


def _run_implementation(config, name, cls, compiled, state, x, grad_output, checked_tokens, reference, device,
                        dtype, reporter):
    batch, seq_len = x.shape[:2]
    rows = [_base_row(config, name, cls, compiled, mode, batch, seq_len, checked_tokens) for mode in config.modes]

    def give_up(status, reason):
        for row in rows:
            row.update(status=status, reason=reason)
            reporter.row(row)
        return rows

    try:
        torch.manual_seed(config.seed)
        module = cls(config.d_in, config.d_model, seq_len, 0.0, config.num_heads, qkv_bias=False)
    except Exception as error:  # noqa: BLE001 - any constructor refusal is a skip reason worth recording
        return give_up("skipped", f"constructor: {_error_text(error)}")
    try:
        module.load_canonical_state_dict(state)
        module.to(device=device, dtype=dtype).eval()
    except Exception as error:  # noqa: BLE001
        return give_up("skipped", f"canonical weights: {_error_text(error)}")
    if compiled:
        module = torch.compile(module, backend=config.compile_backend, dynamic=False)

    for row in rows:
        try:
            _measure(config, module, row, x, grad_output, reference, device)
        except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
            oom = _is_out_of_memory(error)
            row.update(status="failed", reason="out of memory" if oom else _error_text(error))
            for key in ("ms_median", "ms_q1", "ms_q3", "ms_iqr", "ms_min", "ms_max", "tflops", "cpu_utilization"):
                row[key] = None
        reporter.row(row)
    return rows


def _make_call(module, mode, x, grad_output):
    if mode == "forward":
        def call():
            with torch.no_grad():
                return module(x)
        return call, None, lambda: None

    x_in = x.detach().clone().requires_grad_(True)
    params = [p for p in module.parameters() if p.requires_grad]

    def zero_grads():
        for param in params:
            param.grad = None
        x_in.grad = None

    def call():
        zero_grads()
        out = module(x_in)
        out.backward(grad_output)
        return out.detach()

    return call, (x_in, params), zero_grads


def _measure(config, module, row, x, grad_output, reference, device):
    call, grad_holders, zero_grads = _make_call(module, row["mode"], x, grad_output)

    graphs_before = _unique_graphs()
    row["first_call_s"], out = metrics.time_first_call(call, device)
    graphs_after = _unique_graphs()
    if graphs_before is not None and graphs_after is not None:
        row["compiled_graphs"] = graphs_after - graphs_before
        if row["compiled_graphs"] > 0:
            row["compile_s"] = row["first_call_s"]

    expected = reference(row["position_encoding"])
    if isinstance(expected, Exception):
        row["reason"] = f"not checked: {_error_text(expected)}"
    else:
        correct, row["max_abs_error"] = metrics.compare_to_reference(out[0, : row["checked_tokens"]], expected,
                                                                     row["tolerance"])
        if row["max_abs_error"] is None:
            row["reason"] = "output has the wrong shape or is not finite"
        if correct and grad_holders is not None:
            x_in, params = grad_holders
            grads = [x_in.grad] + [p.grad for p in params]
            if any(g is None or not torch.isfinite(g).all() for g in grads):
                correct, row["reason"] = False, "missing or non-finite gradients"
        row["correct"] = correct
    del out

    warm_start = time.perf_counter()
    zero_grads()  # the previous call's gradients must not count as memory in use before a probe
    profiled = metrics.profile_call(call, device)
    row.update(sdpa_backends=profiled["backends"], sdpa_ops=profiled["ops"], sdpa_kernels=profiled["kernels"])
    zero_grads()
    probe_start = time.perf_counter()
    if device.type == "cpu":
        row["peak_memory_bytes"] = profiled["cpu_tensor_peak_bytes"]
        row["peak_rss_growth_bytes"] = metrics.rss_growth(call)
    else:
        row["peak_memory_bytes"] = metrics.device_peak_memory(call, device)
    probe_end = time.perf_counter()
    # The profiled call and the memory probe count as warm-up; the probe's duration estimates a call.
    row.update(metrics.time_callable(call, device, min_run_time=config.min_run_time, min_repeats=config.min_repeats,
                                     warmup_time=config.warmup_time, warm_s=probe_end - warm_start,
                                     per_call_hint=probe_end - probe_start))
    row["tflops"] = row["flops_total"] / (row["ms_median"] * 1e-3) / 1e12


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


def _finish(result):
    peak = result["matmul_peak"]["tflops"]
    for row in result["rows"]:
        if row["tflops"] is not None and peak:
            row["share_of_matmul_peak"] = row["tflops"] / peak
    result["rankings"] = rank_rows(result["rows"])


def write_result(result, path):
    """Write `result` as indented JSON to `path` (directories created), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    temporary.replace(path)
    return path
