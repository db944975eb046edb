"""Runs compared with each other (for the pages; nothing measured): the same profile in two dtypes, and the
same profile twice, to see how far each class's share of the matmul rate moves between runs."""

from attention.bench.core import usable
from attention.bench.results import is_stale
from attention.report import prose
from attention.report.format import MODE_TITLES, device_label, number, percent, table
from attention.report.sequence import kernel_kind, shape_rows


def headline_rows(result, mode):
    """`{label: row}` of the usable (correct) rows at the headline shape in `mode`."""
    return {row["label"]: row for row in shape_rows(result, mode) if usable(row)}


SHARES = {"paired": "share_of_paired_matmul", "run_level": "share_of_matmul_peak"}  # yardstick: row field


def share_stability(first, second):
    """Two runs of one profile: per mode at the headline shape, `{"mode", "rows"}`, `rows` a list of `{"label",
    "paired", "run_level"}`, each a pair of shares (first run, second run), in the first run's order by time. Rows
    measured in only one run are left out."""
    comparison = []
    for mode in first["config"]["modes"]:
        a, b = headline_rows(first, mode), headline_rows(second, mode)
        rows = [{"label": label, **{key: (a[label][field], b[label][field]) for key, field in SHARES.items()}}
                for label in sorted(a, key=lambda label: a[label]["ms_median"]) if label in b]
        comparison += [{"mode": mode, "rows": rows}] if rows else []
    return comparison


def share_stability_table(first, second, labels=None):
    """`share_stability` as a table: per mode and class (of `labels`, default all), each run's share against either
    yardstick, and the gap."""
    return table(["mode", "implementation", "paired: run 1", "run 2", "gap (points)", "run-level: run 1", "run 2",
                  "gap (points)"],
                 [[MODE_TITLES[entry["mode"]], f"`{row['label']}`"] + [cell for key in SHARES for cell in (
                     percent(row[key][0]), percent(row[key][1]),
                     "—" if None in row[key] else f"{abs(row[key][0] - row[key][1]) * 100:.1f}")]
                  for entry in share_stability(first, second) for row in entry["rows"]
                  if labels is None or row["label"] in labels], "ll" + "r" * 6)


def share_stability_section(first, second, names, labels):
    """The quick-run page's "Is the share stable?": two runs of the same sources (`names`: their files), each one's
    yardstick rates, per mode the largest move of a class's share between them against either yardstick, and
    `share_stability_table` of `labels`. Raises ValueError for runs of different sources."""
    if first["provenance"]["source_hash"] != second["provenance"]["source_hash"]:
        raise ValueError(f"the stability pair must come from the same sources, got {names[0]} and {names[1]}")
    lines = []
    for name, run in zip(names, (first, second)):
        paired, samples = run["matmul_peak"]["paired"], [sample["tflops"] for sample in run["matmul_peak"]["samples"]]
        lines.append(f"- `{name}`: {run['provenance']['date_utc'][:16]}, {run['provenance']['duration_s'] / 60:.0f} min; "
                     f"the matmul beside the rows ran at {number(paired['lowest_tflops'])} to "
                     f"{number(paired['highest_tflops'])} TFLOP/s, the run-level samples at {number(min(samples))} to "
                     f"{number(max(samples))}")
    for entry in share_stability(first, second):
        moved = {key: max(abs(r[key][0] - r[key][1]) for r in entry["rows"]) * 100 for key in SHARES}
        lines.append(f"\n{MODE_TITLES[entry['mode']].capitalize()}: over all {len(entry['rows'])} classes, a class's "
                     f"share moved by at most {moved['paired']:.0f} points between the runs against the paired "
                     f"yardstick, and by at most {moved['run_level']:.0f} against the run-level one.")
    rates = [run["matmul_peak"]["tflops"] for run in (first, second)]
    lines.append(f"\nThe two runs' run-level rates were {number(rates[0])} and {number(rates[1])} TFLOP/s, "
                 f"{abs(rates[0] / rates[1] - 1):.0%} apart. A few classes:\n\n"
                 + share_stability_table(first, second, labels))
    return "\n".join(lines)


def dtype_pairs(results):
    """`[(float32 result, bfloat16 result)]`: recorded runs of one device (its identity, `device_label`) and profile
    in both dtypes (`results` as `[(path, result)]`; the first of each kind, in the order given)."""
    runs = {}
    for _, result in results:
        key = (result["device_type"], device_label(result["provenance"]["device"]), result["profile"],
               result["config"]["batch"], result["config"]["seq_len"])
        runs.setdefault(key, {}).setdefault(result["dtype"], result)
    return [(kinds["float32"], kinds["bfloat16"]) for kinds in runs.values() if {"float32", "bfloat16"} <= set(kinds)]


def matmul_rate(result):
    peak = result["matmul_peak"]
    return (peak.get("paired") or {}).get("median_tflops") or peak["tflops"]


def dtype_comparison(fp32, bf16):
    """Per class at the headline shape, in each mode, the median times in float32 and bfloat16 and the speed-up
    `fp32 ms / bf16 ms` (above 1: bfloat16 faster): `{"matmul": (fp32 TFLOP/s, bf16 TFLOP/s), "modes",
    "rows": [{"label", mode: (fp32 ms, bf16 ms, speed-up)}]}`, rows in float32 forward order."""
    modes = [mode for mode in fp32["config"]["modes"] if mode in bf16["config"]["modes"]]
    by_mode = {mode: (headline_rows(fp32, mode), headline_rows(bf16, mode)) for mode in modes}
    first = by_mode[modes[0]][0] if modes else {}
    labels = sorted((label for label in first if all(label in a and label in b for a, b in by_mode.values())),
                    key=lambda label: first[label]["ms_median"])
    rows = [{"label": label, **{mode: (a[label]["ms_median"], b[label]["ms_median"],
                                       a[label]["ms_median"] / b[label]["ms_median"]) for mode, (a, b) in by_mode.items()}}
            for label in labels]
    return {"matmul": (matmul_rate(fp32), matmul_rate(bf16)), "modes": modes, "rows": rows}


def dtype_comparison_table(fp32, bf16):
    """The matmul rates in both dtypes, then `dtype_comparison` as a table."""
    comparison, config = dtype_comparison(fp32, bf16), fp32["config"]
    fp32_rate, bf16_rate = comparison["matmul"]
    header = ["implementation"] + [f"{MODE_TITLES[m]}: {what}" if what == "float32 ms" else what
                                   for m in comparison["modes"] for what in ("float32 ms", "bfloat16 ms", "bf16 speed")]
    lines = [[f"`{row['label']}`"] + [cell for mode in comparison["modes"] for cell in (
        number(row[mode][0]), number(row[mode][1]), f"{row[mode][2]:.2f}×")] for row in comparison["rows"]]
    return (f"B={config['batch']}, T={config['seq_len']}, d_model {config['d_model']}, {config['num_heads']} heads. The "
            f"{fp32['matmul_peak']['size']}² matmul: {number(fp32_rate)} TFLOP/s in float32, {number(bf16_rate)} in "
            f"bfloat16 ({bf16_rate / fp32_rate:.2f}×). bf16 speed = float32 ms / bfloat16 ms: above 1, bfloat16 is "
            f"faster.\n\n" + table(header, lines))


def dtype_verdict(fp32, bf16, mode="forward", margin=0.05):
    """One sentence: which classes bfloat16 makes faster, slower and about the same (within `margin`) in `mode`."""
    groups = {"faster": [], "slower": [], "about the same": []}
    for row in dtype_comparison(fp32, bf16)["rows"]:
        speed = row[mode][2]
        groups["faster" if speed > 1 + margin else "slower" if speed < 1 - margin else "about the same"].append(
            f"`{row['label']}` ({speed:.2f}×)")
    return (f"{MODE_TITLES[mode].capitalize()}, bfloat16 against float32 (more than {margin:.0%} apart counts): "
            + "; ".join(f"{what}: {', '.join(labels)}" for what, labels in groups.items() if labels) + ".")


# The pieces of one attention call the quick-run page times in both dtypes, in words; the last four make up the
# written-out core.
PIECES = {"matmul": "a square matmul (the yardstick's kind)", "projections": "the projections: `(B·T, C) @ (C, 3C)`",
          "sdpa": "SDPA's causal core (fused)", "scores": "written-out core: `Q Kᵀ`",
          "mask": "written-out core: causal `masked_fill`", "softmax": "written-out core: softmax",
          "weights_v": "written-out core: weights `@ V`"}


def bf16_pieces_section(ms, matmul_size, cpu, flags):
    """The pieces (`PIECES`) timed on the build's CPU (`ms`: `{piece: (float32 ms, bfloat16 ms)}`; the matmul
    `matmul_size`²): a table of both times and bfloat16's speed, then what they say (`attention.report.prose`)."""
    speed = {piece: fp32 / bf16 for piece, (fp32, bf16) in ms.items()}
    core = ("scores", "mask", "softmax", "weights_v")
    speed["written_out"] = sum(ms[p][0] for p in core) / sum(ms[p][1] for p in core)
    flops = 2 * matmul_size**3
    rows = [[PIECES[piece], number(fp32), number(bf16), prose.times(speed[piece], "×")] for piece, (fp32, bf16) in ms.items()]
    return "\n\n".join([
        "bf16 speed = float32 ms / bfloat16 ms (above 1: bfloat16 is faster).\n\n"
        + table(["piece", "float32 ms", "bfloat16 ms", "bf16 speed"], rows),
        prose.bf16_matmul_sentence("This build's CPU", cpu, flags, flops / ms["matmul"][0] / 1e9,
                                   flops / ms["matmul"][1] / 1e9),
        prose.bf16_pieces_sentence(speed),
        prose.bf16_conclusion(speed["projections"], sum(ms[p][0] for p in ("mask", "softmax")) / sum(
            ms[p][1] for p in ("mask", "softmax")), prose.has_amx(flags))])


def bf16_recorded_section(fp32, bf16, names):
    """Two recorded runs of one CPU in both dtypes (`names`: their files), class by class at their headline shape:
    the matmul rates, then bfloat16's speed per kind of kernel (`kernel_kind`) in each mode, and FlexAttention's
    training peak in score tensors of that shape. The shape in the words is read from the rows it describes."""
    device, comparison = fp32["provenance"]["device"], dtype_comparison(fp32, bf16)
    parts = [f"`{names[0]}` and `{names[1]}`" + (" (recorded with older code than this page)" if is_stale(fp32)
                                                  or is_stale(bf16) else "") + ". " + prose.bf16_matmul_sentence(
        "Their CPU", device["name"], device.get("cpu_flags"), *comparison["matmul"])]
    for mode in comparison["modes"]:
        rows = {row["label"]: row for row in shape_rows(fp32, mode)}
        (batch, seq_len), = {(rows[row["label"]]["batch"], rows[row["label"]]["seq_len"]) for row in comparison["rows"]}
        groups = {}
        for row in comparison["rows"]:
            groups.setdefault(kernel_kind(rows[row["label"]], mode), []).append(row[mode][2])
        parts.append(prose.bf16_classes_sentence(f"{MODE_TITLES[mode]}, B = {batch}, T = {seq_len}", groups))
    for flex in (row for row in shape_rows(fp32, "forward_backward") if row["implementation"] == "flex" and usable(row)):
        score_bytes = flex["batch"] * flex["num_heads"] * flex["seq_len"] ** 2 * 4  # one float32 (B, H, T, T)
        parts.append(f"`flex` in forward + backward (B = {flex['batch']}, T = {flex['seq_len']}, float32): a peak of "
                     f"{flex['peak_memory_bytes'] / 2**20:,.0f} MiB, {flex['peak_memory_bytes'] / score_bytes:.1f} times "
                     f"one `(B, H, T, T)` float32 score tensor of {score_bytes / 2**20:,.0f} MiB"
                     + (": its backward writes the scores out." if flex["peak_memory_bytes"] > 2 * score_bytes else "."))
    return "\n\n".join(parts)
