"""Turn a results file into Markdown tables, matplotlib charts and a provenance note.

Everything here reads the JSON written by `python -m attention.bench --out FILE` (or the dict that
`run_benchmark` returns); nothing is measured. matplotlib is imported only by the chart functions,
which build `matplotlib.figure.Figure`s without pyplot (no global state, any backend).

Typical use in an executed docs page:

    from attention.bench import render
    from attention.plotting import show
    result = render.load_result(render.find_results(device_type="cpu")[0])
    print(render.provenance_summary(result))
    print(render.markdown_tables(result))
    show(render.plot_time_vs_seq_len(result))
"""

import json
import math
from pathlib import Path

from attention.bench.harness import CONTENDED_BELOW
from attention.bench.provenance import REPO_DIR, SCHEMA_VERSION, source_files, source_hash

RESULTS_DIR = REPO_DIR / "docs" / "results"
MODE_TITLES = {"forward": "forward", "forward_backward": "forward + backward"}


# ---------------------------------------------------------------------------------------------
# Files and staleness
# ---------------------------------------------------------------------------------------------


def load_result(path):
    """Read a results file.

    Args:
        path: a JSON file written by the benchmark.

    Returns:
        The result dict.

    Raises:
        ValueError: the file has no `schema_version` or a newer one than this code reads.
    """
    result = json.loads(Path(path).read_text())
    version = result.get("schema_version") if isinstance(result, dict) else None
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version must be an int <= {SCHEMA_VERSION}, got {version!r}")
    return result


def find_results(directory=RESULTS_DIR, device_type=None):
    """Results files in `directory`, newest run first, optionally only those of one device type.

    Files are named `<device_type>-<description>.json` (e.g. `cpu-gpt2-small-float32.json`); the
    filter reads each file's `device_type` field, so a misnamed file is still classified right.

    Args:
        directory: where to look; default the repository's `docs/results/`.
        device_type: "cpu", "cuda", "mps" or None for all.

    Returns:
        A list of `Path`s.
    """
    found = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            result = load_result(path)
        except (ValueError, OSError):
            continue
        if device_type is None or result.get("device_type") == device_type:
            found.append((result.get("provenance", {}).get("date_utc", ""), path))
    return [path for _, path in sorted(found, key=lambda item: item[0], reverse=True)]


def changed_sources(result):
    """Package files added, removed or edited since the run: `["attention/causal/flex.py", ...]`."""
    recorded = result["provenance"].get("source_files", {})
    current = source_files()
    return sorted(path for path in set(recorded) | set(current) if recorded.get(path) != current.get(path))


def is_stale(result):
    """True when the `attention/` sources that produced `result` differ from the current ones.

    Compares the recorded `provenance.source_hash` with `source_hash()` of the code now.
    """
    return result["provenance"].get("source_hash") != source_hash()


# ---------------------------------------------------------------------------------------------
# Row selection and formatting
# ---------------------------------------------------------------------------------------------


def headline_rows(result, mode):
    """Rows of the headline shape (`config.batch`, `config.seq_len`) for `mode`."""
    config = result["config"]
    return shape_rows(result, mode, config["batch"], config["seq_len"])


def shape_rows(result, mode, batch, seq_len):
    """Rows of one mode at one `(batch, seq_len)`."""
    return [r for r in result["rows"] if r["mode"] == mode and r["batch"] == batch and r["seq_len"] == seq_len]


def sweep_rows(result, mode):
    """Rows of the sequence-length sweep (`config.sweep_batch`, each of `config.seq_lens`) for `mode`."""
    config = result["config"]
    lengths = set(config.get("seq_lens") or [])
    return [r for r in result["rows"]
            if r["mode"] == mode and r["batch"] == config["sweep_batch"] and r["seq_len"] in lengths]


def _ranked(row):
    return row["status"] == "ok" and row["correct"] is True


def _number(value, digits=3):
    if value is None:
        return "—"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{value:,.{decimals}f}"


def _mebibytes(value):
    return "—" if value is None else f"{value / 2**20:,.1f}"


def _verdict(row):
    if row["status"] != "ok":
        return f"{row['status']}: {row['reason']}"
    if row["correct"] is True:
        return "yes"
    if row["correct"] is False:
        error = row.get("max_abs_error")
        detail = f"max abs error {error:.2g}" if error is not None else (row.get("reason") or "")
        return f"**no** ({detail})"
    return "unchecked" + (f": {row['reason']}" if row.get("reason") else "")


def _escape(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def results_table(result, mode="forward", batch=None, seq_len=None):
    """One Markdown table: every implementation at one shape and mode.

    Ranked rows (ran and matched the reference) come first, fastest first; then incorrect, unchecked,
    failed and skipped rows, which get no rank.

    Args:
        result: a result dict.
        mode: "forward" or "forward_backward".
        batch, seq_len: the shape; default the headline shape.

    Returns:
        Markdown: rank, implementation, median ms, IQR, TFLOP/s, % of the run's matmul rate, peak
        memory (MiB), SDPA backend, compile time and whether the output matched the reference.
    """
    config = result["config"]
    batch = config["batch"] if batch is None else batch
    seq_len = config["seq_len"] if seq_len is None else seq_len
    rows = shape_rows(result, mode, batch, seq_len)
    ranked = sorted((r for r in rows if _ranked(r)), key=lambda r: r["ms_median"])
    others = [r for r in rows if not _ranked(r)]
    lines = ["| # | implementation | ms (median) | IQR ms | TFLOP/s | % of matmul | peak MiB | SDPA backend "
             "| compile s | correct |",
             "|--:|---|--:|--:|--:|--:|--:|---|--:|---|"]
    for rank, row in [(i + 1, r) for i, r in enumerate(ranked)] + [("", r) for r in others]:
        share = row.get("share_of_matmul_peak")
        lines.append("| " + " | ".join([
            str(rank), f"`{row['label']}`", _number(row["ms_median"]), _number(row["ms_iqr"], 2),
            _number(row["tflops"]), "—" if share is None else f"{share * 100:.0f}%",
            _mebibytes(row["peak_memory_bytes"]), ", ".join(row["sdpa_backends"] or ["—"]),
            _number(row["compile_s"], 2), _escape(_verdict(row)),
        ]) + " |")
    contended = [r for r in rows if (r.get("cpu_utilization") or 1.0) < CONTENDED_BELOW]
    if contended:
        shares = ", ".join(f"`{r['label']}` {r['cpu_utilization']:.0%}" for r in contended)
        lines.append("")
        lines.append(f"Measured while other processes competed for the CPU (share of its threads' time this "
                     f"process got, below {CONTENDED_BELOW:.0%}): {shares}. These times overstate the cost.")
    return "\n".join(lines)


def markdown_tables(result, include_sweep=False):
    """A heading and `results_table` per mode at the headline shape, optionally sweep tables too.

    Args:
        result: a result dict.
        include_sweep: also add `sweep_table` for time and memory per mode.

    Returns:
        Markdown text.
    """
    config = result["config"]
    peak = result.get("matmul_peak") or {}
    parts = []
    for mode in config["modes"]:
        parts.append(f"#### {MODE_TITLES.get(mode, mode)}, {result['dtype']}, B={config['batch']}, "
                     f"T={config['seq_len']}, d_model={config['d_model']}, {config['num_heads']} heads\n")
        parts.append(results_table(result, mode))
        parts.append("")
        if include_sweep and sweep_rows(result, mode):
            parts.append(f"#### {MODE_TITLES.get(mode, mode)}: median ms against T (B={config['sweep_batch']})\n")
            parts.append(sweep_table(result, mode, "ms_median"))
            parts.append("")
            parts.append(f"#### {MODE_TITLES.get(mode, mode)}: peak MiB against T (B={config['sweep_batch']})\n")
            parts.append(sweep_table(result, mode, "peak_memory_bytes"))
            parts.append("")
    if peak:
        parts.append(f"% of matmul = TFLOP/s / {_number(peak['tflops'])} TFLOP/s, the rate of a "
                     f"{peak['size']}×{peak['size']} {peak['dtype']} matmul measured in the same run. "
                     "Rows that are not `correct` have no rank.")
    return "\n".join(parts).rstrip() + "\n"


def sweep_table(result, mode="forward", metric="ms_median"):
    """Markdown table of one metric for every implementation (rows) against sequence length (columns).

    Args:
        result: a result dict.
        mode: "forward" or "forward_backward".
        metric: a row field: "ms_median", "tflops", "share_of_matmul_peak" or "peak_memory_bytes"
            (shown in MiB). Incorrect, failed and skipped cells show why instead of a number.

    Returns:
        Markdown text.
    """
    rows = sweep_rows(result, mode)
    lengths = sorted({r["seq_len"] for r in rows})
    labels = list(dict.fromkeys(r["label"] for r in rows))
    cells = {(r["label"], r["seq_len"]): r for r in rows}
    unit = {"ms_median": "ms", "peak_memory_bytes": "MiB", "tflops": "TFLOP/s", "share_of_matmul_peak": "% of matmul"}
    lines = [f"| implementation ({unit.get(metric, metric)}) | " + " | ".join(f"T={t}" for t in lengths) + " |",
             "|---|" + "--:|" * len(lengths)]
    for label in labels:
        values = []
        for t in lengths:
            row = cells.get((label, t))
            if row is None:
                values.append("")
            elif row["status"] != "ok":
                values.append("OOM" if row["reason"] == "out of memory" else row["status"])
            elif row["correct"] is False:
                values.append("incorrect")
            elif metric == "peak_memory_bytes":
                values.append(_mebibytes(row[metric]))
            elif metric == "share_of_matmul_peak":
                values.append("—" if row[metric] is None else f"{row[metric] * 100:.0f}%")
            else:
                values.append(_number(row[metric]))
        lines.append(f"| `{label}` | " + " | ".join(values) + " |")
    return "\n".join(lines)


def provenance_summary(result):
    """Markdown bullet list: what ran where, when, from which code, and whether that code is current.

    Args:
        result: a result dict.

    Returns:
        Markdown text; says plainly when the recorded run predates the current sources.
    """
    provenance, config = result["provenance"], result["config"]
    device = provenance["device"]
    git = provenance.get("git") or {}
    commit = git.get("commit")
    commit_text = "not a git checkout" if commit is None else f"`{commit[:12]}`" + (
        " with uncommitted changes under `attention/`" if git.get("dirty") else "")
    versions = [f"torch {provenance['torch']}"]
    if provenance.get("cuda"):
        versions.append(f"CUDA {provenance['cuda']}")
    if provenance.get("cudnn"):
        versions.append(f"cuDNN {provenance['cudnn']}")
    if device["type"] == "cpu":
        hardware = f"{device['name']}, {device['cpu_count']} logical cores, {device['torch_num_threads']} torch threads"
    else:
        hardware = f"{device['name']} (host CPU: {device['cpu']}, {device['cpu_count']} logical cores)"
    peak = result.get("matmul_peak") or {}
    lines = [
        f"- **Device**: {device['type']}: {hardware}",
        f"- **Software**: {', '.join(versions)}, Python {provenance['python']}, {provenance['platform']}",
        f"- **Run**: {provenance['date_utc']}, profile `{config['profile']}`, dtype `{result['dtype']}`, "
        f"{provenance.get('duration_s', '?')} s" + ("" if result.get("complete", True) else " (**incomplete run**)"),
        f"- **Command**: `{provenance['command']}`",
        f"- **Code**: commit {commit_text}; sources sha256 `{provenance['source_hash'][:16]}`",
    ]
    if peak:
        rates = [sample["tflops"] for sample in peak.get("samples", [])]
        spread = (f" (median of {len(rates)} samples through the run; lowest {_number(min(rates))}, "
                  f"highest {_number(max(rates))})" if len(rates) > 1 else "")
        lines.append(f"- **Matmul rate** ({peak['size']}² {peak['dtype']}, same run): "
                     f"{_number(peak['tflops'])} TFLOP/s{spread}")
    measured = [r["cpu_utilization"] for r in result["rows"] if r.get("cpu_utilization") is not None]
    if measured:
        contended = sum(share < CONTENDED_BELOW for share in measured)
        lines.append(f"- **CPU share**: median {sorted(measured)[len(measured) // 2]:.0%} of the threads' time; "
                     f"{contended} of {len(measured)} rows below {CONTENDED_BELOW:.0%} (other processes running)")
    load = provenance.get("load_average_start")
    if load:
        lines.append(f"- **Load average** (1/5/15 min) at start: {load}; at end: {provenance.get('load_average_end')}")
    if is_stale(result):
        changed = changed_sources(result)
        shown = ", ".join(f"`{path}`" for path in changed[:8])
        if len(changed) > 8:
            shown += f" and {len(changed) - 8} more"
        lines.append(f"- **Stale**: this run predates the current code; changed since: {shown}")
    else:
        lines.append("- **Current**: recorded with the current `attention/` sources")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Charts
# ---------------------------------------------------------------------------------------------


def _title_suffix(result):
    device = result["provenance"]["device"]
    return f"{device['name']}, {result['dtype']}"


def _shape_panels(result, batch, seq_len, keep, sort_key):
    """One bar-chart panel per mode at one shape: the shared layout of `plot_bars` and `plot_share`.

    Args:
        result: a result dict.
        batch, seq_len: the shape; None means the headline shape.
        keep: which rows of the shape to draw.
        sort_key: the rows' order, bottom bar first.

    Returns:
        `(batch, seq_len, fig, panels)` with the resolved shape, a figure tall enough for the longest
        panel, and `panels` a list of `(ax, mode, rows)`.
    """
    from matplotlib.figure import Figure

    config = result["config"]
    batch = config["batch"] if batch is None else batch
    seq_len = config["seq_len"] if seq_len is None else seq_len
    modes = config["modes"]
    rows_per_mode = [sorted(filter(keep, shape_rows(result, mode, batch, seq_len)), key=sort_key) for mode in modes]
    height = max(2.5, 0.32 * max((len(rows) for rows in rows_per_mode), default=1) + 1.2)
    fig = Figure(figsize=(6.0 * len(modes), height))
    axes = fig.subplots(1, len(modes), squeeze=False)
    return batch, seq_len, fig, list(zip(axes[0], modes, rows_per_mode))


def plot_bars(result, batch=None, seq_len=None):
    """Horizontal bars of median time per implementation at one shape, one panel per mode.

    Incorrect rows are drawn hatched in red and labelled; failed and skipped rows are left out.
    Error bars span the interquartile range.

    Args:
        result: a result dict.
        batch, seq_len: the shape; default the headline shape.

    Returns:
        A matplotlib `Figure`.
    """
    config = result["config"]
    batch, seq_len, fig, panels = _shape_panels(result, batch, seq_len, keep=lambda r: r["status"] == "ok",
                                                sort_key=lambda r: -r["ms_median"])
    for ax, mode, rows in panels:
        labels = [r["label"] + ("  (incorrect)" if r["correct"] is False else "") for r in rows]
        medians = [r["ms_median"] for r in rows]
        errors = [[r["ms_median"] - r["ms_q1"] for r in rows], [r["ms_q3"] - r["ms_median"] for r in rows]]
        colors = ["tab:red" if r["correct"] is False else "tab:blue" for r in rows]
        bars = ax.barh(labels, medians, xerr=errors, color=colors, capsize=2)
        for bar, row in zip(bars, rows):
            if row["correct"] is False:
                bar.set_hatch("//")
        ax.set_xlabel("time per call (ms, median; bars: IQR)")
        ax.set_title(f"{MODE_TITLES.get(mode, mode)}, B={batch}, T={seq_len}")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"Causal self-attention, d_model={config['d_model']}, {config['num_heads']} heads: "
                 f"{_title_suffix(result)}")
    fig.tight_layout()
    return fig


def plot_share(result, batch=None, seq_len=None):
    """Horizontal bars of each implementation's share of the run's matmul rate at one shape, per mode.

    The share is useful TFLOP/s over the TFLOP/s of the square matmul timed in the same run
    (`share_of_matmul_peak`); a dashed line marks 100%. Only correct rows are drawn.

    Args:
        result: a result dict.
        batch, seq_len: the shape; default the headline shape.

    Returns:
        A matplotlib `Figure`.
    """
    batch, seq_len, fig, panels = _shape_panels(
        result, batch, seq_len, keep=lambda r: _ranked(r) and r.get("share_of_matmul_peak") is not None,
        sort_key=lambda r: r["share_of_matmul_peak"])
    rate = (result.get("matmul_peak") or {}).get("tflops")
    for ax, mode, rows in panels:
        shares = [100 * r["share_of_matmul_peak"] for r in rows]
        bars = ax.barh([r["label"] for r in rows], shares, color="tab:green")
        ax.bar_label(bars, labels=[f"{share:.0f}%" for share in shares], padding=2, fontsize=7)
        ax.axvline(100, color="k", linestyle="--", linewidth=1, alpha=0.6)
        ax.set_xlim(0, max([110.0] + [share * 1.12 for share in shares]))
        ax.set_xlabel("useful TFLOP/s as % of the same run's matmul rate")
        ax.set_title(f"{MODE_TITLES.get(mode, mode)}, B={batch}, T={seq_len}")
        ax.grid(axis="x", alpha=0.3)
    rate_text = f" (matmul: {_number(rate)} TFLOP/s)" if rate else ""
    fig.suptitle(f"Share of the matmul rate{rate_text}: {_title_suffix(result)}")
    fig.tight_layout()
    return fig


def _sweep_series(result, mode, metric):
    series = {}
    for row in sweep_rows(result, mode):
        if row["status"] == "ok" and row["correct"] is not False and row[metric] is not None:
            series.setdefault(row["label"], []).append((row["seq_len"], row[metric]))
    return {label: sorted(points) for label, points in series.items()}


MARKERS = "osD^v<>pPX*h"


def _plot_series(ax, series):
    """One line per implementation; 20 colours and 11 markers keep up to 20 lines apart."""
    import matplotlib

    colors = matplotlib.colormaps["tab20"].colors
    for index, (label, points) in enumerate(series.items()):
        ax.plot(*zip(*points), marker=MARKERS[index % len(MARKERS)], markersize=4, linewidth=1.3,
                color=colors[index % len(colors)], label=label)


def _guide(ax, series, power, label, scale=1.0, linestyle="--"):
    """Dashed line c*T^power through the geometric mean of the values at the longest T."""
    last = [points[-1] for points in series.values() if points]
    if not last:
        return
    longest = max(t for t, _ in last)
    at_longest = [v for t, v in last if t == longest and v > 0]
    if not at_longest:
        return
    anchor = math.exp(sum(math.log(v) for v in at_longest) / len(at_longest)) * scale
    shortest = min(t for points in series.values() for t, _ in points)
    lengths = [shortest, longest]
    ax.plot(lengths, [anchor * (t / longest) ** power for t in lengths], color="k", linestyle=linestyle, linewidth=1,
            alpha=0.6, label=label)


def plot_time_vs_seq_len(result, mode="forward"):
    """Median time against sequence length (log-log) for every implementation, with an O(T²) guide.

    Args:
        result: a result dict.
        mode: "forward" or "forward_backward".

    Returns:
        A matplotlib `Figure`.
    """
    from matplotlib.figure import Figure

    series = _sweep_series(result, mode, "ms_median")
    fig = Figure(figsize=(7.5, 5))
    ax = fig.subplots()
    _plot_series(ax, series)
    _guide(ax, series, 2, "O(T²)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("time per call (ms, median)")
    ax.set_title(f"{MODE_TITLES.get(mode, mode)} time against T, B={result['config']['sweep_batch']}: "
                 f"{_title_suffix(result)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def plot_memory_vs_seq_len(result, mode="forward"):
    """Peak memory of one call against sequence length (log-log), with O(T) and O(T²) guides.

    Args:
        result: a result dict.
        mode: "forward" or "forward_backward".

    Returns:
        A matplotlib `Figure`.
    """
    from matplotlib.figure import Figure

    series = {label: [(t, v / 2**20) for t, v in points if v > 0]
              for label, points in _sweep_series(result, mode, "peak_memory_bytes").items()}
    series = {label: points for label, points in series.items() if points}
    fig = Figure(figsize=(7.5, 5))
    ax = fig.subplots()
    _plot_series(ax, series)
    _guide(ax, series, 2, "O(T²)", scale=2.0)
    _guide(ax, series, 1, "O(T)", scale=0.5, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("peak memory of one call (MiB)")
    ax.set_title(f"{MODE_TITLES.get(mode, mode)} peak memory against T, B={result['config']['sweep_batch']}: "
                 f"{_title_suffix(result)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
