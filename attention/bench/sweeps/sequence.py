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
import re
import statistics
from typing import Annotated, Callable, NamedTuple

import torch

from attention.bench import core, metrics
from attention.bench.format import (MODE_TITLES, collapsed, mebibytes, number, percent, status_cell, table,
                                    title_suffix)
from attention.bench.results import (BOOLEAN, BYTES, DEVICE_TYPES, DTYPE, IDENTIFIER, MAX_ROWS, POSITIVE, RATE,
                                     REASON_CHARS, SHARE, disordered, field_rules, integer, list_of, mapping, mismatches,
                                     new_row, nullable, number as finite, one_of, record, rule_of, text)
from attention.causal.flex import recompile_room
from attention.reference import canonical_weights, kv_heads_state, reference_causal_self_attention
from attention.registry import IMPLEMENTATIONS

NAME = "sequence"
MODES = ("forward", "forward_backward")


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
    min_run_time: Annotated[float, finite(0, 1e4)] = 1.0
    min_repeats: Annotated[int, POSITIVE] = 5
    warmup_time: Annotated[float, finite(0, 1e4)] = 0.25
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
    for row in section["rows"]:
        if row["tflops"] is not None:
            row["share_of_matmul_peak"] = row["tflops"] / section["matmul_peak"]["tflops"]
    section["rankings"] = rank_rows(section["rows"])


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
                       tolerance=metrics.TOLERANCES[config.dtype], checked_tokens=inputs.checked_tokens,
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
        for r in group if not ranked(r)}) for (mode, batch, seq_len), group in groups.items()
        for order in [[r["label"] for r in sorted(filter(ranked, group), key=lambda r: r["ms_median"])]]]


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


# --- Reading a run: rows by shape, the fastest and the ties ---------------------------------------------------------

ranked = core.usable  # a row the tables may rank


def shape_rows(result, mode, batch=None, seq_len=None):
    """Rows of one mode at one `(batch, seq_len)`; default the headline shape."""
    shape = (mode, batch or result["config"]["batch"], seq_len or result["config"]["seq_len"])
    return [r for r in result["rows"] if (r["mode"], r["batch"], r["seq_len"]) == shape]


def sweep_rows(result, mode):
    """Rows of the length sweep (`config.sweep_batch`, each of `config.seq_lens`) in `mode`."""
    config = result["config"]
    return [r for r in result["rows"] if r["mode"] == mode and r["batch"] == config["sweep_batch"]
            and r["seq_len"] in (config["seq_lens"] or [])]


def fewer_kv_heads(row):
    """True for a grouped-query or multi-query row: another model (smaller K/V projections) than the multi-head
    classes it is timed beside."""
    return row.get("num_kv_heads") is not None and row["num_kv_heads"] != row["num_heads"]


def matmul_share(row):
    """The row's share of the matmul rate: the paired one where the run has it, else the run-level one."""
    paired = row.get("share_of_paired_matmul")
    return row.get("share_of_matmul_peak") if paired is None else paired


def drift_free(row, key="ms_median"):
    """`row[key]` (a time) at one machine speed: times the matmul rate timed beside the row (the paired yardstick),
    so rows timed minutes apart on a machine whose speed drifts compare as if timed together (only ratios between
    rows mean something). Runs without the paired rate: the time as is."""
    return row[key] * (row.get("matmul_tflops_paired") or 1.0)


def tied(row, other):
    """True when the run cannot tell two rows apart: their IQRs, corrected for the drift (`drift_free`), overlap."""
    return drift_free(row, "ms_q1") <= drift_free(other, "ms_q3") and drift_free(other, "ms_q1") <= drift_free(row, "ms_q3")


def slower_by(row, fastest_row):
    """How much slower `row` is than `fastest_row`, drift-corrected, as "+14%"."""
    return f"+{(drift_free(row) / drift_free(fastest_row) - 1) * 100:.0f}%"


def fastest(result):
    """Per shape (by batch, then length) and mode: the fastest correct row by drift-corrected median, the rows tied
    with it and the next one, `{mode, batch, seq_len, compiled, fastest, tied, next}`. Rows with fewer K/V heads
    (another model) do not compete."""
    groups = {}
    for row in (row for row in result["rows"] if ranked(row) and not fewer_kv_heads(row)):
        groups.setdefault((row["batch"], row["seq_len"], row["mode"], row["compiled"]), []).append(row)
    summary = []
    for (batch, seq_len, mode, compiled), rows in sorted(groups.items(), key=lambda item: item[0][:2]):
        best, *rest = sorted(rows, key=drift_free)
        after = [r for r in rest if not tied(r, best)]
        summary.append(dict(mode=mode, batch=batch, seq_len=seq_len, compiled=compiled, fastest=best,
                            tied=[r for r in rest if tied(r, best)], next=(after or [None])[0]))
    return summary


# --- Tables and charts ----------------------------------------------------------------------------------------------

def verdict(row):
    if row["status"] != "ok":
        return f"{row['status']}: {row['reason']}"
    if row["correct"] is False:
        return f"**no** ({'max abs error %.2g' % row['max_abs_error'] if row['max_abs_error'] is not None else row['reason']})"
    return "yes" if row["correct"] else "unchecked" + (f": {row['reason']}" if row["reason"] else "")


def results_table(result, mode="forward", batch=None, seq_len=None):
    """Every class at one shape (default the headline) in `mode`: rank, median ms, IQR, TFLOP/s, % of the paired
    matmul, peak MiB, SDPA backend, compile s, correct. Correct rows first, by median; the others unranked. A note
    names rows measured on a contended CPU."""
    rows = shape_rows(result, mode, batch, seq_len)
    order = sorted(filter(ranked, rows), key=lambda r: r["ms_median"]) + [r for r in rows if not ranked(r)]
    lines = table(["#", "implementation", "ms (median)", "IQR ms", "TFLOP/s", "% of matmul", "peak MiB", "SDPA backend",
                   "compile s", "correct"], [
        [index + 1 if ranked(row) else "", f"`{row['label']}`", number(row["ms_median"]), number(row["ms_iqr"], 2),
         number(row["tflops"]), percent(matmul_share(row)), mebibytes(row["peak_memory_bytes"]),
         ", ".join(row["sdpa_backends"] or ["—"]), number(row["compile_s"], 2), verdict(row)]
        for index, row in enumerate(order)], "rlrrrrrlrl")
    contended = [r for r in rows if (r["cpu_utilization"] or 1.0) < metrics.CONTENDED_BELOW]
    return lines + (f"\n\nMeasured while other processes competed for the CPU (share of its threads' time this process "
                    f"got, below {metrics.CONTENDED_BELOW:.0%}): " + ", ".join(
                        f"`{r['label']}` {r['cpu_utilization']:.0%}" for r in contended)
                    + ". These times overstate the cost." if contended else "")


def sweep_table(result, mode="forward", metric="ms_median"):
    """One row field (`ms_median`, `tflops`, `share_of_paired_matmul`, `share_of_matmul_peak`, `peak_memory_bytes`
    in MiB) per class (rows) against T (columns); a cell that is not a number says why."""
    units = {"ms_median": "ms", "peak_memory_bytes": "MiB", "tflops": "TFLOP/s", "share_of_matmul_peak": "% of matmul",
             "share_of_paired_matmul": "% of paired matmul"}
    if metric not in units:
        raise ValueError(f"metric must be one of {', '.join(units)}, got metric={metric!r}")
    shown = {"peak_memory_bytes": mebibytes, "share_of_matmul_peak": percent, "share_of_paired_matmul": percent}
    rows = sweep_rows(result, mode)
    lengths, cells = sorted({r["seq_len"] for r in rows}), {(r["label"], r["seq_len"]): r for r in rows}

    def value(row):
        return shown.get(metric, number)(row[metric])
    return table([f"implementation ({units[metric]})"] + [f"T={t}" for t in lengths],
                 [[f"`{label}`"] + [status_cell(cells.get((label, t)), value) for t in lengths]
                  for label in dict.fromkeys(r["label"] for r in rows)])


def yardstick_note(result):
    """What "% of matmul" means in this run's tables."""
    peak = result["matmul_peak"]
    matmul, paired = f"a {peak['size']}×{peak['size']} {peak['dtype']} matmul", peak.get("paired")
    if not paired:
        return f"% of matmul = TFLOP/s / {number(peak['tflops'])} TFLOP/s, the rate of {matmul} measured in the same run."
    return (f"% of matmul = the row's TFLOP/s over the rate of {matmul} timed in blocks interleaved with the row's own "
            f"(matmul, row, matmul, ...), so both saw the same machine. That rate ranged from "
            f"{number(paired['lowest_tflops'])} to {number(paired['highest_tflops'])} TFLOP/s over the run's "
            f"{paired['rows']} rows (median {number(paired['median_tflops'])}; the run-level rate, sampled at the start "
            f"and after each shape: {number(peak['tflops'])}).")


def markdown_tables(result, include_sweep=False):
    """A heading and `results_table` per mode at the headline shape; with `include_sweep`, the `sweep_table`s of
    time and memory per mode too."""
    config, parts = result["config"], []
    for mode in config["modes"]:
        parts += [f"#### {MODE_TITLES[mode]}, {result['dtype']}, B={config['batch']}, T={config['seq_len']}, "
                  f"d_model={config['d_model']}, {config['num_heads']} heads\n", results_table(result, mode), ""]
        for metric, what in (("ms_median", "median ms"), ("peak_memory_bytes", "peak MiB")) if include_sweep else ():
            if sweep_rows(result, mode):
                parts += [f"#### {MODE_TITLES[mode]}: {what} against T (B={config['sweep_batch']})\n",
                          sweep_table(result, mode, metric), ""]
    parts += [yardstick_note(result) + " Rows that are not `correct` have no rank."] if result.get("matmul_peak") else []
    return "\n".join(parts).rstrip() + "\n"


def fastest_cell(entry):
    """One `fastest` entry in words: the fastest row and its median, the rows tied with it, how much slower the next is."""
    if entry is None:
        return "—"
    best, after = entry["fastest"], entry["next"]
    return (f"`{best['label']}` {number(best['ms_median'])} ms" + ("; tied: " + ", ".join(
        f"`{r['label']}` {number(r['ms_median'])}" for r in entry["tied"]) if entry["tied"] else "")
        + (f"; next `{after['label']}` {slower_by(after, best)}" if after else ""))


def fastest_table(result):
    """`fastest` as a table: a line per shape (by batch, then length), a column per mode."""
    entries = fastest(result)
    modes = list(dict.fromkeys((e["mode"], e["compiled"]) for e in entries))
    cells = {(e["batch"], e["seq_len"], e["mode"], e["compiled"]): e for e in entries}
    return table(["B", "T"] + [MODE_TITLES[mode] + (", compiled" if compiled else "") for mode, compiled in modes],
                 [[batch, seq_len] + [fastest_cell(cells.get((batch, seq_len, *key))) for key in modes]
                  for batch, seq_len in dict.fromkeys((e["batch"], e["seq_len"]) for e in entries)], "rr" + "l" * len(modes))


def memory_slopes(result, mode, shortest=2048):
    """Fitted growth of peak memory with T per class, `{label: {"slope", "lengths"}}`: the least-squares slope of
    log(peak) against log(T) over the lengths `>= shortest` (two at least): 2 for T², 1 for T. Below `shortest`
    the weights' gradients and other fixed costs hide the growth."""
    slopes = {}
    for label, points in sweep_series(result, mode, "peak_memory_bytes").items():
        points = [(math.log(t), math.log(v), t) for t, v in points if t >= shortest and v > 0]
        if len(points) >= 2:
            mean_x, mean_y = (sum(p[i] for p in points) / len(points) for i in (0, 1))
            slope = sum((x - mean_x) * (y - mean_y) for x, y, _ in points) / sum((x - mean_x) ** 2 for x, _, _ in points)
            slopes[label] = {"slope": slope, "lengths": [t for _, _, t in points]}
    return slopes


def memory_slope_table(result, shortest=2048):
    """The fitted memory slope per class and mode, the lengths fitted and the peak at the longest of them."""
    lines = []
    for mode in result["config"]["modes"]:
        peaks = {(r["label"], r["seq_len"]): r["peak_memory_bytes"] for r in sweep_rows(result, mode)}
        lines += [[f"`{label}`", MODE_TITLES[mode], f"{fit['slope']:.2f}", f"{fit['lengths'][0]}..{fit['lengths'][-1]}",
                   mebibytes(peaks[label, fit["lengths"][-1]])] for label, fit in memory_slopes(result, mode, shortest).items()]
    return table(["implementation", "mode", "fitted slope (peak ∝ T^slope)", "lengths fitted",
                  "peak at the longest (MiB)"], lines, "llrlr")


def plot_bars(result):
    """Median time per class at the headline shape, a panel per mode, error bars over the IQR; incorrect rows hatched
    red, rows with fewer K/V heads orange; failed and skipped rows left out."""
    from matplotlib.figure import Figure

    config, panels = result["config"], [sorted((r for r in shape_rows(result, mode) if r["status"] == "ok"),
                                               key=lambda r: -r["ms_median"]) for mode in result["config"]["modes"]]
    fig = Figure(figsize=(6.0 * len(panels), max(2.5, 0.32 * max(map(len, panels), default=1) + 1.2)))
    for ax, mode, rows in zip(fig.subplots(1, len(panels), squeeze=False)[0], config["modes"], panels):
        bars = ax.barh([r["label"] + (f" ({r['num_kv_heads']} K/V)" if fewer_kv_heads(r) else "")
                        + ("  (incorrect)" if r["correct"] is False else "") for r in rows],
                       [r["ms_median"] for r in rows], capsize=2,
                       xerr=[[r["ms_median"] - r["ms_q1"] for r in rows], [r["ms_q3"] - r["ms_median"] for r in rows]],
                       color=["tab:red" if r["correct"] is False else "tab:orange" if fewer_kv_heads(r) else "tab:blue"
                              for r in rows])
        for bar, row in zip(bars, rows):
            bar.set_hatch("//" if row["correct"] is False else "")
        ax.set(title=f"{MODE_TITLES[mode]}, B={config['batch']}, T={config['seq_len']}",
               xlabel="time per call (ms, median; bars: IQR)")
        ax.grid(axis="x", alpha=0.3)
    grouped = " (orange: fewer K/V heads)" if any(fewer_kv_heads(r) for rows in panels for r in rows) else ""
    fig.suptitle(f"Causal self-attention, d_model={config['d_model']}, {config['num_heads']} heads{grouped}: "
                 f"{title_suffix(result)}")
    fig.tight_layout()
    return fig


def sweep_series(result, mode, metric):
    """`{label: [(T, value), ...]}` of the measured, not incorrect sweep rows."""
    series = {}
    for row in sweep_rows(result, mode):
        if row["status"] == "ok" and row["correct"] is not False and row[metric] is not None:
            series.setdefault(row["label"], []).append((row["seq_len"], row[metric]))
    return {label: sorted(points) for label, points in series.items()}


# The classes a sweep chart draws in colour, one per kind of kernel; the others grey, under one legend entry.
HIGHLIGHTED = {"split_heads": ("naive: (B, H, T, T) scores", "tab:red"), "sdpa_causal": ("SDPA, fused", "tab:blue"),
               "tiled": ("tiled (FlashAttention's algorithm)", "tab:green"), "flex": ("FlexAttention", "tab:purple")}


def sweep_figure(result, mode, series, guides, what):
    """Log-log lines against T: the `HIGHLIGHTED` classes in colour and named, the others grey; `guides`
    `[(power, label)]` draw c·T^power from the highlighted lines' geometric mean at the shortest T."""
    from matplotlib.figure import Figure

    ax = (fig := Figure(figsize=(7.5, 5))).subplots()
    for label, points in sorted(series.items(), key=lambda item: item[0].split(" ")[0] in HIGHLIGHTED):
        name, color = HIGHLIGHTED.get(label.split(" ")[0], (None, "0.72"))
        ax.plot(*zip(*points), marker="o" if name else None, markersize=4, linewidth=2 if name else 1, color=color,
                label=f"{name} ({label})" if name else None, zorder=3 if name else 2)
    if any(label.split(" ")[0] not in HIGHLIGHTED for label in series):
        ax.plot([], [], color="0.72", label="other classes (see the tables)")
    start = min((points[0][0] for points in series.values()), default=None)
    anchors = [p[0][1] for label, p in series.items() if p[0][0] == start and label.split(" ")[0] in HIGHLIGHTED]
    longest = max((points[-1][0] for points in series.values()), default=None)
    for power, name in guides if anchors else ():  # from the data at the shortest length, growing as T^power
        anchor = math.exp(sum(map(math.log, anchors)) / len(anchors))
        ax.plot([start, longest], [anchor, anchor * (longest / start) ** power], "k--" if power == 2 else "k:",
                linewidth=1, alpha=0.6, label=name)
    ax.set(yscale="log", xlabel="sequence length T (tokens)", ylabel=what)
    ax.set_xscale("log", base=2)
    ax.set_title(f"{MODE_TITLES[mode]}: {what.split(' (')[0]} against T, B={result['config']['sweep_batch']}: "
                 f"{title_suffix(result)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_time_vs_seq_len(result, mode="forward"):
    """Median time against T (log-log), with an O(T²) guide."""
    return sweep_figure(result, mode, sweep_series(result, mode, "ms_median"), [(2, "O(T²)")], "time per call (ms, median)")


def plot_memory_vs_seq_len(result, mode="forward"):
    """Peak memory of one call against T (log-log), with O(T) and O(T²) guides from the data."""
    series = {label: [(t, v / 2**20) for t, v in points if v > 0]
              for label, points in sweep_series(result, mode, "peak_memory_bytes").items()}
    return sweep_figure(result, mode, {label: points for label, points in series.items() if points},
                        [(2, "O(T²)"), (1, "O(T)")], "peak memory of one call (MiB)")


def charts(result):
    """Time per class at the headline shape; time and memory against T for each mode the sweep measured."""
    device, found = title_suffix(result), {}
    found["bars"] = (plot_bars(result), f"median time per implementation at the headline shape, {device}")
    for mode in (mode for mode in result["config"]["modes"] if sweep_series(result, mode, "ms_median")):
        found[f"time-{mode}"] = (plot_time_vs_seq_len(result, mode), f"{MODE_TITLES[mode]} time against T, {device}")
        found[f"memory-{mode}"] = (plot_memory_vs_seq_len(result, mode),
                                   f"{MODE_TITLES[mode]} peak memory against T, {device}")
    return found


def tables(result):
    """What the command line prints: the headline tables (and the sweep's, for the long profile)."""
    return markdown_tables(result, include_sweep=result["profile"] == "long")


def page(result, images):
    """One run on the Benchmarks page: its shape, headline tables, charts; the sweep's tables collapsed."""
    config, sweep_charts = result["config"], "\n\n".join(image for kind, image in images.items() if kind != "bars")
    parts = [f"Headline shape: batch {config['batch']}, T = {config['seq_len']}; the sweep runs batch "
             f"{config['sweep_batch']}, T = {', '.join(map(str, config['seq_lens']))}.",
             re.sub(r"^#### (.*)$", r"**\1**", markdown_tables(result), flags=re.MULTILINE),  # not in the page's TOC
             images.get("bars", ""), sweep_charts and collapsed("Time and peak memory against T (charts)", sweep_charts)]
    if any(len(fit["lengths"]) > 2 for fit in memory_slopes(result, "forward").values()):  # a fit of 3 lengths or more
        parts.append("Peak memory of one call against T, the growth fitted over T ≥ 2048 (below it the weights' "
                     "gradients and other fixed costs hide it):\n\n" + memory_slope_table(result))
    parts += [collapsed(f"{MODE_TITLES[mode]}: every length", "\n\n".join(sweep_table(result, mode, metric) for metric in (
        "ms_median", "peak_memory_bytes"))) for mode in config["modes"] if sweep_rows(result, mode)]
    return "\n\n".join(part.strip() for part in parts if part.strip())
