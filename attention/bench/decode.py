"""The decode profile, `python -m attention.bench --profile decode`: one new token per step over a KV cache.

Generation runs the attention of one new token per sequence per step, over the keys and values of
every earlier token, kept in a KV cache. The step does little arithmetic for what it reads (the
whole cache, and the layer's weights), so it is bound by memory bandwidth, not by the matmul rate:
its yardstick is the bandwidth this device reaches on a large read in the same run.

For each model (`DECODE_MODELS`: 32 query heads of 128, as Llama 2 7B and Llama 3 8B, with 32, 4 or 1
K/V heads: MHA, GQA with 8 query heads per K/V head, MQA), each batch size and each kernel
(`DECODE_KERNELS`), the harness builds `attention.causal.gqa.GroupedQueryAttention`, makes a cache of
the longest context, fills it with random keys and values, then for each context length:

1. sets the cache's length to the context and runs one step, `module(x, cache=cache)` with `x`
   `(B, 1, d_model)`, checked against a float64 reference on batch element 0 (the cached keys and
   values, plus the new token's, projected in float64);
2. times the step (resetting the cache's length before each call, so every call sees the same
   context), in blocks interleaved with blocks of the bandwidth yardstick, a sum over a large tensor;
3. records the bytes the step must read (the cache up to the context, and the weights), the rate
   that gives, and its share of the yardstick's rate measured beside it; and its FLOPs, against the
   rate of a large matmul sampled through the run: where a K/V head serves many query heads (MQA),
   the arithmetic per byte read grows until it, not the bytes, sets the step's time.

One step is one token per sequence through one attention layer (no MLP, no other layers), so the
tokens per second are an upper bound for a model: divide by the layer count for the attention share
of a full model's step.
"""

import dataclasses
import math
import statistics
import sys
import time

import torch

from attention.bench import metrics
from attention.bench.harness import DTYPES, resolve_device, write_result
from attention.bench.provenance import available_memory_bytes, collect_provenance, load_average
from attention.bench.schema import SCHEMA_VERSION
from attention.causal.gqa import GroupedQueryAttention
from attention.reference import canonical_weights, kv_heads_state

# DECODE_NUM_HEADS query heads of DECODE_HEAD_DIM: Llama 2 7B's and Llama 3 8B's attention (d_model 4096).
DECODE_NUM_HEADS, DECODE_HEAD_DIM = 32, 128
# name -> query heads per K/V head (None: all of them share one, MQA). GQA's 8:1 is Llama 2 70B's and Llama 3 70B's.
DECODE_MODELS = {"MHA": 1, "GQA": 8, "MQA": None}


def kv_heads_of(model, num_heads):
    """The K/V head count of `model` (`DECODE_MODELS`) beside `num_heads` query heads."""
    group = DECODE_MODELS[model]
    if group is not None and num_heads % group != 0:
        raise ValueError(f"num_heads must be divisible by {group} for {model}, got num_heads={num_heads}")
    return 1 if group is None else num_heads // group
DECODE_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
DECODE_BATCHES = (1, 8)
# name -> GroupedQueryAttention keywords: the kernels a decode step can run on.
DECODE_KERNELS = {
    "sdpa": {"decode_kernel": "sdpa"},
    "matmul": {"decode_kernel": "matmul"},
}
BANDWIDTH_BYTES = 2**29  # 512 MiB: far past any cache level, so the sum reads from memory
MATMUL_SIZE = 2048  # the square matmul whose rate is the arithmetic yardstick

DECODE_ROW_FIELDS = {
    "model": "`MHA`, `GQA` or `MQA` (`DECODE_MODELS`): which K/V head count.",
    "kernel": "The decode kernel the module ran (`DECODE_KERNELS`): `sdpa` or `matmul`.",
    "batch": "B, sequences decoded together (one new token each per step).",
    "context": "Cached positions before the step; the step attends over `context + 1` keys.",
    "num_heads": "Query heads.",
    "num_kv_heads": "Key/value heads.",
    "head_dim": "D.",
    "status": '`"ok"`, `"skipped"` (predicted past the memory budget) or `"failed"`.',
    "reason": "Why the row was skipped, failed or is not correct.",
    "correct": "Batch element 0's output matched the float64 reference within `tolerance`.",
    "max_abs_error": "Largest `|out - ref|` over batch element 0.",
    "tolerance": "`{atol, rtol}` of the run's dtype.",
    "sdpa_backends": "SDPA backends the profiler saw run (`[\"n/a\"]`: none, the matmul kernel).",
    "ms_median": "Median time of one step (ms).",
    "ms_q1": "First quartile (ms).",
    "ms_q3": "Third quartile (ms).",
    "ms_min": "Fastest block's per-step time (ms).",
    "ms_max": "Slowest block's per-step time (ms).",
    "repeats": "Timing blocks.",
    "calls_per_repeat": "Steps per block.",
    "cpu_utilization": "CPU only: CPU time the process got / (wall time × threads) while timing.",
    "tokens_per_s": "`batch / step time`: new tokens per second through this layer.",
    "cache_bytes_per_token": "Bytes one cached position takes in one sequence: `2 * num_kv_heads * head_dim * "
                             "element size` (keys and values).",
    "cache_bytes_read": "`batch * (context + 1) * cache_bytes_per_token`: the cache the step reads.",
    "weight_bytes": "The layer's parameters, read once per step.",
    "bytes_read": "`cache_bytes_read + weight_bytes`: what the step must read at least.",
    "gbps": "`bytes_read / step time`, in GB/s (10^9 bytes).",
    "bandwidth_gbps_paired": "The yardstick's read rate (a sum over `BANDWIDTH_BYTES`) timed in blocks "
                             "interleaved with this row's (median), GB/s.",
    "share_of_paired_bandwidth": "`gbps / bandwidth_gbps_paired`: how close the step comes to reading at "
                                 "the device's rate under the same conditions.",
    "flops": "The step's useful FLOPs: `2 * batch * parameters` (the projections) plus `4 * batch * num_heads * "
             "(context + 1) * head_dim` (scores and weighted values).",
    "tflops": "`flops / step time`, TFLOP/s.",
    "share_of_matmul": "`tflops / decode.matmul.tflops`: the step's arithmetic rate against the run's matmul rate "
                       "(a large dense matmul, median of samples).",
}


@dataclasses.dataclass
class DecodeConfig:
    """What the decode profile measures (see the module docstring); `resolve` fills the defaults."""

    device: str = "auto"
    dtype: str = "float32"
    num_heads: int = DECODE_NUM_HEADS
    head_dim: int = DECODE_HEAD_DIM
    models: tuple = tuple(DECODE_MODELS)
    contexts: tuple = DECODE_CONTEXTS
    batches: tuple = DECODE_BATCHES
    kernels: tuple = tuple(DECODE_KERNELS)
    seed: int = 0
    min_run_time: float = 0.5
    min_repeats: int = 5
    warmup_time: float = 0.1
    bandwidth_bytes: int = BANDWIDTH_BYTES
    memory_budget_bytes: int | None = None
    profile: str = "decode"

    def resolve(self):
        """A copy with the device resolved and the defaults filled in; `ValueError` naming any bad value."""
        device = resolve_device(self.device)
        if self.dtype not in DTYPES or self.dtype == "tf32":
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got dtype={self.dtype!r}")
        for name, chosen, valid in (("models", self.models, DECODE_MODELS), ("kernels", self.kernels, DECODE_KERNELS)):
            unknown = [item for item in chosen if item not in valid]
            if unknown or not chosen:
                raise ValueError(f"{name} must be a non-empty subset of {list(valid)}, got {name}={list(chosen)}")
        for model in self.models:
            kv_heads_of(model, self.num_heads)
        for name in ("contexts", "batches"):
            values = getattr(self, name)
            if not values or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in values):
                raise ValueError(f"{name} must be positive ints, got {name}={values!r}")
        budget = self.memory_budget_bytes
        if budget is None and device.type == "cpu":
            available = available_memory_bytes()
            budget = int(available * 3 / 4) if available else None
        return dataclasses.replace(self, device=str(device), models=tuple(self.models), kernels=tuple(self.kernels),
                                   contexts=tuple(sorted(self.contexts)), batches=tuple(self.batches),
                                   memory_budget_bytes=budget)


def decode_config(**overrides):
    """The decode profile's settings, with `overrides` (field names of `DecodeConfig`)."""
    return DecodeConfig(**overrides)


def bandwidth_call(device, dtype, nbytes=BANDWIDTH_BYTES):
    """`(call, bytes)`: a sum over one `nbytes` tensor in `dtype` on `device`, and the bytes it reads.

    A read, like a decode step: a copy would also write, and count the writes its own way.
    """
    elements = nbytes // torch.empty((), dtype=dtype).element_size()
    data = torch.rand(elements, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    return (lambda: data.sum()), data.nbytes


def bandwidth_rate(device, dtype, nbytes=BANDWIDTH_BYTES, min_run_time=0.5):
    """`{"read_gbps", "copy_gbps"}`: a large sum's read rate and a large copy's (read + write bytes), GB/s."""
    read, read_bytes = bandwidth_call(device, dtype, nbytes)
    source = torch.rand(nbytes // 4, generator=torch.Generator().manual_seed(1)).to(device)  # float32
    target = torch.empty_like(source)
    rates = {}
    for name, call, moved in (("read_gbps", read, read_bytes), ("copy_gbps", lambda: target.copy_(source),
                                                                2 * source.nbytes)):
        timing = metrics.time_callable(call, device, min_run_time=min_run_time, min_repeats=5, warmup_time=0.1)
        rates[name] = moved / (timing["ms_median"] * 1e-3) / 1e9
    return rates


def cache_bytes_per_token(num_kv_heads, head_dim, dtype):
    """Bytes one position takes in one sequence's cache: keys and values, `num_kv_heads` heads of `head_dim`."""
    return 2 * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def run_decode(config=None, progress=True, argv=None, checkpoint=None):
    """Run the decode profile and return the result dict (written to `checkpoint` as it goes, if given)."""
    config = (config or DecodeConfig()).resolve()
    device, dtype = torch.device(config.device), DTYPES[config.dtype]
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda text: None)
    started = time.perf_counter()
    d_model = config.num_heads * config.head_dim
    result = {"schema_version": SCHEMA_VERSION, "complete": False, "device_type": device.type, "dtype": config.dtype,
              "provenance": collect_provenance(device, argv), "config": _config_record(config, d_model),
              "matmul_peak": None, "rows": [], "rankings": [],
              "decode": {"bandwidth": None, "rows": []}}
    samples = []

    def sample_bandwidth(when):
        rates = bandwidth_rate(device, dtype, config.bandwidth_bytes)
        rates["matmul_tflops"] = metrics.matmul_rate(device, dtype, MATMUL_SIZE, min_run_time=0.5)["tflops"]
        samples.append({"when": when, **rates})
        say(f"bandwidth ({when}): read {rates['read_gbps']:.1f} GB/s, copy {rates['copy_gbps']:.1f} GB/s; "
            f"matmul {rates['matmul_tflops']:.3f} TFLOP/s")

    sample_bandwidth("start")
    yardstick = bandwidth_call(device, dtype, config.bandwidth_bytes)
    state = canonical_weights(d_model, d_model, config.seed)
    x_all = torch.randn(max(config.batches), 1, d_model, generator=torch.Generator().manual_seed(config.seed + 1))
    for model in config.models:
        num_kv_heads = kv_heads_of(model, config.num_heads)
        for batch in config.batches:
            x = x_all[:batch].to(device=device, dtype=dtype)
            result["decode"]["rows"] += _model_rows(config, model, num_kv_heads, batch, state, x, device, dtype,
                                                    yardstick, say)
            if checkpoint:
                write_result(result, checkpoint)
        sample_bandwidth(f"after {model}")
    reads = [sample["read_gbps"] for sample in samples]
    result["decode"]["bandwidth"] = {
        "bytes": config.bandwidth_bytes, "statistic": "median of samples", "read_gbps": statistics.median(reads),
        "copy_gbps": statistics.median(sample["copy_gbps"] for sample in samples), "samples": samples}
    matmul = statistics.median(sample["matmul_tflops"] for sample in samples)
    result["decode"]["matmul"] = {"size": MATMUL_SIZE, "statistic": "median of samples", "tflops": matmul}
    for row in result["decode"]["rows"]:
        if row["tflops"] is not None:
            row["share_of_matmul"] = row["tflops"] / matmul
    result["complete"] = True
    result["provenance"].update(duration_s=round(time.perf_counter() - started, 1), load_average_end=load_average())
    if checkpoint:
        write_result(result, checkpoint)
    return result


def _config_record(config, d_model):
    record = dataclasses.asdict(config)
    record.update(models={name: kv_heads_of(name, config.num_heads) for name in config.models},
                  kernels=list(config.kernels),
                  contexts=list(config.contexts), batches=list(config.batches), d_model=d_model,
                  # the fields every results file has, for the validator and the provenance summary
                  modes=["decode"], batch=max(config.batches), seq_len=max(config.contexts),
                  sweep_batch=None, seq_lens=list(config.contexts))
    return record


def _model_rows(config, model, num_kv_heads, batch, state, x, device, dtype, yardstick, say):
    """Every (kernel, context) row of one model and batch size, sharing one cache of the longest context."""
    longest = max(config.contexts)
    per_token = cache_bytes_per_token(num_kv_heads, config.head_dim, dtype)
    base = dict(model=model, batch=batch, num_heads=config.num_heads, num_kv_heads=num_kv_heads,
                head_dim=config.head_dim, cache_bytes_per_token=per_token, tolerance=metrics.TOLERANCES[config.dtype])
    needed = batch * (longest + 1) * per_token
    rows = []
    if device.type == "cpu" and config.memory_budget_bytes and needed > config.memory_budget_bytes:
        reason = (f"a cache of {needed / 2**30:.1f} GiB (B={batch}, {longest + 1} positions) exceeds the memory "
                  f"budget {config.memory_budget_bytes / 2**30:.1f} GiB")
        for kernel in config.kernels:
            rows += [base | dict(kernel=kernel, context=context, status="skipped", reason=reason)
                     for context in config.contexts]
        return [_complete(row) for row in rows]
    d_model = config.num_heads * config.head_dim
    modules = {}
    for kernel in config.kernels:
        torch.manual_seed(config.seed)
        module = GroupedQueryAttention(d_model, d_model, longest + 1, 0.0, config.num_heads, num_kv_heads=num_kv_heads,
                                       **DECODE_KERNELS[kernel])
        module.load_canonical_state_dict(kv_heads_state(state, config.num_heads, num_kv_heads))
        modules[kernel] = module.to(device=device, dtype=dtype).eval().requires_grad_(False)
    cache = next(iter(modules.values())).new_cache(batch, longest + 1)
    generator = torch.Generator().manual_seed(config.seed + 2)
    filled = 0
    for context in config.contexts:
        for tensor in (cache.keys, cache.values):  # random keys and values: the step's time does not depend on them
            tensor[:, :, filled:context] = torch.randn(*tensor[:, :, filled:context].shape, generator=generator).to(
                device=device, dtype=dtype)
        filled = context
        reference = _reference_step(state, config.num_heads, num_kv_heads, x, cache, context)
        for kernel, module in modules.items():
            row = base | dict(kernel=kernel, context=context, status="ok", reason=None)
            try:
                _measure_step(config, row, module, cache, x, reference, device, yardstick)
            except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
                oom = isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
                row.update(status="failed", reason="out of memory" if oom else f"{type(error).__name__}: {error}"[:300])
            rows.append(_complete(row))
            if row["status"] == "ok":
                say(f"decode {model} B={batch} context={context:<6} {kernel:<7} {row['ms_median']:8.3f} ms "
                    f"{row['tokens_per_s']:9.1f} tok/s {row['gbps']:6.1f} GB/s "
                    f"{row['share_of_paired_bandwidth']:.0%} of read bandwidth "
                    f"{'correct' if row['correct'] else 'WRONG'}")
            else:
                say(f"decode {model} B={batch} context={context} {kernel}: {row['status']}: {row['reason']}")
    del cache, modules
    return rows


def _complete(row):
    return {name: row.get(name) for name in DECODE_ROW_FIELDS}


def _reference_step(state, num_heads, num_kv_heads, x, cache, context):
    """float64 output of batch element 0's step: attention over the cached keys and values `0 .. context - 1`
    and the new token's own (projected in float64), `(1, d_model)`."""
    f64 = {name: tensor.to(torch.float64) for name, tensor in kv_heads_state(state, num_heads, num_kv_heads).items()}
    x0 = x[0].to("cpu", torch.float64)  # (1, d_model)
    D = f64["query.weight"].shape[0] // num_heads
    q = (x0 @ f64["query.weight"].T).view(num_heads, 1, D)  # (H, 1, D)
    k_new = (x0 @ f64["key.weight"].T).view(num_kv_heads, 1, D)  # (H_kv, 1, D)
    v_new = (x0 @ f64["value.weight"].T).view(num_kv_heads, 1, D)
    keys = torch.cat([cache.keys[0, :, :context].to("cpu", torch.float64), k_new], dim=1)  # (H_kv, context + 1, D)
    values = torch.cat([cache.values[0, :, :context].to("cpu", torch.float64), v_new], dim=1)
    group = num_heads // num_kv_heads
    keys, values = keys.repeat_interleave(group, dim=0), values.repeat_interleave(group, dim=0)  # (H, context + 1, D)
    weights = torch.softmax(q @ keys.transpose(-1, -2) / math.sqrt(D), dim=-1)  # (H, 1, context + 1)
    context_vectors = (weights @ values).transpose(0, 1).reshape(1, num_heads * D)  # (1, H*D)
    return context_vectors @ f64["out.weight"].T + f64["out.bias"]  # (1, d_model)


def _measure_step(config, row, module, cache, x, reference, device, yardstick):
    context = row["context"]

    def step():
        cache.length = context  # every call sees the same context: it appends position `context` again
        with torch.no_grad():
            return module(x, cache=cache)

    row["correct"], row["max_abs_error"] = metrics.compare_to_reference(step()[0], reference, row["tolerance"])
    if not row["correct"]:
        row["reason"] = "output differs from the float64 reference"
    row["sdpa_backends"] = metrics.profile_call(step, device)["backends"]
    read, read_bytes = yardstick
    timing = metrics.time_callable(step, device, min_run_time=config.min_run_time, min_repeats=config.min_repeats,
                                   warmup_time=config.warmup_time, paired=read)
    row.update({key: timing[key] for key in ("ms_median", "ms_q1", "ms_q3", "ms_min", "ms_max", "repeats",
                                             "calls_per_repeat", "cpu_utilization")})
    seconds = row["ms_median"] * 1e-3
    row["tokens_per_s"] = row["batch"] / seconds
    row["cache_bytes_read"] = row["batch"] * (context + 1) * row["cache_bytes_per_token"]
    row["weight_bytes"] = sum(p.nbytes for p in module.parameters())
    row["bytes_read"] = row["cache_bytes_read"] + row["weight_bytes"]
    row["gbps"] = row["bytes_read"] / seconds / 1e9
    row["bandwidth_gbps_paired"] = read_bytes / (timing["paired_ms_median"] * 1e-3) / 1e9
    row["share_of_paired_bandwidth"] = row["gbps"] / row["bandwidth_gbps_paired"]
    parameters = row["weight_bytes"] // next(module.parameters()).element_size()
    row["flops"] = 2 * row["batch"] * parameters + 4 * row["batch"] * row["num_heads"] * (context + 1) * row["head_dim"]
    row["tflops"] = row["flops"] / seconds / 1e12
