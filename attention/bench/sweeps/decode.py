"""The decode sweep: one new token per sequence per step, over a KV cache of `context` positions.

A step attends from one new token over every cached one, reading the whole cache and the layer's weights
for little arithmetic, so memory bandwidth, not the matmul rate, bounds it: its yardstick is a large read
(a sum over `bandwidth_bytes`) timed beside each row. For each kind of attention layer (`LAYERS`), each kernel
it runs, each batch size and each context, the sweep builds the layer and its cache (through the
`attention.decoding.DecodingCache` contract: it fills it with `update` and times the same step again
with `rewind`, never touching its fields), checks the step against the model's float64 reference, and
records the tokens per second, the bytes the step must read over its time as a share of the bandwidth
measured beside it, and its FLOPs against a large matmul's rate sampled through the run.

One step is one token per sequence through one attention layer (no MLP, no other layers): a model's tokens
per second are this divided by its layer count, at most. A kind of layer is a `Layer` record, a line in `LAYERS`
(`decode_layers.py`).
"""

import dataclasses
import math
import statistics
from typing import Annotated

import torch

from attention.bench import core, metrics
from attention.bench.results import BOOLEAN, BYTES, MAX_ROWS, MS, POSITIVE, RATE, SHARE, disordered, mismatches, new_row
from attention.schema import config_problems, field_rules, in_range, integer, list_of, nullable, one_of, record, text
from attention.bench.sweeps.decode_layers import LAYERS, head_sizes
from attention.decoding import chosen, forget_choices
from attention.decoding.tuning import timed_call
from attention.reference import tolerance

NAME = "decode"
KEY = ("model", "kernel", "batch", "context")  # what tells a row apart in its section
CEILING_MAX_BYTES = 2**31  # the largest read of the bandwidth ceiling: what `Config.ceiling_bytes` allows (2 GiB)
IN_TURN_ROUNDS = 9  # `auto` rows: at least this many rounds of one call of `auto` and one of each forced kernel
IN_TURN_GOAL = 1.05  # the default's time against the fastest forced kernel's, at most (issue: fast by default)
IN_TURN_ATTEMPTS = 3  # an `auto` row past the goal is timed in turn again, at most this many times in all


def ceiling_sizes(device, budget):
    """The reads of the bandwidth ceiling on `device`: `metrics.ceiling_sizes` of its last-level cache, each at most
    `CEILING_MAX_BYTES` and a quarter of `budget` (a sample holds three tensors of that size at once: the read and a
    copy's source and target; None: no budget), the sizes that become equal read once. A last-level cache reported
    at 480 MiB asked for 2, 4 and 8 GiB."""
    largest = max(1, min(CEILING_MAX_BYTES, budget // 4 if budget else CEILING_MAX_BYTES))
    sizes = metrics.ceiling_sizes(metrics.last_level_cache_bytes(device))
    return tuple(dict.fromkeys(min(size, largest) for size in sizes))


@dataclasses.dataclass
class Config:
    """What to measure (see the module docstring): `num_heads` query heads of `head_dim` size every layer in `LAYERS`;
    `kernels` filters the kernels each model runs."""

    OPTIONS = {"seq_lens": "contexts", "batch": "batches"}  # the command line's --seq-lens and --batch

    num_heads: Annotated[int, POSITIVE] = 32
    head_dim: Annotated[int, POSITIVE] = 128
    models: Annotated[tuple, list_of(lambda name, where: one_of(*LAYERS)(name, where), 64)] = tuple(LAYERS)
    contexts: Annotated[tuple, list_of(POSITIVE, 64)] = (1024, 2048, 4096, 8192, 16384, 32768)
    batches: Annotated[tuple, list_of(POSITIVE, 16)] = (1, 8)
    kernels: Annotated[tuple, list_of(text(r"[a-z_]+", "a kernel name", 40), 16)] = tuple(dict.fromkeys(
        kernel for layer in LAYERS.values() for kernel in layer.kernels))
    seed: Annotated[int, integer(0, 2**63)] = 0
    min_run_time: Annotated[float, in_range(0, 1e4)] = 0.5
    min_repeats: Annotated[int, POSITIVE] = 5
    warmup_time: Annotated[float, in_range(0, 1e4)] = 0.1
    bandwidth_bytes: Annotated[int, POSITIVE] = 2**29
    ceiling_bytes: Annotated[tuple, list_of(integer(1, CEILING_MAX_BYTES), 8)] = ()  # empty: `ceiling_sizes(device)`
    memory_budget_bytes: Annotated[int | None, BYTES] = None
    matmul_size: Annotated[int, POSITIVE] = 2048  # the side of the matmul sampled with the bandwidth

    def resolve(self, device):
        """A copy with the contexts sorted and the memory budget filled in; `ValueError` naming a bad value."""
        budget = self.memory_budget_bytes or core.memory_budget(device)
        resolved = dataclasses.replace(self, models=tuple(self.models), contexts=tuple(sorted(self.contexts)),
                                       batches=tuple(self.batches), kernels=tuple(self.kernels),
                                       memory_budget_bytes=budget,
                                       ceiling_bytes=tuple(self.ceiling_bytes) or ceiling_sizes(device, budget))
        problems = config_problems(resolved)
        kernels = {kernel for layer in LAYERS.values() for kernel in layer.kernels}
        problems += [f"kernels: {kernel!r} is run by none of the models {list(LAYERS)}"
                     for kernel in resolved.kernels if kernel not in kernels]
        problems += [f"models: {name!r} runs none of the kernels {list(resolved.kernels)} (it runs "
                     f"{', '.join(LAYERS[name].kernels)})" for name in resolved.models
                     if name in LAYERS and not set(LAYERS[name].kernels) & set(resolved.kernels)]
        problems += [f"{name}: must not be empty" for name in ("models", "contexts", "batches", "kernels")
                     if not getattr(resolved, name)]
        if problems:
            raise ValueError("; ".join(problems))
        for name in resolved.models:
            LAYERS[name].check(resolved)
        return resolved


class Row(core.Measured):
    """One model, kernel, batch size and context: one decode step."""

    model: Annotated[str, lambda name, where: one_of(*LAYERS)(name, where), "The attention layer (`LAYERS`): `MHA`, "
                     "`GQA`, `MQA`, a model family's layer or `MLA`, at the config's sizes."]
    kernel: Annotated[str, text(r"[a-z_]+", "a kernel name", 40), "The decode kernel the module ran: `sdpa` or `matmul` "
                      "(`attention.decoding.DECODE_KERNELS`, or what a family's layer runs), MLA's `absorbed` or `naive`."]
    batch: Annotated[int, POSITIVE, "Sequences decoded together: one new token each per step."]
    context: Annotated[int, integer(), "Positions already in the cache when the step runs (the notation page's "
                       "`context_length` is the longest a module accepts)."]
    num_heads: Annotated[int | None, POSITIVE, "Query heads."]
    num_kv_heads: Annotated[int | None, POSITIVE, "Key/value heads: what the cache holds per position."]
    head_dim: Annotated[int | None, POSITIVE, "Size of one head."]
    positions_read: Annotated[int, integer(), "Cached positions the step reads, its own included: `context + 1`, "
                              "at most the window for a sliding-window layer."]
    tokens_per_s: Annotated[float | None, RATE, "`batch / step time`: new tokens per second, one layer."]
    cache_bytes_per_token: Annotated[int, BYTES, "Bytes one position takes in one sequence's cache."]
    cache_bytes_read: Annotated[int | None, BYTES, "`batch * positions_read * cache_bytes_per_token`: cache read."]
    flops: Annotated[int | None, integer(), "The step's useful FLOPs: `2 * batch * parameters` (the projections) plus "
                     "`4 * batch * num_heads * positions_read * head_dim` (scores and weighted values); MLA: `batch` "
                     "times `attention.models.deepseek_v3.latent_attention_flops` of its path."]
    weight_bytes: Annotated[int | None, BYTES, "The layer's parameters, read once per step."]
    bytes_read: Annotated[int | None, BYTES, "`cache_bytes_read + weight_bytes`: what the step must read at least."]
    copies_cache: Annotated[bool | None, BOOLEAN, "`peak_memory_bytes >= cache_bytes_read`: the step allocated a copy's worth of its cache."]
    gbps: Annotated[float | None, RATE, "`bytes_read / step time`, in GB/s (10^9 bytes)."]
    bandwidth_gbps_paired: Annotated[float | None, RATE, "A sum's read rate timed beside the row's blocks (median), GB/s."]
    share_of_paired_bandwidth: Annotated[float | None, SHARE, "`gbps / bandwidth_gbps_paired`: how close the step comes "
                                         "to reading at the device's rate under the same conditions."]
    share_of_peak_bandwidth: Annotated[float | None, SHARE, "`gbps / decode.bandwidth.peak_gbps`: against the best read "
                                       "or copy of the whole run (null in runs that did not measure it)."]
    tflops: Annotated[float | None, RATE, "`flops / step time`, TFLOP/s."]
    share_of_matmul_peak: Annotated[float | None, SHARE, "`tflops / decode.matmul_peak.tflops`: against the run's "
                                    "matmul rate (a large dense matmul, median of samples)."]
    chose: Annotated[str | None, nullable(text(r"[a-z_]+( [a-z_]+)*", "names", 80)), "Kernel `auto` only: what its "
                     "timing chose on this machine, the attention (`sdpa` or `matmul`), then the single-row projections "
                     "(`linear`, `row_split`; none at batch > 1)."]
    auto_ms_in_turn: Annotated[float | None, nullable(MS), "Kernel `auto` only: its median step (ms) over calls timed in "
                               "turn with each forced kernel's on the same module and cache (`against_forced`)."]
    fastest_forced: Annotated[str | None, nullable(text(r"[a-z_]+", "a kernel name", 40)), "Kernel `auto` only: the "
                              "forced kernel with the smallest median of those calls."]
    fastest_forced_ms_in_turn: Annotated[float | None, nullable(MS), "Kernel `auto` only: that kernel's median (ms)."]
    auto_over_fastest: Annotated[float | None, nullable(SHARE), "`auto_ms_in_turn / fastest_forced_ms_in_turn`: "
                                 "the default's time against the best candidate's, timed side by side (goal: at most 1.05)."]
    in_turn_earlier: Annotated[list[float] | None, nullable(list_of(SHARE, IN_TURN_ATTEMPTS - 1)), "Kernel `auto` "
                               "only: the ratios of earlier in-turn timings of the row that came out past the goal, "
                               "each timed again (at most `IN_TURN_ATTEMPTS` in all); `auto_over_fastest` is the last."]


def run(config, envelope):
    config = config.resolve(envelope.device)
    device, dtype, limits = envelope.device, envelope.dtype, tolerance(envelope.device, envelope.result["dtype"])
    rows = sum(len(set(config.kernels) & set(LAYERS[name].kernels)) for name in config.models)
    header = dataclasses.asdict(config) | {key: list(getattr(config, key)) for key in ("models", "contexts", "batches",
                                                                                         "kernels", "ceiling_bytes")}
    section = envelope.open(NAME, header | {"bandwidth": None, "matmul_peak": None, "rows": []},
                            rows * len(config.batches) * len(config.contexts))
    yardstick, samples = core.bandwidth_yardstick(device, dtype, config.bandwidth_bytes), []

    def sample(when):
        rates = metrics.bandwidth_rate(device, dtype, config.ceiling_bytes)
        rates["matmul_tflops"] = metrics.matmul_rate(device, dtype, config.matmul_size, min_run_time=0.5)["tflops"]
        samples.append({"when": when, **rates})
        envelope.say(f"bandwidth ({when}): read {rates['read_gbps']:.1f} GB/s, copy {rates['copy_gbps']:.1f} GB/s; "
                     f"matmul {rates['matmul_tflops']:.3f} TFLOP/s")

    sample("start")
    for name in config.models:
        for kernel in (kernel for kernel in LAYERS[name].kernels if kernel in config.kernels):
            torch.manual_seed(config.seed)
            module, hidden = LAYERS[name].build(config, kernel)
            module = module.to(device, dtype).eval().requires_grad_(False)
            x_all = torch.randn(max(config.batches), 1, hidden, generator=torch.Generator().manual_seed(config.seed + 1))
            shared = dict(model=name, kernel=kernel, status="ok", tolerance=limits, **head_sizes(module))
            for batch in config.batches:
                for row in kernel_rows(config, shared, module, x_all[:batch].to(device, dtype), yardstick):
                    envelope.add(section["rows"], row, f"decode {name} {kernel} B={batch} context={row['context']}")
                core.release(device)
            del module
        sample(f"after {name}")
    section["bandwidth"] = {"bytes": config.bandwidth_bytes, "statistic": "median of samples",
                            "read_gbps": statistics.median(s["read_gbps"] for s in samples),
                            "copy_gbps": statistics.median(s["copy_gbps"] for s in samples), "samples": samples,
                            "last_level_cache_bytes": metrics.last_level_cache_bytes(device),
                            "peak_gbps": max(max(s["read_gbps"], s["copy_gbps"]) for s in samples)}
    section["matmul_peak"] = {"size": config.matmul_size, "statistic": "median of samples",
                              "tflops": statistics.median(s["matmul_tflops"] for s in samples)}
    finish(section)


def finish(section):
    """Each row's shares of the section's run-level matmul rate and bandwidth ceiling."""
    for row in (row for row in section["rows"] if row["tflops"] is not None):
        row.update(share_of_matmul_peak=row["tflops"] / section["matmul_peak"]["tflops"],
                   share_of_peak_bandwidth=row["gbps"] / section["bandwidth"]["peak_gbps"])


def subjects(row):
    """The module of the layer a row stepped: with the sweep's own, what its numbers depend on."""
    return [LAYERS[row["model"]].module] if row["model"] in LAYERS else []


def for_rows(config, rows):
    """`config` narrowed to the layers of `rows`: what measures them again (`--refresh`)."""
    return dataclasses.replace(config, models=tuple(dict.fromkeys(row["model"] for row in rows)))


def kernel_rows(config, shared, module, x, yardstick):
    """Every context's row of one layer and kernel (`shared`: the fields their rows hold) and batch size (`x`'s), over
    one cache of the longest context filled as the contexts grow (random `update`s; each step `rewind`s first)."""
    layer, batch, longest, element = LAYERS[shared["model"]], x.shape[0], max(config.contexts), x.element_size()
    shapes = layer.entries(module)
    per_token = sum(math.prod(shape) for shape in shapes) * element
    base = dict(shared, batch=batch, cache_bytes_per_token=per_token)
    def budget(context):
        return core.over_budget((batch + 1) * (longest + 1) * per_token
                                + layer.step_bytes(module, batch, layer.positions_read(context)),
                                config.memory_budget_bytes, f"a cache (B={batch}, {longest + 1} positions, and batch "
                                "element 0's copy for the check) and the step's own tensors")
    if budget(config.contexts[0]):
        for context in config.contexts:
            yield new_row(Row, **base | dict(context=context, positions_read=layer.positions_read(context),
                                             status="skipped", reason=budget(context)))
        return
    cache, kept, filled = module.new_cache(batch, longest + 1), [[] for _ in shapes], 0
    if cache.nbytes != batch * layer.positions_read(longest) * per_token:  # what `entries` and `positions_read` say
        raise ValueError(f"{base['model']}: the cache holds {cache.nbytes} bytes, not batch x positions_read x entries' bytes")
    generator = torch.Generator().manual_seed(config.seed + 2)
    for context in config.contexts:
        if budget(context):
            yield new_row(Row, **base | dict(context=context, positions_read=layer.positions_read(context),
                                             status="skipped", reason=budget(context)))
            continue
        cache.rewind(filled)
        for start in range(filled, context, 256):  # chunks: a chunk's mask is (chunk, positions)
            chunk = [torch.randn(batch, shape[0], min(256, context - start), *shape[1:], generator=generator)
                     for shape in shapes]
            cache.update(*(tensor.to(x.device, x.dtype) for tensor in chunk))
            for past, tensor in zip(kept, chunk):
                past.append(tensor[:1].to(x.dtype))  # batch element 0, as the cache holds it
        filled = context
        row = new_row(Row, **base, context=context, positions_read=layer.positions_read(context),
                      weight_bytes=sum(p.nbytes for p in module.parameters()))
        row.update(cache_bytes_read=batch * row["positions_read"] * per_token, flops=layer.flops(row, element))
        row["bytes_read"] = row["cache_bytes_read"] + row["weight_bytes"]

        def step(context=context):
            cache.rewind(context)  # every call sees the same context: it appends position `context` again
            with torch.no_grad():
                return module(x, cache=cache)

        def check(out, context=context):
            cached = [torch.cat(past, dim=2) for past in kept]  # (1, heads, context, *dims)
            return core.compared(out[0], layer.reference(config, module, x[:1], cached, context), row["tolerance"])
        try:
            forget_choices()  # `auto` times its candidates again at this context, inside the row's warm-up
            row.update(core.measure(step, check, x.device, config, yardstick))
            if shared["kernel"] == "auto":
                row["chose"] = " ".join(dict.fromkeys(name for _, name in sorted(chosen().items(), key=str)))
                row.update(in_turn(step, module, [kernel for kernel in layer.kernels if kernel != "auto"], config))
            seconds, peak = row["ms_median"] * 1e-3, row["peak_memory_bytes"]
            row.update(tokens_per_s=batch / seconds, gbps=row["bytes_read"] / seconds / 1e9,
                       tflops=row["flops"] / seconds / 1e12, copies_cache=None if peak is None else peak >= row["cache_bytes_read"])
            row["share_of_paired_bandwidth"] = row["gbps"] / row["bandwidth_gbps_paired"]
        except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
            core.failed(row, error)
        yield row


def against_forced(step, module, forced, config):
    """An `auto` row's fields: its step's median beside the fastest of the `forced` kernels', each call timed in turn
    (one call of each per round, through `module.decode_kernel`, each round starting one kernel later, on the same
    cache), so a drift of the machine hits them alike: the rows' own medians are timed minutes apart. At least
    `IN_TURN_ROUNDS` rounds and twice the config's `min_run_time`, after one untimed round; `auto` keeps the choice its
    row's warm-up made."""
    seconds, spent, rounds = {name: [] for name in ("auto", *forced)}, 0.0, 0
    try:
        for name in seconds:  # the untimed round: each forced path's first call allocates
            module.decode_kernel = name
            step()
        while rounds < max(IN_TURN_ROUNDS, config.min_repeats) or spent < 2 * config.min_run_time and rounds < 1000:
            names = list(seconds)[rounds % len(seconds):] + list(seconds)[:rounds % len(seconds)]
            for name in names:  # each round starts with the next kernel: no kernel always follows the same one
                module.decode_kernel = name
                seconds[name].append(timed_call(step))
            spent, rounds = spent + sum(samples[-1] for samples in seconds.values()), rounds + 1
    finally:
        module.decode_kernel = "auto"
    medians = {name: statistics.median(samples) * 1e3 for name, samples in seconds.items()}
    fastest = min(forced, key=medians.get)
    return dict(auto_ms_in_turn=medians["auto"], fastest_forced=fastest, fastest_forced_ms_in_turn=medians[fastest],
                auto_over_fastest=medians["auto"] / medians[fastest])


def in_turn(step, module, forced, config):
    """`against_forced`, timed again while its ratio is past `IN_TURN_GOAL` (at most `IN_TURN_ATTEMPTS` in all): `auto`
    runs one of the forced kernels' code paths, so a ratio past the goal is a choice the tuner got wrong or a window the
    machine was busy in; a wrong choice stays past the goal each time, and every earlier ratio is kept in the row."""
    earlier, fields = [], against_forced(step, module, forced, config)
    while fields["auto_over_fastest"] > IN_TURN_GOAL and len(earlier) < IN_TURN_ATTEMPTS - 1:
        earlier.append(fields["auto_over_fastest"])
        fields = against_forced(step, module, forced, config)
    return fields | dict(in_turn_earlier=earlier)


IN_TURN = ("auto_ms_in_turn", "fastest_forced", "fastest_forced_ms_in_turn", "auto_over_fastest")  # `auto` rows only

SECTION = record(field_rules(Config) | {
    "bandwidth": record({"bytes": POSITIVE, "statistic": one_of("median of samples"), "read_gbps": RATE,
                         "copy_gbps": RATE, "samples": list_of(record({
                             "when": text(r"start|after [A-Za-z0-9_.-]+", "start or after <model>"), "read_gbps": RATE,
                             "copy_gbps": RATE, "matmul_tflops": nullable(RATE)}, optional=("matmul_tflops",)), 200),
                         "last_level_cache_bytes": nullable(BYTES), "peak_gbps": RATE},
                        optional=("last_level_cache_bytes", "peak_gbps")),
    "matmul_peak": nullable(record({"size": POSITIVE, "statistic": one_of("median of samples"), "tflops": RATE})),
    "rows": list_of(record(field_rules(Row), optional=("share_of_peak_bandwidth", "chose", "copies_cache", *IN_TURN, "in_turn_earlier")), MAX_ROWS)},
    optional=("ceiling_bytes", "matmul_size"))  # absent in runs recorded before the ceiling was measured (2048 then)


def validate(section, result):
    """The section's rules, then each row's bytes, rates and shares recomputed from its own numbers."""
    problems = SECTION(section, NAME) or ([] if section["rows"] else ["decode.rows: none"])
    bandwidth = {} if problems else section["bandwidth"]
    best = max((max(sample["read_gbps"], sample["copy_gbps"]) for sample in bandwidth.get("samples", [])), default=None)
    if "peak_gbps" in bandwidth and (best is None or not math.isclose(bandwidth["peak_gbps"], best, rel_tol=1e-9)):
        problems.append(f"decode.bandwidth.peak_gbps: {bandwidth['peak_gbps']} is not the best read or copy of its samples")
    element = torch.empty((), dtype=core.DTYPES.get(result["dtype"], torch.float32)).element_size()
    for index, row in enumerate([] if problems else section["rows"]):
        where = f"decode.rows[{index}] ({row['model']}, {row['kernel']}, B={row['batch']}, context={row['context']})"
        if row["positions_read"] != LAYERS[row["model"]].positions_read(row["context"]):
            problems.append(f"{where}: positions_read {row['positions_read']} is not the model's "
                            f"{LAYERS[row['model']].positions_read(row['context'])} at this context")
        if row["status"] != "ok":
            continue
        if (row.get("chose") is not None) != (row["kernel"] == "auto"):
            problems.append(f"{where}: chose {row.get('chose')!r}: what `auto` chose, named on its rows only")
        if IN_TURN[0] in row and any((row[name] is not None) != (row["kernel"] == "auto") for name in IN_TURN):
            problems.append(f"{where}: {', '.join(IN_TURN)}: set on `auto` rows only, and all of them there")
        elif row.get("fastest_forced") is not None:
            if row["fastest_forced"] not in LAYERS[row["model"]].kernels or row["fastest_forced"] == "auto":
                problems.append(f"{where}: fastest_forced {row['fastest_forced']!r} is not one of the model's forced "
                                f"kernels {[kernel for kernel in LAYERS[row['model']].kernels if kernel != 'auto']}")
            problems += mismatches(where, row, {"auto_over_fastest": row["auto_ms_in_turn"] / row["fastest_forced_ms_in_turn"]})
        if row.get("in_turn_earlier") and (row["kernel"] != "auto" or min(row["in_turn_earlier"]) <= IN_TURN_GOAL):
            problems.append(f"{where}: in_turn_earlier {row['in_turn_earlier']}: on `auto` rows only, each earlier "
                            f"ratio past the goal {IN_TURN_GOAL} (a ratio within it is not timed again)")
        if disordered(where, row):
            problems += disordered(where, row)
            continue
        seconds = row["ms_median"] / 1e3
        expected = {"tokens_per_s": row["batch"] / seconds, "bytes_read": row["cache_bytes_read"] + row["weight_bytes"],
                    "cache_bytes_read": row["batch"] * row["positions_read"] * row["cache_bytes_per_token"],
                    "flops": LAYERS[row["model"]].flops(row, element), "gbps": row["bytes_read"] / seconds / 1e9,
                    "share_of_paired_bandwidth": row["gbps"] / row["bandwidth_gbps_paired"],
                    "tflops": row["flops"] / seconds / 1e12}
        if "copies_cache" in row and row["peak_memory_bytes"] is not None:  # older runs: no field
            expected["copies_cache"] = row["peak_memory_bytes"] >= row["cache_bytes_read"]
        if section["matmul_peak"]:
            expected["share_of_matmul_peak"] = row["tflops"] / section["matmul_peak"]["tflops"]
        if "peak_gbps" in section["bandwidth"]:
            expected["share_of_peak_bandwidth"] = row["gbps"] / section["bandwidth"]["peak_gbps"]
        problems += mismatches(where, row, expected)
    return problems
