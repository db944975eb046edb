"""Runs compared with each other (for the pages; nothing measured): the same profile in two dtypes, and the
same profile twice, to see how far each class's share of the matmul rate moves between runs."""

from attention.bench.core import usable
from attention.report import prose
from attention.report.format import MODE_TITLES, device_label, number, percent, table
from attention.report.sequence import shape_rows


def headline_rows(result, mode):
    """`{label: row}` of the usable (correct) rows at the headline shape in `mode`."""
    return {row["label"]: row for row in shape_rows(result, mode) if usable(row)}


SHARES = ("share_of_paired_matmul", "share_of_matmul_peak")  # the row fields: the paired yardstick, the run-level one


def share_stability_section(first, second, names, labels):
    """The quick-run page's "Is the share stable?": two runs of the same sources (`names`: their files), each one's
    yardstick rates, per mode at the headline shape the largest move of a class's share between them against either
    yardstick (`SHARES`), and a table of both runs' shares of `labels` and the gaps. Raises ValueError for runs of
    different sources."""
    if first["provenance"]["source_hash"] != second["provenance"]["source_hash"]:
        raise ValueError(f"the stability pair must come from the same sources, got {names[0]} and {names[1]}")
    lines = [f"- `{name}`: {run['provenance']['date_utc'][:16]}, {run['provenance']['duration_s'] / 60:.0f} min; the "
             f"matmul beside the rows ran at {number(peak['paired']['lowest_tflops'])} to "
             f"{number(peak['paired']['highest_tflops'])} TFLOP/s, the run-level samples at {number(min(samples))} to "
             f"{number(max(samples))}" for name, run in zip(names, (first, second))
             for peak in [run["matmul_peak"]] for samples in [[sample["tflops"] for sample in peak["samples"]]]]
    rows = []
    for mode in first["config"]["modes"]:
        one, two = headline_rows(first, mode), headline_rows(second, mode)
        shares = {label: [(one[label][field], two[label][field]) for field in SHARES]
                  for label in sorted(one, key=lambda label: one[label]["ms_median"]) if label in two}
        if shares:  # the gaps in points against the paired yardstick, then the run-level one
            moved = [max(abs(pair[i][0] - pair[i][1]) for pair in shares.values()) * 100 for i in (0, 1)]
            lines.append(f"\n{MODE_TITLES[mode].capitalize()}: over all {len(shares)} classes, a class's share moved by "
                         f"at most {moved[0]:.0f} points between the runs against the paired yardstick, and by at most "
                         f"{moved[1]:.0f} against the run-level one.")
        rows += [[MODE_TITLES[mode], f"`{label}`"] + [cell for a, b in pairs for cell in (
            percent(a), percent(b), "—" if None in (a, b) else f"{abs(a - b) * 100:.1f}")]
            for label, pairs in shares.items() if label in labels]
    rates = [run["matmul_peak"]["tflops"] for run in (first, second)]
    lines.append(f"\nThe two runs' run-level rates were {number(rates[0])} and {number(rates[1])} TFLOP/s, "
                 f"{abs(rates[0] / rates[1] - 1):.0%} apart. A few classes:\n\n" + table(
                     ["mode", "implementation", "paired: run 1", "run 2", "gap (points)", "run-level: run 1", "run 2",
                      "gap (points)"], rows, "ll" + "r" * 6))
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
    rates = tuple((r["matmul_peak"].get("paired") or {}).get("median_tflops") or r["matmul_peak"]["tflops"]
                  for r in (fp32, bf16))  # the paired yardstick's median where the run has one
    return {"matmul": rates, "modes": modes, "rows": rows}


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
        kind = prose.ratio_words(row[mode][2], 1.0, margin)[0]
        groups[{"more": "faster", "less": "slower"}.get(kind, kind)].append(f"`{row['label']}` ({row[mode][2]:.2f}×)")
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
        prose.bf16_matmul_sentence(cpu, flags, flops / ms["matmul"][0] / 1e9, flops / ms["matmul"][1] / 1e9),
        prose.bf16_pieces_sentence(speed),
        prose.bf16_conclusion(speed["projections"], sum(ms[p][0] for p in ("mask", "softmax")) / sum(
            ms[p][1] for p in ("mask", "softmax")), None if flags is None else "amx_bf16" in flags)])

