"""The sequence sweep: every registered class on the same input and weights, checked, then timed.

For each shape (the headline shape, then each length of the sweep), class (and, with `compile`, its
`torch.compile`d version) and mode: the class is built with the canonical weights drawn from `seed`; its
first call is checked against the float64 reference (`attention.reference`) on batch element 0 and the
first `checked_tokens` positions; `core.measure` records the SDPA backends, peak memory and time, timed in
blocks interleaved with a dense matmul's (the paired yardstick). A matmul timed at the start and after each
shape gives the run-level rate. Rows and conventions: docs/benchmark-schema.md.
"""

import contextlib
import dataclasses
import functools
import itertools
import math
import statistics
from typing import Annotated, Callable, NamedTuple

import torch

from attention.bench import core, metrics
from attention.bench.results import (BYTES, DEVICE_TYPES, DTYPE, MAX_ROWS, POSITIVE, RATE, REASON_CHARS, SHARE,
                                     disordered, mismatches, new_row)
from attention.schema import (BOOLEAN, IDENTIFIER, field_rules, in_range, integer, list_of, mapping, nullable, one_of,
                              record, rule_of, text)
from attention.causal.flex import recompile_room
from attention.reference import canonical_weights, kv_heads_state, reference_causal_self_attention, tolerance
from attention.registry import IMPLEMENTATIONS

NAME = "sequence"
MODES = ("forward", "forward_backward")
KEY = ("label", "mode", "batch", "seq_len")  # what tells a row apart in its section


def implementation_name(value, where):  # the registry as it is when checking: a class added later counts
    return one_of(*IMPLEMENTATIONS)(value, where)


def label_name(value, where):
    return implementation_name(value.removesuffix(" (compiled)") if isinstance(value, str) else value, where)


@dataclasses.dataclass
class Config:
    """What to measure; `resolve` fills the `None` fields with the device's defaults: the sweep at batch 1 on
    CPU and MPS (the naive classes' `(B, H, T, T)` scores would not fit otherwise), `batch` on CUDA, over
    T = 128 .. 4096 on CPU, .. 8192 on MPS, .. 16384 on CUDA; `d_in` = `d_model`; the memory budget of
    `core.memory_budget` (a row predicted past it is skipped: from the class and mode's previous shape, times the
    batch ratio and the squared length ratio, or before it has one, from `first_peak_bound`). `check_max_scores` bounds H · checked_tokens², the reference's scores."""

    device: Annotated[str, one_of(*DEVICE_TYPES, "auto")] = "auto"
    dtype: Annotated[str, DTYPE] = "float32"
    modes: Annotated[tuple, list_of(one_of(*MODES), 2)] = MODES
    compile: Annotated[bool, BOOLEAN] = False
    compile_backend: Annotated[str, IDENTIFIER] = "inductor"
    batch: Annotated[int, POSITIVE] = 8
    seq_len: Annotated[int, POSITIVE] = 1024
    sweep_batch: Annotated[int | None, POSITIVE] = None
    seq_lens: Annotated[tuple | None, list_of(POSITIVE, 64)] = None
    d_model: Annotated[int, POSITIVE] = 768
    d_in: Annotated[int | None, POSITIVE] = None
    num_heads: Annotated[int, POSITIVE] = 12
    implementations: Annotated[tuple | None, list_of(implementation_name, 200)] = None
    seed: Annotated[int, integer(0, 2**63)] = 0
    min_run_time: Annotated[float, in_range(0, 1e4)] = 1.0
    min_repeats: Annotated[int, POSITIVE] = 5
    warmup_time: Annotated[float, in_range(0, 1e4)] = 0.25
    matmul_size: Annotated[int | None, POSITIVE] = None
    check_max_scores: Annotated[int, POSITIVE] = 12 * 2048 * 2048
    profile: Annotated[str, IDENTIFIER] = "default"
    memory_budget_bytes: Annotated[int | None, BYTES] = None

    def resolve(self, device=None):
        """A copy with the device's defaults filled in; `ValueError` naming any bad value."""
        device = core.resolve_device(self.device) if device is None else torch.device(device)
        core.check_dtype(self.dtype, device)
        if not self.modes or any(mode not in MODES for mode in self.modes):
            raise ValueError(f"modes must be a non-empty subset of {MODES}, got modes={self.modes!r}")
        longest = {"cpu": 12, "mps": 13}.get(device.type, 14)
        resolved = dataclasses.replace(
            self, device=str(device), modes=tuple(self.modes), d_in=self.d_in or self.d_model,
            sweep_batch=self.sweep_batch or (self.batch if device.type == "cuda" else 1),
            seq_lens=tuple(self.seq_lens if self.seq_lens is not None else (2**i for i in range(7, longest + 1))),
            matmul_size=self.matmul_size or (2048 if device.type == "cpu" else 4096),
            implementations=None if self.implementations is None else tuple(self.implementations),
            memory_budget_bytes=self.memory_budget_bytes or core.memory_budget(device))
        return core.checked(resolved)

    def shapes(self):
        """The `(batch, seq_len)` pairs to measure, headline first, without repeats."""
        return list(dict.fromkeys([(self.batch, self.seq_len)] + [(self.sweep_batch, t) for t in self.seq_lens or ()]))


class Case(NamedTuple):
    name: str
    cls: type
    compiled: bool
    batch: int
    seq_len: int


class Row(core.Measured, core.PairedMatmul):
    """One implementation (compiled or not) in one mode at one shape. `null`: not measured."""

    implementation: Annotated[str, implementation_name, "Registry name."]
    compiled: Annotated[bool, BOOLEAN, "`true` for the `torch.compile`d version (`--compile`); FlexAttention classes, "
                        "which compile inside themselves, are `false` (see `compile_s`)."]
    label: Annotated[str, label_name, "`implementation`, plus ` (compiled)` for compiled rows: its name in tables."]
    mode: Annotated[str, one_of(*MODES), '`"forward"` (under `torch.no_grad()`) or `"forward_backward"`.']
    batch: Annotated[int, POSITIVE, "B, the batch size."]
    seq_len: Annotated[int, POSITIVE, "T, the sequence length."]
    d_in: Annotated[int, POSITIVE, "Input features: the config's `d_in`, by default `d_model`."]
    d_out: Annotated[int, POSITIVE, "Output features: the config's `d_model`."]
    num_heads: Annotated[int, POSITIVE, "H, the number of query heads."]
    head_dim: Annotated[int, POSITIVE, "D = `d_out / num_heads`."]
    num_kv_heads: Annotated[int | None, POSITIVE, "Key/value heads of the module as built (`num_heads` for multi-head "
                            "classes, fewer for grouped-query ones); `null`: not built, or not recorded (before GQA)."]
    position_encoding: Annotated[str | None, one_of("alibi", "rope"), 'The class\'s `position_encoding`.']
    checked_tokens: Annotated[int, POSITIVE, "The check covers positions `0 .. checked_tokens - 1`."]
    checked_batch_index: Annotated[int, integer(0, 0), "The batch element checked: 0."]
    flops_attention: Annotated[int, integer(), "Useful FLOPs of the attention core ([FLOPs](#flops))."]
    flops_projections: Annotated[int, integer(), "Useful FLOPs of the query, key, value and output projections, "
                                 "with the key and value width of `num_kv_heads`."]
    flops: Annotated[int, integer(), "`flops_attention + flops_projections`: the same for every class of one model."]
    share_of_matmul_peak: Annotated[float | None, SHARE, "`tflops / matmul_peak.tflops`, the run-level matmul rate."]


def predicted_peak(last, batch, seq_len):
    """Peak bytes at `(batch, seq_len)` from `last = (batch, seq_len, peak)`: linear in the batch, quadratic in
    the length (the `(B, H, T, T)` scores), an upper bound for the O(T) kernels."""
    return None if last is None else int(last[2] * (batch / last[0]) * (seq_len / last[1]) ** 2)


# Bytes per element of the (B, H, T, T) scores that a registered class holds at its peak, (forward,
# forward_backward): the largest peak / (B·H·T²) of its rows at T >= 2048 in the runs recorded in docs/results/
# (float32 and bfloat16, the 2 MiB to 4 GiB rows of the default and long profiles), rounded up. About 2 float32
# tensors of the scores' shape in a forward (scores, weights), 3 to 4 with the backward; ALiBi adds its bias,
# FlexAttention's CPU backward holds its own. 0: no tensor of that shape (fused or tiled kernels, whose peak per
# score falls as T grows: 0.02 bytes at T = 16384). A class not listed here is assumed to hold the most.
SCORE_BYTES = {"stacked_heads": (1, 7), "split_heads": (9, 13), "fused_qkv": (9, 13), "einsum": (9, 13),
               "seq_first": (9, 17), "torch_mha_weights": (9, 13), "alibi": (22, 22), "flex": (0, 22),
               "alibi_flex": (0, 26), "gqa_flex": (0, 22), "sdpa_causal": (0, 0), "sdpa_mask": (0, 0),
               "torch_mha": (0, 0), "rope": (0, 0), "tiled": (0, 0), "gqa": (0, 0), "mqa": (0, 0)}
UNLISTED_SCORE_BYTES = max(max(pair) for pair in SCORE_BYTES.values())
# What every class may hold besides: a (T, T) mask or bias of up to 8 bytes an element (a boolean mask and its
# float copy), 12 float32 tensors of the activations' size (B, T, d) and 32 bytes per weight (the weights'
# gradients and their copies). With SCORE_BYTES, at least 1.13 times every peak recorded in docs/results/.
MASK_BYTES, ACTIVATION_BYTES, WEIGHT_BYTES = 8, 48, 32


def first_peak_bound(name, mode, config, batch, seq_len):
    """An upper bound of the peak bytes of one call of the class registered as `name` in `mode` at `(batch,
    seq_len)`, from the shape alone: what the memory budget checks before a class has run at any shape."""
    scores = batch * config.num_heads * seq_len**2
    per_score = SCORE_BYTES.get(name, (UNLISTED_SCORE_BYTES,) * 2)[MODES.index(mode)]
    width = max(config.d_in, config.d_model)
    return (per_score * scores + MASK_BYTES * seq_len**2 + ACTIVATION_BYTES * batch * seq_len * width
            + WEIGHT_BYTES * 4 * config.d_in * config.d_model)


def budget_reason(config, case, mode, peaks):
    """Why the row of `case` in `mode` is skipped before it runs, or None: its peak predicted past the memory budget,
    from the same class and mode's last measured shape (`predicted_peak`) or, before it has one, from the shape
    (`first_peak_bound`)."""
    last = peaks.get((case.name, case.compiled, mode))
    if last is None:
        bound = first_peak_bound(case.name, mode, config, case.batch, case.seq_len)
        reason = core.over_budget(bound, config.memory_budget_bytes, "predicted peak memory")
        return reason and f"{reason} (a bound from the shape: {core.size_text(bound)} before any shape was measured)"
    reason = core.over_budget(predicted_peak(last, case.batch, case.seq_len), config.memory_budget_bytes,
                              "predicted peak memory")
    return reason and (f"{reason} (B={last[0]}, T={last[1]} took {core.size_text(last[2])}, times the batch ratio "
                       "and the squared length ratio)")


def run(config, envelope, implementations=None):
    """Measure `config` into `envelope`; `implementations` ({name: class}) defaults to the registry."""
    config = config.resolve(envelope.device)
    available = IMPLEMENTATIONS if implementations is None else implementations
    classes = {name: available[name] for name in config.implementations or available}
    device, dtype, shapes = envelope.device, envelope.dtype, config.shapes()
    cases = [Case(name, cls, compiled, batch, seq_len) for batch, seq_len in shapes
             for (name, cls), compiled in itertools.product(classes.items(), (False, True)[:1 + config.compile])]
    header = {"config": dataclasses.asdict(config) | dict(
        device=device.type, dtype=envelope.result["dtype"], modes=list(config.modes), seq_lens=list(config.seq_lens),
        implementations=list(classes), d_out=config.d_model, head_dim=config.d_model // config.num_heads,
        shapes=[list(shape) for shape in shapes]), "matmul_peak": None, "rows": [], "rankings": []}
    section = envelope.open(NAME, header, len(cases) * len(config.modes))
    yardstick = core.matmul_yardstick(device, dtype, config.matmul_size)
    samples, peaks = [], {}  # run-level matmul rates; (name, compiled, mode) -> (batch, seq_len, peak bytes)

    def sample_matmul(when):
        samples.append({"when": when, **metrics.matmul_rate(device, dtype, config.matmul_size, config.min_run_time,
                                                            max(config.warmup_time, 0.1))})
        envelope.say(f"matmul {config.matmul_size}^2 ({when}): {samples[-1]['tflops']:.3f} TFLOP/s")

    sample_matmul("start")
    state = canonical_weights(config.d_in, config.d_model, config.seed)
    with recompile_room() if config.compile else contextlib.nullcontext():  # compiled rows must not run out
        for shape, group in itertools.groupby(cases, key=lambda case: case[3:]):
            inputs = shape_inputs(config, state, *shape, envelope)
            for case in group:
                for row in case_rows(config, case, inputs, yardstick, peaks):
                    envelope.add(section["rows"], row, f"{row['label']} {row['mode']} B={case.batch} T={case.seq_len}")
                core.release(device)
            sample_matmul(f"after B={shape[0]} T={shape[1]}")
    rates = [sample["tflops"] for sample in samples]
    paired = [row["matmul_tflops_paired"] for row in section["rows"] if row["matmul_tflops_paired"] is not None]
    section["matmul_peak"] = {"size": config.matmul_size, "dtype": envelope.result["dtype"], "tflops": statistics.median(
        rates), "statistic": "median of samples", "best_tflops": max(rates), "worst_tflops": min(rates), "samples":
        samples, "paired": paired and {"rows": len(paired), "median_tflops": statistics.median(paired),
                                       "lowest_tflops": min(paired), "highest_tflops": max(paired)} or None}
    finish(section)


def finish(section):
    """What a section derives from its rows and its run-level matmul rate: each row's share of it, the rankings."""
    for row in section["rows"]:
        if row["tflops"] is not None:
            row["share_of_matmul_peak"] = row["tflops"] / section["matmul_peak"]["tflops"]
    section["rankings"] = rank_rows(section["rows"])


def subjects(row):
    """The module of the class a row measured: with the sweep's own, what its numbers depend on."""
    return [IMPLEMENTATIONS[row["implementation"]].__module__] if row["implementation"] in IMPLEMENTATIONS else []


def for_rows(config, rows):
    """`config` narrowed to the classes of `rows`: what measures them again (`--refresh`)."""
    return dataclasses.replace(config, implementations=tuple(dict.fromkeys(row["implementation"] for row in rows)))


class Inputs(NamedTuple):
    x: torch.Tensor
    grad_output: torch.Tensor
    checked_tokens: int
    state: dict
    reference: Callable  # (position_encoding, num_kv_heads) -> (checked_tokens, d_out) float64, or the error


def shape_inputs(config, state, batch, seq_len, envelope):
    """One shape's input, output gradient and float64 reference (batch element 0, the first `checked_tokens`
    positions, from the input and weights rounded to the run's dtype; a `ValueError` it raises is returned)."""
    x, grad_output = (torch.randn(batch, seq_len, width, generator=torch.Generator().manual_seed(config.seed + seed))
                      .to(envelope.device, envelope.dtype) for seed, width in ((1, config.d_in), (2, config.d_model)))
    checked = min(seq_len, max(1, math.isqrt(config.check_max_scores // config.num_heads)))
    x_checked = x[:1, :checked].to("cpu", torch.float64)
    rounded = {key: value.to(envelope.dtype).to(torch.float64) for key, value in state.items()}

    @functools.cache
    def reference(position_encoding, num_kv_heads):
        try:
            return reference_causal_self_attention(x_checked, kv_heads_state(rounded, config.num_heads, num_kv_heads),
                                                   config.num_heads, position_encoding)[0][0]  # (checked, d_out)
        except ValueError as error:
            return error

    return Inputs(x, grad_output, checked, state, reference)


def case_rows(config, case, inputs, yardstick, peaks):
    """The rows of one case, one per mode: built, checked and timed, or skipped or failed with the reason."""
    def new(mode, num_kv_heads=None):
        shape = dict(batch=case.batch, seq_len=case.seq_len, d_in=config.d_in, d_out=config.d_model,
                     num_heads=config.num_heads, num_kv_heads=num_kv_heads)
        flops = metrics.attention_flops(shape, mode)
        return new_row(Row, **shape, implementation=case.name, compiled=case.compiled, mode=mode, status="ok",
                       label=f"{case.name} (compiled)" if case.compiled else case.name, checked_batch_index=0,
                       head_dim=config.d_model // config.num_heads, position_encoding=case.cls.position_encoding,
                       tolerance=tolerance(inputs.x.device, config.dtype), checked_tokens=inputs.checked_tokens,
                       flops_attention=flops["attention"], flops_projections=flops["projections"], flops=flops["total"])
    skipped = {mode: budget_reason(config, case, mode, peaks) for mode in config.modes}
    if all(skipped.values()):  # nothing to run: the module, and its (T, T) mask buffer, not even built
        yield from (new(mode) | dict(status="skipped", reason=skipped[mode]) for mode in config.modes)
        return
    step = "constructor"
    try:
        torch.manual_seed(config.seed)
        module = case.cls(config.d_in, config.d_model, case.seq_len, 0.0, config.num_heads, qkv_bias=False)
        num_kv_heads, step = getattr(module, "num_kv_heads", config.num_heads), "canonical weights"
        module.load_canonical_state_dict(kv_heads_state(inputs.state, config.num_heads, num_kv_heads))
        module = module.to(inputs.x.device, inputs.x.dtype).eval()
    except Exception as error:  # noqa: BLE001 - any refusal is a skip reason worth recording
        yield from (new(mode) | dict(status="skipped", reason=f"{step}: {core.error_text(error)}") for mode in config.modes)
        return
    if case.compiled:
        module = torch.compile(module, backend=config.compile_backend, dynamic=False)
    for mode in config.modes:
        row, key = new(mode, num_kv_heads), (case.name, case.compiled, mode)
        last = peaks.get(key)
        if skipped[mode]:
            yield row | dict(status="skipped", reason=skipped[mode])
            continue
        call, reset, gradients = mode_call(module, mode, inputs)

        def check(out):
            verdict = core.compared(out[0, :inputs.checked_tokens], inputs.reference(row["position_encoding"],
                                                                                        num_kv_heads), row["tolerance"])
            if verdict["correct"] and any(grad is None or not torch.isfinite(grad).all() for grad in gradients()):
                verdict.update(correct=False, reason="missing or non-finite gradients")
            return verdict
        try:
            row.update(core.measure(call, check, inputs.x.device, config, yardstick, reset))
            row.update(core.matmul_rates(row))
            peaks[key] = (case.batch, case.seq_len, row["peak_memory_bytes"]) if row["peak_memory_bytes"] else last
        except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
            core.failed(row, error)
        yield row


def mode_call(module, mode, inputs):
    """`(call, reset, gradients)`: one call of `module` in `mode`; `reset()` clears the gradients, `gradients()`
    lists the input's and the parameters' after a forward_backward call (none for forward)."""
    if mode == "forward":
        def forward():
            with torch.no_grad():
                return module(inputs.x)
        return forward, lambda: None, list
    holders = [inputs.x.detach().clone().requires_grad_(True)] + [p for p in module.parameters() if p.requires_grad]

    def reset():
        for tensor in holders:
            tensor.grad = None

    def forward_backward():
        reset()
        out = module(holders[0])
        out.backward(inputs.grad_output)
        return out.detach()
    return forward_backward, reset, lambda: [tensor.grad for tensor in holders]


def rank_rows(rows):
    """Per (mode, batch, seq_len): `{"mode", "batch", "seq_len", "order", "fastest", "excluded"}`, `order` the
    labels of the `ok` and correct rows by median time, `excluded` each other label and why."""
    groups = {}
    for row in rows:
        groups.setdefault((row["mode"], row["batch"], row["seq_len"]), []).append(row)
    return [dict(mode=mode, batch=batch, seq_len=seq_len, order=order, fastest=(order or [None])[0], excluded={
        r["label"]: f"{r['status']}: {r['reason']}" if r["status"] != "ok" else ("incorrect" if r["correct"] is False
                                                                                 else "unchecked")
        + (f" (max abs error {r['max_abs_error']:.3g})" if r["max_abs_error"] is not None else "")
        for r in group if not core.usable(r)}) for (mode, batch, seq_len), group in groups.items()
        for order in [[r["label"] for r in sorted(filter(core.usable, group), key=lambda r: r["ms_median"])]]]


MATMUL_PEAK = record({
    "size": POSITIVE, "dtype": DTYPE, "statistic": one_of("median of samples"), "tflops": RATE, "best_tflops": RATE,
    "worst_tflops": RATE, "samples": list_of(record({
        "when": text(r"start|after B=\d+ T=\d+", "start or after B=<batch> T=<length>"), "size": POSITIVE,
        "ms_median": RATE, "ms_iqr": RATE, "tflops": RATE, "cpu_utilization": nullable(SHARE)}), 200),
    "paired": nullable(record({"rows": integer(), "median_tflops": RATE, "lowest_tflops": RATE, "highest_tflops": RATE}))})
SECTION = record({
    "config": record(field_rules(Config) | {"d_out": POSITIVE, "head_dim": POSITIVE, "shapes": list_of(list_of(
        POSITIVE, 2), 64)}, optional=("memory_budget_bytes",)), "matmul_peak": nullable(MATMUL_PEAK),
    "rows": list_of(rule_of(Row), MAX_ROWS), "rankings": list_of(record({
        "mode": one_of(*MODES), "batch": POSITIVE, "seq_len": POSITIVE, "order": list_of(label_name, 200),
        "fastest": nullable(label_name), "excluded": mapping(label_name, text(f"[{REASON_CHARS}]+", "a reason", 400),
                                                              200)}), MAX_ROWS)})


def validate(section, result):
    """The section's rules, then each row's work from its shape and K/V heads, its rates, and the rankings."""
    problems = SECTION(section, "")
    if problems:
        return problems
    config, peak = section["config"], (section["matmul_peak"] or {}).get("tflops")
    problems += [f"config.{key}: {config[key]!r} differs from {top}" for key, top in
                 (("dtype", "dtype"), ("device", "device_type"), ("profile", "profile")) if config[key] != result[top]]
    for index, row in enumerate(section["rows"]):
        where = f"rows[{index}] ({row['label']}, {row['mode']}, B={row['batch']}, T={row['seq_len']})"
        flops = metrics.attention_flops(row, row["mode"])
        expected = dict(flops_attention=flops["attention"], flops_projections=flops["projections"], flops=flops["total"])
        if row["status"] == "ok" and not disordered(where, row):
            expected |= core.matmul_rates(row) | ({"share_of_matmul_peak": row["tflops"] / peak} if peak else {})
        problems += (disordered(where, row) if row["status"] == "ok" else []) + mismatches(where, row, expected)
    recomputed = rank_rows(section["rows"])
    return problems + [f"rankings: {r['mode']}, B={r['batch']}, T={r['seq_len']} differs from the rows' (by median time)"
                       for r in section["rankings"] if r not in recomputed] + ([] if section["rows"] else ["rows: none"])
