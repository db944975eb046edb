"""Runs compared with each other (for the pages; nothing measured): the same profile in two dtypes, and the
same profile twice, to see how far each class's share of the matmul rate moves between runs."""

from attention.bench.core import usable
from attention.report.format import MODE_TITLES, device_label, number, percent, table
from attention.report.sequence import shape_rows


def headline_rows(result, mode):
    """`{label: row}` of the usable (correct) rows at the headline shape in `mode`."""
    return {row["label"]: row for row in shape_rows(result, mode) if usable(row)}


def share_stability(first, second):
    """Two runs of one profile: per mode at the headline shape, `{"mode", "fastest", "rows"}`, `rows` a list of
    `{"label", "paired", "run_level"}`, each a pair of shares (first run, second run), and `fastest` the first
    run's fastest label. Rows measured in only one run are left out."""
    comparison = []
    for mode in first["config"]["modes"]:
        a, b = headline_rows(first, mode), headline_rows(second, mode)
        labels = [label for label in sorted(a, key=lambda label: a[label]["ms_median"]) if label in b]
        if labels:
            comparison.append({"mode": mode, "fastest": labels[0], "rows": [
                {"label": label, "paired": (a[label]["share_of_paired_matmul"], b[label]["share_of_paired_matmul"]),
                 "run_level": (a[label]["share_of_matmul_peak"], b[label]["share_of_matmul_peak"])} for label in labels]})
    return comparison


def share_stability_table(first, second):
    """`share_stability` as a table: per mode and class, each run's share against either yardstick, and the gap."""
    def gap(pair):
        return "—" if None in pair else f"{abs(pair[0] - pair[1]) * 100:.1f}"
    return table(["mode", "implementation", "paired: run 1", "run 2", "gap (points)", "run-level: run 1", "run 2",
                  "gap (points)"], [[MODE_TITLES[entry["mode"]], f"`{row['label']}`" + (" (fastest)" if row["label"] ==
                                                                                         entry["fastest"] else ""),
                                     percent(row["paired"][0]), percent(row["paired"][1]), gap(row["paired"]),
                                     percent(row["run_level"][0]), percent(row["run_level"][1]), gap(row["run_level"])]
                                    for entry in share_stability(first, second) for row in entry["rows"]], "ll" + "r" * 6)


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
