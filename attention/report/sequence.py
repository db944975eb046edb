"""The sequence sweep's results shown: rows by shape, the fastest and the ties, tables, charts and its section of
the Benchmarks page (the sweep itself: `attention.bench.sweeps.sequence`).
"""

import math
import re

from attention.bench import metrics
from attention.bench.core import usable
from attention.report.format import MODE_TITLES, collapsed, mebibytes, number, percent, status_cell, table, title_suffix


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
    """True for a grouped-query or multi-query row: another model than the multi-head classes beside it."""
    return row.get("num_kv_heads") is not None and row["num_kv_heads"] != row["num_heads"]


def kernel_kind(row, mode, device_type="cpu"):
    """How a row's attention handles the `(B, H, T, T)` scores in `mode`: "fused" (an SDPA kernel other than math, or
    FlexAttention, whose backward is fused on CUDA only), "tiled" (`tiled`), or "written out" (as tensors)."""
    if row["implementation"] == "tiled":
        return "tiled"
    if "flex" in row["implementation"]:
        return "fused" if mode == "forward" or device_type == "cuda" else "written out"
    return "fused" if any(name not in ("n/a", "math") for name in row["sdpa_backends"] or []) else "written out"


def drift_free(row, key="ms_median"):
    """`row[key]` (a time) at one machine speed, times the matmul rate timed beside the row, so that rows timed minutes
    apart on a drifting machine compare as if timed together (only ratios mean something); else the time as is."""
    return row[key] * (row.get("matmul_tflops_paired") or 1.0)


def tied(row, other):
    """True unless one of two rows clearly leads: faster by the raw medians and by the drift-corrected ones
    (`drift_free`), each time by a gap larger than both rows' IQR. The correction is itself an estimate of a few
    percent, so an order it alone makes, or a gap inside the noise, is a tie."""
    orders = []
    for value in (lambda r, key: r[key], drift_free):  # raw, then at one machine speed
        first, second = sorted((row, other), key=lambda r: value(r, "ms_median"))
        gap = value(second, "ms_median") - value(first, "ms_median")
        orders.append(first is row if gap > max(value(r, "ms_q3") - value(r, "ms_q1") for r in (row, other)) else None)
    return orders[0] is None or orders[0] != orders[1]


def slower_by(row, fastest_row):
    """How much slower `row` is than `fastest_row`, drift-corrected, as "+14%"."""
    return f"+{(drift_free(row) / drift_free(fastest_row) - 1) * 100:.0f}%"


def within(best, rows):
    """The widest drift-corrected gap between `best` and `rows`, as "within 2%" (rounded up)."""
    return f"within {math.ceil(max((drift_free(r) / drift_free(best) - 1 for r in rows), default=0) * 100):.0f}%"


def fastest(result):
    """Per shape (by batch, then length) and mode: the fastest correct row by drift-corrected median, the rows tied
    with it (`tied`) and the first row it clearly leads, `{mode, batch, seq_len, compiled, fastest, tied, next}`.
    Rows with fewer K/V heads (another model) do not compete."""
    groups = {}
    for row in (row for row in result["rows"] if usable(row) and not fewer_kv_heads(row)):
        groups.setdefault((row["batch"], row["seq_len"], row["mode"], row["compiled"]), []).append(row)
    summary = []
    for (batch, seq_len, mode, compiled), rows in sorted(groups.items(), key=lambda item: item[0][:2]):
        best, *rest = sorted(rows, key=drift_free)
        after = [r for r in rest if not tied(r, best)]
        summary.append(dict(mode=mode, batch=batch, seq_len=seq_len, compiled=compiled, fastest=best,
                            tied=[r for r in rest if tied(r, best)], next=(after or [None])[0]))
    return summary


def leaders(entry):
    """A `fastest` entry's answer: "`a`" where one class clearly leads, else "`a` ≈ `b` (within 2%)"."""
    names = " ≈ ".join(f"`{row['label']}`" for row in [entry["fastest"], *entry["tied"]])
    return names + (f" ({within(entry['fastest'], entry['tied'])})" if entry["tied"] else "")


def verdict(row):
    if row["status"] != "ok":
        return f"{row['status']}: {row['reason']}"
    if row["correct"] is False:
        return f"**no** ({'max abs error %.2g' % row['max_abs_error'] if row['max_abs_error'] is not None else row['reason']})"
    return "yes" if row["correct"] else "unchecked" + (f": {row['reason']}" if row["reason"] else "")


def results_table(result, mode="forward", batch=None, seq_len=None, labels=None):
    """Every class (of `labels`, default all) at one shape (default the headline) in `mode`: rank, median ms, IQR,
    TFLOP/s, % of the paired matmul, peak MiB, SDPA backend, compile s, correct. Correct rows first, by median; the
    others unranked. A note names rows measured on a contended CPU."""
    rows = [row for row in shape_rows(result, mode, batch, seq_len) if labels is None or row["label"] in labels]
    order = sorted(filter(usable, rows), key=lambda r: r["ms_median"]) + [r for r in rows if not usable(r)]
    lines = table(["#", "implementation", "ms (median)", "IQR ms", "TFLOP/s", "% of matmul", "peak MiB", "SDPA backend",
                   "compile s", "correct"], [
        [index + 1 if usable(row) else "", f"`{row['label']}`", number(row["ms_median"]), number(row["ms_iqr"], 2),
         number(row["tflops"]), percent(row.get("share_of_paired_matmul") or row.get("share_of_matmul_peak")),
         mebibytes(row["peak_memory_bytes"]), ", ".join(row["sdpa_backends"] or ["—"]), number(row["compile_s"], 2),
         verdict(row)]
        for index, row in enumerate(order)], "rlrrrrrlrl")
    contended = [r for r in rows if (r["cpu_utilization"] or 1.0) < metrics.CONTENDED_BELOW]
    return lines + (f"\n\nMeasured while other processes competed for the CPU (share of its threads' time this process "
                    f"got, below {metrics.CONTENDED_BELOW:.0%}): " + ", ".join(
                        f"`{r['label']}` {r['cpu_utilization']:.0%}" for r in contended)
                    + ". These times overstate the cost." if contended else "")


def sweep_table(result, mode="forward", metric="ms_median", labels=None):
    """One row field (`ms_median`, `tflops`, `share_of_paired_matmul`, `share_of_matmul_peak`, `peak_memory_bytes`
    in MiB) per class (of `labels`, default all; rows) against T (columns); a cell that is not a number says why."""
    units = {"ms_median": ("ms", number), "peak_memory_bytes": ("MiB", mebibytes), "tflops": ("TFLOP/s", number),
             "share_of_matmul_peak": ("% of matmul", percent), "share_of_paired_matmul": ("% of paired matmul", percent)}
    if metric not in units:
        raise ValueError(f"metric must be one of {', '.join(units)}, got metric={metric!r}")
    (unit, shown), rows = units[metric], [r for r in sweep_rows(result, mode) if labels is None or r["label"] in labels]
    lengths, cells = sorted({r["seq_len"] for r in rows}), {(r["label"], r["seq_len"]): r for r in rows}
    order = dict.fromkeys(r["label"] for r in rows)
    return table([f"implementation ({unit})"] + [f"T={t}" for t in lengths],
                 [[f"`{label}`"] + [status_cell(cells.get((label, t)), lambda row: shown(row[metric])) for t in lengths]
                  for label in (sorted(order, key=list(labels).index) if labels else order)])


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


def markdown_tables(result, include_sweep=False, shape=None):
    """A heading and `results_table` per mode at `shape` (`(batch, seq_len)`, default the headline); with
    `include_sweep`, the `sweep_table`s of time and memory per mode too."""
    config, parts = result["config"], []
    batch, seq_len = shape or (config["batch"], config["seq_len"])
    for mode in config["modes"]:
        parts += [f"#### {MODE_TITLES[mode]}, {result['dtype']}, B={batch}, T={seq_len}, d_model={config['d_model']}, "
                  f"{config['num_heads']} heads\n", results_table(result, mode, batch, seq_len), ""]
        for metric, what in (("ms_median", "median ms"), ("peak_memory_bytes", "peak MiB")) if include_sweep else ():
            if sweep_rows(result, mode):
                parts += [f"#### {MODE_TITLES[mode]}: {what} against T (B={config['sweep_batch']})\n",
                          sweep_table(result, mode, metric), ""]
    parts += [yardstick_note(result) + " Rows that are not `correct` have no rank."] if result.get("matmul_peak") else []
    return "\n".join(parts).rstrip() + "\n"


def fastest_cell(entry):
    """One `fastest` entry in words: the class that clearly leads and its median, or the tied classes (`leaders`) and
    their medians; then how much slower the first clearly slower class is."""
    if entry is None:
        return "—"
    best, after = entry["fastest"], entry["next"]
    times = sorted(row["ms_median"] for row in [best, *entry["tied"]])
    return (f"{leaders(entry)}: {number(times[0])}" + (f"–{number(times[-1])}" if len(times) > 1 else "") + " ms"
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
    """Median time per class at the run's `page_shape`, a panel per mode, error bars over the IQR; incorrect rows
    hatched red, rows with fewer K/V heads orange; failed and skipped rows left out."""
    from matplotlib.figure import Figure

    config, (batch, seq_len) = result["config"], page_shape(result)
    panels = [sorted((r for r in shape_rows(result, mode, batch, seq_len) if r["status"] == "ok"),
                     key=lambda r: -r["ms_median"]) for mode in config["modes"]]
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
        ax.set(title=f"{MODE_TITLES[mode]}, B={batch}, T={seq_len}",
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


# The classes a sweep chart draws in colour, one per kind of kernel, each with its own marker and line style (so that
# lines lying on each other stay apart): label: (name, colour, marker, line). The others grey, under one legend entry.
HIGHLIGHTED = {"split_heads": ("naive: (B, H, T, T) scores", "tab:red", "o", "-"),
               "tiled": ("FlashAttention's algorithm, in Python", "tab:green", "s", "--"),
               "sdpa_causal": ("SDPA, fused", "tab:blue", "^", ":"), "flex": ("FlexAttention", "tab:purple", "D", "-.")}


def sweep_figure(result, mode, series, guides, what):
    """Log-log lines against T: the `HIGHLIGHTED` classes in colour and named, the others grey; `guides`
    `[(power, label)]` draw c·T^power from the highlighted lines' geometric mean at the shortest T."""
    from matplotlib.figure import Figure

    ax = (fig := Figure(figsize=(7.5, 5), layout="constrained")).subplots()
    for label, points in sorted(series.items(), key=lambda item: item[0].split(" ")[0] in HIGHLIGHTED):
        name, color, marker, style = HIGHLIGHTED.get(label.split(" ")[0], (None, "0.72", None, "-"))
        ax.plot(*zip(*points), marker=marker, markersize=5, markerfacecolor="none" if marker == "o" else color,
                linestyle=style, linewidth=2 if name else 1, color=color, label=f"{name} ({label})" if name else None,
                zorder=3 if name else 2)
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
    return fig


def plot_time_vs_seq_len(result, mode="forward"):
    """Median time against T (log-log), with an O(T²) guide."""
    return sweep_figure(result, mode, sweep_series(result, mode, "ms_median"), [(2, "O(T²)")], "time per call (ms, median)")


def plot_memory_vs_seq_len(result, mode="forward", labels=None):
    """Peak memory of one call against T (log-log) of `labels` (default all), with O(T) and O(T²) guides from the
    data."""
    series = {label: [(t, v / 2**20) for t, v in points if v > 0]
              for label, points in sweep_series(result, mode, "peak_memory_bytes").items()
              if labels is None or label in labels}
    return sweep_figure(result, mode, {label: points for label, points in series.items() if points},
                        [(2, "O(T²)"), (1, "O(T)")], "peak memory of one call (MiB)")


def charts(result):
    """Time per class at the headline shape; time and memory against T for each mode the sweep measured."""
    device, found = title_suffix(result), {}
    found["bars"] = (plot_bars(result), f"median time per implementation at B={page_shape(result)[0]}, "
                                        f"T={page_shape(result)[1]}, {device}")
    for mode in (mode for mode in result["config"]["modes"] if sweep_series(result, mode, "ms_median")):
        found[f"time-{mode}"] = (plot_time_vs_seq_len(result, mode), f"{MODE_TITLES[mode]} time against T, {device}")
        found[f"memory-{mode}"] = (plot_memory_vs_seq_len(result, mode),
                                   f"{MODE_TITLES[mode]} peak memory against T, {device}")
    return found


def tables(result):
    """What the command line prints: the headline tables (and the sweep's, for the long profile)."""
    return markdown_tables(result, include_sweep=result["profile"] == "long")


def page_shape(result):
    """The shape a run's page section leads with: its headline `(batch, seq_len)`, except where the headline is the
    shortest length of the sweep (the long profile), then the longest length at which every class measured in every
    mode (the sweep batch)."""
    config, lengths = result["config"], sorted(result["config"]["seq_lens"] or [])
    if len(lengths) < 2 or (config["batch"], config["seq_len"]) != (config["sweep_batch"], lengths[0]):
        return config["batch"], config["seq_len"]
    labels = {row["label"] for row in result["rows"]}
    complete = [t for t in lengths if all({r["label"] for r in shape_rows(result, mode, config["sweep_batch"], t)
                                           if usable(r)} == labels for mode in config["modes"])]
    return config["sweep_batch"], max(complete, default=config["seq_len"])


def page(result, images):
    """One run on the Benchmarks page: its shape, the tables at `page_shape`, charts; the sweep's tables collapsed."""
    config, sweep_charts = result["config"], "\n\n".join(image for kind, image in images.items() if kind != "bars")
    batch, seq_len = page_shape(result)
    parts = [f"At batch {batch}, T = {seq_len}" + ("" if (batch, seq_len) == (config["batch"], config["seq_len"]) else
                                                   ", the longest length every class measured")
             + f"; the sweep runs batch {config['sweep_batch']}, T = {', '.join(map(str, config['seq_lens']))}.",
             re.sub(r"^#### (.*)$", r"**\1**", markdown_tables(result, shape=(batch, seq_len)), flags=re.MULTILINE),
             images.get("bars", ""), sweep_charts and collapsed("Time and peak memory against T (charts)", sweep_charts)]
    if any(len(fit["lengths"]) > 2 for fit in memory_slopes(result, "forward").values()):  # a fit of 3 lengths or more
        parts.append("Peak memory of one call against T, the growth fitted over T ≥ 2048 (below it the weights' "
                     "gradients and other fixed costs hide it):\n\n" + memory_slope_table(result))
    parts += [collapsed(f"{MODE_TITLES[mode]}: every length", "\n\n".join(sweep_table(result, mode, metric) for metric in (
        "ms_median", "peak_memory_bytes"))) for mode in config["modes"] if sweep_rows(result, mode)]
    return "\n\n".join(part.strip() for part in parts if part.strip())
