"""Turn a results file into Markdown tables, matplotlib charts and a provenance note.

Everything here reads the JSON written by `python -m attention.bench --out FILE` (or the dict that
`run_benchmark` returns); nothing is measured. matplotlib is imported only by the chart functions,
which build `matplotlib.figure.Figure`s without pyplot (no global state, any backend).

Typical use in an executed docs page:

    from attention.bench import render
    from attention.display import show
    result = render.load_result(render.find_results(device_type="cpu")[0])
    print(render.provenance_summary(result))
    print(render.markdown_tables(result))
    show(render.plot_time_vs_seq_len(result))
"""

import dataclasses
import json
import math
from pathlib import Path

from attention.bench.provenance import REPO_DIR, source_files, source_hash
from attention.bench.schema import CONTENDED_BELOW, ROW_FIELDS, SCHEMA_VERSION

RESULTS_DIR = REPO_DIR / "docs" / "results"
MODE_TITLES = {"forward": "forward", "forward_backward": "forward + backward"}


def load_result(path):
    """Read a results file (a JSON file written by the benchmark) into a result dict.

    Each row is given exactly the fields of `schema.Row`, so files of older schema versions read like
    new ones: fields since removed are dropped, fields since added are None.

    Raises:
        ValueError: the file has no `schema_version` or a newer one than this code reads.
    """
    result = json.loads(Path(path).read_text())
    version = result.get("schema_version") if isinstance(result, dict) else None
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version must be an int <= {SCHEMA_VERSION}, got {version!r}")
    missing = [key for key in TOP_LEVEL if key not in result]
    if missing:
        raise ValueError(f"{path}: missing top-level field(s): {', '.join(missing)}")
    if not isinstance(result["rows"], list) or not all(isinstance(row, dict) for row in result["rows"]):
        raise ValueError(f"{path}: rows must be a list of objects")
    result["rows"] = [{name: row.get(name) for name in ROW_FIELDS} for row in result["rows"]]
    return result


def find_results(directory=RESULTS_DIR, device_type=None):
    """Results files in `directory` (default `docs/results/`), newest run first, as `Path`s.

    Files are named `<device_type>-<description>.json` (e.g. `cpu-gpt2-small-float32.json`); the
    `device_type` filter ("cpu", "cuda", "mps" or None for all) reads each file's `device_type`
    field, so a misnamed file is still classified right.
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


TOP_LEVEL = ("schema_version", "complete", "device_type", "dtype", "provenance", "config", "matmul_peak", "rows",
             "rankings")
PROVENANCE = ("date_utc", "command", "git", "source_hash", "source_files", "python", "platform", "torch", "device")
DEVICE = ("type", "name", "cpu_count")
CONFIG = ("device", "dtype", "modes", "batch", "seq_len", "sweep_batch", "seq_lens", "d_model", "num_heads", "profile")


def validate_result(result):
    """Every problem that makes `result` unfit to publish, as sentences; `[]` for a valid results file.

    Checks the schema version and fields, complete provenance, and that every row is consistent:
    known mode and status, quartiles around the median, TFLOP/s and the share of the matmul rate
    recomputed from the row's own numbers, correct rows only in the rankings and in time order.
    A run recorded with older sources is valid (the pages mark it as such: `is_stale`).
    """
    problems = []
    missing = [key for key in TOP_LEVEL if key not in result]
    if missing:
        return [f"missing top-level field(s): {', '.join(missing)}"]
    if result["complete"] is not True:
        problems.append("complete is not true: the run did not finish (a checkpoint written while it ran)")
    if result["schema_version"] != SCHEMA_VERSION:
        problems.append(f"schema_version is {result['schema_version']!r}; this code reads {SCHEMA_VERSION}")
    provenance, config = result["provenance"], result["config"]
    problems += [f"provenance lacks {key!r}" for key in PROVENANCE if provenance.get(key) in (None, "")]
    device = provenance.get("device") or {}
    problems += [f"provenance.device lacks {key!r}" for key in DEVICE if device.get(key) in (None, "")]
    problems += [f"config lacks {key!r}" for key in CONFIG if key not in config]
    if device.get("type") != result["device_type"]:
        problems.append(f"device_type {result['device_type']!r} differs from provenance.device.type {device.get('type')!r}")
    if config.get("dtype") != result["dtype"]:
        problems.append(f"dtype {result['dtype']!r} differs from config.dtype {config.get('dtype')!r}")
    peak = (result["matmul_peak"] or {}).get("tflops")
    if "decode" in result:
        problems += validate_decode(result["decode"] or {})
    elif not result["rows"]:
        problems.append("no rows")
    for number, row in enumerate(result["rows"]):
        where = f"row {number} ({row.get('label')}, {row.get('mode')}, B={row.get('batch')}, T={row.get('seq_len')})"
        absent = [key for key in ROW_FIELDS if key not in row]
        if absent:
            problems.append(f"{where}: missing field(s) {', '.join(absent)}")
            continue
        if row["mode"] not in MODE_TITLES:
            problems.append(f"{where}: unknown mode {row['mode']!r}")
        if row["status"] not in ("ok", "skipped", "failed"):
            problems.append(f"{where}: unknown status {row['status']!r}")
        if row["status"] != "ok":
            continue
        times = [row[key] for key in ("ms_min", "ms_q1", "ms_median", "ms_q3", "ms_max")]
        if any(not isinstance(t, (int, float)) or t <= 0 for t in times):
            problems.append(f"{where}: status ok but times {times} are not all positive numbers")
            continue
        if not times == sorted(times):
            problems.append(f"{where}: times are not ordered min <= q1 <= median <= q3 <= max: {times}")
        if row["flops_total"] != row["flops_attention"] + row["flops_projections"]:
            problems.append(f"{where}: flops_total is not flops_attention + flops_projections")
        expected = row["flops_total"] / (row["ms_median"] / 1e3) / 1e12
        if row["tflops"] is None or not math.isclose(row["tflops"], expected, rel_tol=1e-3):
            problems.append(f"{where}: tflops {row['tflops']} does not match flops_total / ms_median = {expected:.4g}")
        elif peak and (row["share_of_matmul_peak"] is None
                       or not math.isclose(row["share_of_matmul_peak"], row["tflops"] / peak, rel_tol=1e-3)):
            problems.append(f"{where}: share_of_matmul_peak {row['share_of_matmul_peak']} is not tflops / "
                            f"matmul_peak.tflops = {row['tflops'] / peak:.4g}")
        paired = row["matmul_tflops_paired"]
        if paired is not None and (row["share_of_paired_matmul"] is None or row["tflops"] is None
                                   or not math.isclose(row["share_of_paired_matmul"], row["tflops"] / paired,
                                                       rel_tol=1e-3)):
            problems.append(f"{where}: share_of_paired_matmul {row['share_of_paired_matmul']} is not tflops / "
                            f"matmul_tflops_paired = {(row['tflops'] or 0) / paired:.4g}")
        if row["correct"] not in (True, False, None):
            problems.append(f"{where}: correct must be true, false or null, got {row['correct']!r}")
    if "block_sparse" in result:
        problems += validate_block_sparse(result["block_sparse"] or {})
    for ranking in result["rankings"]:
        shape = (ranking.get("mode"), ranking.get("batch"), ranking.get("seq_len"))
        rows = [r for r in result["rows"] if (r.get("mode"), r.get("batch"), r.get("seq_len")) == shape
                and r.get("status") == "ok" and r.get("correct") is True]
        order = [r["label"] for r in sorted(rows, key=lambda r: r["ms_median"])]
        if ranking.get("order") != order:
            problems.append(f"ranking {shape}: order {ranking.get('order')} is not the correct rows by median time {order}")
    return problems


def check_file(path):
    """Everything `python -m attention.bench --validate FILE` says about a results file.

    Returns `{"result", "problems", "changed"}`: the loaded result (None if it cannot be read), the
    problems that make it unfit to publish (`validate_result`, or why it cannot be read), and the
    package files changed since it was recorded (a run with older sources is valid, and said to be).
    """
    try:
        result = load_result(path)
    except (OSError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        return {"result": None, "problems": [f"cannot be read: {str(error).removeprefix(f'{path}: ')}"], "changed": []}
    except (KeyError, TypeError, AttributeError) as error:
        return {"result": None, "problems": [f"is not a results file: {type(error).__name__}: {error}"], "changed": []}
    problems = validate_result(result)
    changed = [] if problems else changed_sources(result)
    return {"result": result, "problems": problems, "changed": changed}


def check_report(path, checked):
    """`check_file`'s verdict on `path` in words, as the validator prints it."""
    result, problems, changed = checked["result"], checked["problems"], checked["changed"]
    if problems:
        return f"{path}: NOT valid, {len(problems)} problem(s):\n" + "\n".join(f"  - {problem}" for problem in problems)
    device = result["provenance"]["device"]
    rows = result["decode"]["rows"] if "decode" in result else result["rows"]
    ok = sum(row["status"] == "ok" for row in rows)
    lines = [f"{path}: valid: {device['type']} ({device['name']}), {result['dtype']}, profile "
             f"{result['config']['profile']!r}, {len(rows)} rows ({ok} measured), recorded "
             f"{result['provenance']['date_utc']}"]
    if changed:
        lines.append(f"  recorded with older sources ({len(changed)} package file(s) changed since: "
                     f"{', '.join(changed[:6])}{' ...' if len(changed) > 6 else ''}); the pages mark it as such")
    else:
        lines.append("  recorded with the current attention/ sources")
    return "\n".join(lines)


def changed_sources(result):
    """Package files added, removed or edited since the run: `["attention/causal/flex.py", ...]`."""
    recorded = result["provenance"].get("source_files", {})
    current = source_files()
    return sorted(path for path in set(recorded) | set(current) if recorded.get(path) != current.get(path))


def is_stale(result):
    """True when the recorded `provenance.source_hash` differs from `source_hash()` of the code now."""
    return result["provenance"].get("source_hash") != source_hash()


def profile_summary(config):
    """A run's sizes and timing in words, from its config (a results file's `config`, or a `BenchConfig`
    as a dict), so the pages cannot drift from what ran."""
    lengths = ", ".join(str(t) for t in config["seq_lens"] or ())
    shape = (f"batch {config['sweep_batch']}, `T` = {lengths}" if lengths
             else f"batch {config['batch']}, `T` = {config['seq_len']}")
    return (f"{shape}, d_model {config['d_model']}, {config['num_heads']} heads, timing of at least "
            f"{config['min_run_time']} s and {config['min_repeats']} repeats per row")


def quick_profile_summary():
    """The quick profile in words, from `quick_config` itself."""
    from attention.bench.harness import quick_config

    return profile_summary(dataclasses.asdict(quick_config()))


def row_fields_table():
    """Markdown table of the row fields and their meanings (`schema.Row`), for docs/benchmark-schema.md."""
    lines = ["| Field | Meaning |", "|---|---|"] + [f"| `{name}` | {text} |" for name, text in ROW_FIELDS.items()]
    return "\n".join(lines)


def _shape(result, batch, seq_len):
    """`(batch, seq_len)`, each defaulting to the headline shape's."""
    config = result["config"]
    return config["batch"] if batch is None else batch, config["seq_len"] if seq_len is None else seq_len


def shape_rows(result, mode, batch=None, seq_len=None):
    """Rows of one mode at one `(batch, seq_len)`; default the headline shape."""
    batch, seq_len = _shape(result, batch, seq_len)
    return [r for r in result["rows"] if r["mode"] == mode and r["batch"] == batch and r["seq_len"] == seq_len]


def sweep_rows(result, mode):
    """Rows of the sequence-length sweep (`config.sweep_batch`, each of `config.seq_lens`) for `mode`."""
    config = result["config"]
    lengths = set(config.get("seq_lens") or [])
    return [r for r in result["rows"]
            if r["mode"] == mode and r["batch"] == config["sweep_batch"] and r["seq_len"] in lengths]


def _ranked(row):
    return row["status"] == "ok" and row["correct"] is True


def number(value, digits=3):
    if value is None:
        return "—"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def _mebibytes(value):
    return "—" if value is None else f"{value / 2**20:,.1f}"


def _percent(share):
    return "—" if share is None else f"{share * 100:.0f}%"


def matmul_share(row):
    """The row's useful TFLOP/s as a share of the matmul rate: against the matmul timed beside it
    (`share_of_paired_matmul`) where the run has one, else against the run-level rate (runs recorded
    before the paired yardstick)."""
    paired = row.get("share_of_paired_matmul")
    return paired if paired is not None else row.get("share_of_matmul_peak")


def _verdict(row):
    if row["status"] != "ok":
        return f"{row['status']}: {row['reason']}"
    if row["correct"] is True:
        return "yes"
    if row["correct"] is False:
        error = row["max_abs_error"]
        return f"**no** ({f'max abs error {error:.2g}' if error is not None else (row['reason'] or '')})"
    return "unchecked" + (f": {row['reason']}" if row["reason"] else "")


def results_table(result, mode="forward", batch=None, seq_len=None):
    """One Markdown table: every implementation at one shape (default the headline shape) and mode.

    Columns: rank, implementation, median ms, IQR, TFLOP/s, % of the run's matmul rate, peak memory
    (MiB), SDPA backend, compile time and whether the output matched the reference. Ranked rows (ran
    and matched the reference) come first, fastest first; then incorrect, unchecked, failed and
    skipped rows, which get no rank. A note follows when rows were measured on a contended CPU.
    """
    rows = shape_rows(result, mode, batch, seq_len)
    ranked = sorted((r for r in rows if _ranked(r)), key=lambda r: r["ms_median"])
    lines = ["| # | implementation | ms (median) | IQR ms | TFLOP/s | % of matmul | peak MiB | SDPA backend "
             "| compile s | correct |",
             "|--:|---|--:|--:|--:|--:|--:|---|--:|---|"]
    for rank, row in [(i + 1, r) for i, r in enumerate(ranked)] + [("", r) for r in rows if not _ranked(r)]:
        verdict = _verdict(row).replace("|", "\\|").replace("\n", " ")
        lines.append("| " + " | ".join([
            str(rank), f"`{row['label']}`", number(row["ms_median"]), number(row["ms_iqr"], 2),
            number(row["tflops"]), _percent(matmul_share(row)), _mebibytes(row["peak_memory_bytes"]),
            ", ".join(row["sdpa_backends"] or ["—"]), number(row["compile_s"], 2), verdict]) + " |")
    contended = [r for r in rows if (r["cpu_utilization"] or 1.0) < CONTENDED_BELOW]
    if contended:
        shares = ", ".join(f"`{r['label']}` {r['cpu_utilization']:.0%}" for r in contended)
        lines += ["", f"Measured while other processes competed for the CPU (share of its threads' time this "
                      f"process got, below {CONTENDED_BELOW:.0%}): {shares}. These times overstate the cost."]
    return "\n".join(lines)


def markdown_tables(result, include_sweep=False):
    """A heading and `results_table` per mode at the headline shape; with `include_sweep`, also the
    `sweep_table`s of time and memory per mode."""
    config = result["config"]
    peak = result.get("matmul_peak") or {}
    parts = []
    for mode in config["modes"]:
        title = MODE_TITLES.get(mode, mode)
        parts += [f"#### {title}, {result['dtype']}, B={config['batch']}, T={config['seq_len']}, "
                  f"d_model={config['d_model']}, {config['num_heads']} heads\n", results_table(result, mode), ""]
        if include_sweep and sweep_rows(result, mode):
            for metric, what in (("ms_median", "median ms"), ("peak_memory_bytes", "peak MiB")):
                parts += [f"#### {title}: {what} against T (B={config['sweep_batch']})\n",
                          sweep_table(result, mode, metric), ""]
    if peak:
        parts.append(yardstick_note(result) + " Rows that are not `correct` have no rank.")
    return "\n".join(parts).rstrip() + "\n"


def yardstick_note(result):
    """What "% of matmul" means in this run's tables, in one or two sentences."""
    peak = result.get("matmul_peak") or {}
    paired = peak.get("paired")
    matmul = f"a {peak['size']}×{peak['size']} {peak['dtype']} matmul"
    if not paired:
        return f"% of matmul = TFLOP/s / {number(peak['tflops'])} TFLOP/s, the rate of {matmul} measured in the same run."
    return (f"% of matmul = the row's TFLOP/s over the rate of {matmul} timed in blocks interleaved with the row's "
            f"own (matmul, row, matmul, ...), so both saw the same machine. That rate ranged from "
            f"{number(paired['lowest_tflops'])} to {number(paired['highest_tflops'])} TFLOP/s over the run's "
            f"{paired['rows']} rows (median {number(paired['median_tflops'])}).")


def tied(row, other):
    """True when the interquartile ranges of two rows' times overlap: the run cannot tell them apart."""
    return row["ms_q1"] <= other["ms_q3"] and other["ms_q1"] <= row["ms_q3"]


def slower_by(row, fastest_row):
    """How much slower `row` is than `fastest_row`, as "+14%"."""
    return f"+{(row['ms_median'] / fastest_row['ms_median'] - 1) * 100:.0f}%"


def fewer_kv_heads(row):
    """True for a grouped-query or multi-query row: fewer K/V heads than query heads, so another model
    (smaller K/V projections, other weights) than the multi-head classes it is timed beside."""
    return row.get("num_kv_heads") is not None and row["num_kv_heads"] != row["num_heads"]


def chart_label(row):
    """A row's name in charts: its label, with the K/V heads for grouped-query rows (another model)."""
    return row["label"] + (f" ({row['num_kv_heads']} K/V)" if fewer_kv_heads(row) else "")


def fastest(result):
    """Per measured shape: the fastest correct row, the rows tied with it, and the next one.

    A list of dicts (mode, batch, seq_len, compiled, fastest, tied, next) in the run's order. Tied: the
    row's interquartile range overlaps the fastest's (its first quartile is at or below the fastest's
    third quartile), so the run cannot tell the two apart. Rows measured one after another on a machine
    whose speed drifts can differ by more than their IQRs; read small gaps as ties too. Only classes
    that compute the same function compete: rows with fewer K/V heads (`fewer_kv_heads`) are left out.
    """
    groups = {}
    for row in result["rows"]:
        if _ranked(row) and not fewer_kv_heads(row):
            groups.setdefault((row["mode"], row["batch"], row["seq_len"], row["compiled"]), []).append(row)
    summary = []
    for (mode, batch, seq_len, compiled), rows in groups.items():
        rows = sorted(rows, key=lambda r: r["ms_median"])
        best = rows[0]
        ties = [r for r in rows[1:] if tied(r, best)]
        rest = [r for r in rows[1:] if r not in ties]
        summary.append(dict(mode=mode, batch=batch, seq_len=seq_len, compiled=compiled, fastest=best, tied=ties,
                            next=rest[0] if rest else None))
    return summary


def fastest_table(result):
    """Markdown table of `fastest` for one result: one line per shape, one column per mode.

    Each cell names the fastest correct row and its median, the rows tied with it, and how much
    slower the next one is.
    """
    entries = fastest(result)
    modes = list(dict.fromkeys((e["mode"], e["compiled"]) for e in entries))
    shapes = list(dict.fromkeys((e["batch"], e["seq_len"]) for e in entries))
    cells = {(e["batch"], e["seq_len"], e["mode"], e["compiled"]): e for e in entries}
    titles = [MODE_TITLES.get(mode, mode) + (", compiled" if compiled else "") for mode, compiled in modes]
    lines = ["| B | T | " + " | ".join(titles) + " |", "|--:|--:|" + "---|" * len(modes)]
    for batch, seq_len in shapes:
        row = []
        for mode, compiled in modes:
            entry = cells.get((batch, seq_len, mode, compiled))
            if entry is None:
                row.append("—")
                continue
            best, after = entry["fastest"], entry["next"]
            text = f"`{best['label']}` {number(best['ms_median'])} ms"
            if entry["tied"]:
                text += "; tied: " + ", ".join(f"`{r['label']}` {number(r['ms_median'])}" for r in entry["tied"])
            if after is not None:
                text += f"; next `{after['label']}` {slower_by(after, best)}"
            row.append(text)
        lines.append(f"| {batch} | {seq_len} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def devices_line(results):
    """One sentence naming every device the results come from, so a reader sees how narrow the data is."""
    names = sorted({f"{r['provenance']['device']['name']} ({r['provenance']['device']['type']}, "
                    f"{r['provenance']['device']['cpu_count']} logical cores)" for _, r in results})
    if not names:
        return "No results recorded yet."
    return (f"All numbers on this page so far come from {'one device' if len(names) == 1 else f'{len(names)} devices'}: "
            + "; ".join(names) + ".")


def sweep_table(result, mode="forward", metric="ms_median"):
    """Markdown table of one row field for every implementation (rows) against sequence length (columns).

    `metric` is "ms_median", "tflops", "share_of_paired_matmul", "share_of_matmul_peak" or
    "peak_memory_bytes" (shown in MiB);
    incorrect, failed and skipped cells show why instead of a number.
    """
    if metric not in ROW_FIELDS:
        raise ValueError(f"metric must be a row field such as 'ms_median', got metric={metric!r}")
    rows = sweep_rows(result, mode)
    lengths = sorted({r["seq_len"] for r in rows})
    cells = {(r["label"], r["seq_len"]): r for r in rows}
    unit = {"ms_median": "ms", "peak_memory_bytes": "MiB", "tflops": "TFLOP/s", "share_of_matmul_peak": "% of matmul",
            "share_of_paired_matmul": "% of paired matmul"}
    shown = {"peak_memory_bytes": _mebibytes, "share_of_matmul_peak": _percent,
             "share_of_paired_matmul": _percent}.get(metric, number)
    lines = [f"| implementation ({unit.get(metric, metric)}) | " + " | ".join(f"T={t}" for t in lengths) + " |",
             "|---|" + "--:|" * len(lengths)]
    for label in dict.fromkeys(r["label"] for r in rows):
        values = []
        for row in (cells.get((label, t)) for t in lengths):
            if row is None:
                values.append("")
            elif row["status"] != "ok":
                values.append("OOM" if row["reason"] == "out of memory" else row["status"])
            else:
                values.append("incorrect" if row["correct"] is False else shown(row[metric]))
        lines.append(f"| `{label}` | " + " | ".join(values) + " |")
    return "\n".join(lines)


def provenance_summary(result):
    """Markdown bullet list: what ran where, when, from which code, and whether that code is current
    (it says plainly when the recorded run predates the current sources)."""
    provenance, config = result["provenance"], result["config"]
    device = provenance["device"]
    git = provenance.get("git") or {}
    commit = git.get("commit")
    commit_text = "not a git checkout" if commit is None else f"`{commit[:12]}`" + (
        " with uncommitted changes under `attention/`" if git.get("dirty") else "")
    versions = [f"torch {provenance['torch']}"] + [f"{name} {provenance[key]}" for key, name in
                                                   (("cuda", "CUDA"), ("cudnn", "cuDNN")) if provenance.get(key)]
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
        spread = (f" (median of {len(rates)} samples through the run; lowest {number(min(rates))}, "
                  f"highest {number(max(rates))})" if len(rates) > 1 else "")
        lines.append(f"- **Matmul rate** ({peak['size']}² {peak['dtype']}, same run): "
                     f"{number(peak['tflops'])} TFLOP/s{spread}")
        paired = peak.get("paired")
        if paired:
            lines.append(f"- **Paired matmul rate** (timed beside each row, the yardstick of \"% of matmul\"): "
                         f"median {number(paired['median_tflops'])} TFLOP/s over {paired['rows']} rows, lowest "
                         f"{number(paired['lowest_tflops'])}, highest {number(paired['highest_tflops'])}")
    bandwidth = (result.get("decode") or {}).get("bandwidth")
    if bandwidth:
        reads = [sample["read_gbps"] for sample in bandwidth["samples"]]
        lines.append(f"- **Read bandwidth** (a sum over {bandwidth['bytes'] / 2**20:,.0f} MiB, same run): median "
                     f"{bandwidth['read_gbps']:.1f} GB/s of {len(reads)} samples (lowest {min(reads):.1f}, highest "
                     f"{max(reads):.1f}); a copy of the same size: {bandwidth['copy_gbps']:.1f} GB/s counting reads "
                     f"and writes. Each row's share is against the read rate timed beside it")
        matmul = (result.get("decode") or {}).get("matmul")
        if matmul:
            lines.append(f"- **Matmul rate** ({matmul['size']}² {result['dtype']}, same run): "
                         f"{number(matmul['tflops'])} TFLOP/s, median of the samples taken with the bandwidth's")
    rows = result["decode"]["rows"] if "decode" in result else result["rows"]
    measured = [r["cpu_utilization"] for r in rows if r.get("cpu_utilization") is not None]
    if measured:
        contended = sum(share < CONTENDED_BELOW for share in measured)
        lines.append(f"- **CPU share**: median {sorted(measured)[len(measured) // 2]:.0%} of the threads' time; "
                     f"{contended} of {len(measured)} rows below {CONTENDED_BELOW:.0%} (other processes running)")
    load = provenance.get("load_average_start")
    if load:
        lines.append(f"- **Load average** (1/5/15 min) at start: {load}; at end: {provenance.get('load_average_end')}")
    if is_stale(result):
        changed = changed_sources(result)
        shown = ", ".join(f"`{path}`" for path in changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8
                                                                  else "")
        lines.append(f"- **Stale**: this run predates the current code; changed since: {shown}")
    else:
        lines.append("- **Current**: recorded with the current `attention/` sources")
    return "\n".join(lines) + "\n"


def _title_suffix(result):
    return f"{result['provenance']['device']['name']}, {result['dtype']}"


def _shape_panels(result, batch, seq_len, keep, sort_key):
    """One titled bar-chart panel per mode at one shape (default the headline shape), the layout of
    `plot_bars` and `plot_share`: a figure tall enough for the longest panel, and `(ax, rows)` per
    panel with the rows that `keep` accepts, bottom bar first by `sort_key`."""
    from matplotlib.figure import Figure

    batch, seq_len = _shape(result, batch, seq_len)
    modes = result["config"]["modes"]
    rows_per_mode = [sorted(filter(keep, shape_rows(result, mode, batch, seq_len)), key=sort_key) for mode in modes]
    height = max(2.5, 0.32 * max((len(rows) for rows in rows_per_mode), default=1) + 1.2)
    fig = Figure(figsize=(6.0 * len(modes), height))
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    for ax, mode in zip(axes, modes):
        ax.set_title(f"{MODE_TITLES.get(mode, mode)}, B={batch}, T={seq_len}")
        ax.grid(axis="x", alpha=0.3)
    return fig, list(zip(axes, rows_per_mode))


def plot_bars(result, batch=None, seq_len=None):
    """A `Figure`: horizontal bars of median time per implementation at one shape (default the headline
    shape), one panel per mode, error bars over the interquartile range. Incorrect rows are drawn
    hatched in red and labelled; failed and skipped rows are left out."""
    config = result["config"]
    fig, panels = _shape_panels(result, batch, seq_len, keep=lambda r: r["status"] == "ok",
                                sort_key=lambda r: -r["ms_median"])
    for ax, rows in panels:
        labels = [chart_label(r) + ("  (incorrect)" if r["correct"] is False else "") for r in rows]
        errors = [[r["ms_median"] - r["ms_q1"] for r in rows], [r["ms_q3"] - r["ms_median"] for r in rows]]
        colors = ["tab:red" if r["correct"] is False else "tab:orange" if fewer_kv_heads(r) else "tab:blue"
                  for r in rows]
        bars = ax.barh(labels, [r["ms_median"] for r in rows], xerr=errors, color=colors, capsize=2)
        for bar, row in zip(bars, rows):
            if row["correct"] is False:
                bar.set_hatch("//")
        ax.set_xlabel("time per call (ms, median; bars: IQR)")
    grouped = " (orange: fewer K/V heads, another model)" if any(fewer_kv_heads(r) for _, rows in panels
                                                                 for r in rows) else ""
    fig.suptitle(f"Causal self-attention, d_model={config['d_model']}, {config['num_heads']} heads{grouped}: "
                 f"{_title_suffix(result)}")
    fig.tight_layout()
    return fig


def plot_share(result, batch=None, seq_len=None):
    """A `Figure`: horizontal bars of each correct row's `matmul_share` (useful TFLOP/s over the rate of
    the square matmul timed beside it, or in the same run for older runs) at one shape (default the
    headline shape), one panel per mode; a dashed line marks 100%."""
    fig, panels = _shape_panels(
        result, batch, seq_len, keep=lambda r: _ranked(r) and matmul_share(r) is not None, sort_key=matmul_share)
    peak = result.get("matmul_peak") or {}
    rate = (peak.get("paired") or {}).get("median_tflops") or peak.get("tflops")
    for ax, rows in panels:
        shares = [100 * matmul_share(r) for r in rows]
        bars = ax.barh([chart_label(r) for r in rows], shares, color="tab:green")
        ax.bar_label(bars, labels=[f"{share:.0f}%" for share in shares], padding=2, fontsize=7)
        ax.axvline(100, color="k", linestyle="--", linewidth=1, alpha=0.6)
        ax.set_xlim(0, max([110.0] + [share * 1.12 for share in shares]))
        ax.set_xlabel("useful TFLOP/s as % of the matmul rate timed beside it" if peak.get("paired")
                      else "useful TFLOP/s as % of the same run's matmul rate")
    rate_text = f" (matmul: {number(rate)} TFLOP/s{', median' if peak.get('paired') else ''})" if rate else ""
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


def _guide(ax, series, power, label, scale=1.0, linestyle="--"):
    """A line c*T^power through `scale` times the geometric mean of the values at the longest T."""
    longest = max((points[-1][0] for points in series.values()), default=None)
    at_longest = [points[-1][1] for points in series.values() if points[-1][0] == longest and points[-1][1] > 0]
    if at_longest:
        anchor = math.exp(sum(math.log(v) for v in at_longest) / len(at_longest)) * scale
        # Start where the guide reaches the lowest measured value, not below the data.
        lowest = min(v for points in series.values() for _, v in points if v > 0)
        shortest = min(points[0][0] for points in series.values())
        lengths = [max(shortest, longest * (lowest / anchor) ** (1 / power)), longest]
        ax.plot(lengths, [anchor * (t / longest) ** power for t in lengths], color="k", linestyle=linestyle,
                linewidth=1, alpha=0.6, label=label)


def _sweep_figure(result, mode, series, guides, quantity, ylabel):
    """Log-log lines against T, one per implementation (20 colours and 11 markers keep 20 lines apart),
    with `guides`, `_guide` arguments."""
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 5))
    ax = fig.subplots()
    colors = matplotlib.colormaps["tab20"].colors
    for index, (label, points) in enumerate(series.items()):
        ax.plot(*zip(*points), marker=MARKERS[index % len(MARKERS)], markersize=4, linewidth=1.3,
                color=colors[index % len(colors)], label=label)
    for guide in guides:
        _guide(ax, series, **guide)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{MODE_TITLES.get(mode, mode)} {quantity} against T, B={result['config']['sweep_batch']}: "
                 f"{_title_suffix(result)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def plot_time_vs_seq_len(result, mode="forward"):
    """A `Figure`: median time against sequence length (log-log) per implementation, with an O(T²) guide."""
    return _sweep_figure(result, mode, _sweep_series(result, mode, "ms_median"), [dict(power=2, label="O(T²)")],
                         "time", "time per call (ms, median)")


def plot_memory_vs_seq_len(result, mode="forward"):
    """A `Figure`: peak memory of one call against sequence length (log-log), with O(T) and O(T²) guides."""
    series = {label: [(t, v / 2**20) for t, v in points if v > 0]
              for label, points in _sweep_series(result, mode, "peak_memory_bytes").items()}
    guides = [dict(power=2, label="O(T²)", scale=2.0), dict(power=1, label="O(T)", scale=0.5, linestyle=":")]
    return _sweep_figure(result, mode, {label: points for label, points in series.items() if points}, guides,
                         "peak memory", "peak memory of one call (MiB)")


def _headline_rows(result, mode):
    """`{label: row}` of the ranked (correct) rows at the headline shape in `mode`."""
    return {r["label"]: r for r in shape_rows(result, mode) if _ranked(r)}


def share_stability(first, second):
    """Two runs of the same profile compared: how far each row's share of the matmul rate moved.

    Returns a list per mode at the headline shape: `{"mode", "fastest", "rows"}` with `rows` a list of
    `{"label", "paired", "run_level"}`, each a pair of shares (first run, second run), and `fastest` the
    label of the first run's fastest row. Rows measured in only one run are left out.
    """
    comparison = []
    for mode in first["config"]["modes"]:
        a, b = _headline_rows(first, mode), _headline_rows(second, mode)
        labels = [label for label in sorted(a, key=lambda label: a[label]["ms_median"]) if label in b]
        if not labels:
            continue
        rows = [{"label": label,
                 "paired": (a[label]["share_of_paired_matmul"], b[label]["share_of_paired_matmul"]),
                 "run_level": (a[label]["share_of_matmul_peak"], b[label]["share_of_matmul_peak"])}
                for label in labels]
        comparison.append({"mode": mode, "fastest": labels[0], "rows": rows})
    return comparison


def _points(pair):
    """The gap between two shares in percentage points, "—" when either is missing."""
    return "—" if None in pair else f"{abs(pair[0] - pair[1]) * 100:.1f}"


def share_stability_table(first, second):
    """Markdown table of `share_stability`: per mode and implementation, the share of the matmul rate in
    each run against the paired yardstick and against the run-level one, and the gap in points."""
    lines = ["| mode | implementation | paired: run 1 | run 2 | gap (points) | run-level: run 1 | run 2 | gap (points) |",
             "|---|---|--:|--:|--:|--:|--:|--:|"]
    for entry in share_stability(first, second):
        for row in entry["rows"]:
            label = f"`{row['label']}`" + (" (fastest)" if row["label"] == entry["fastest"] else "")
            lines.append(f"| {MODE_TITLES[entry['mode']]} | {label} | {_percent(row['paired'][0])} | "
                         f"{_percent(row['paired'][1])} | {_points(row['paired'])} | {_percent(row['run_level'][0])} | "
                         f"{_percent(row['run_level'][1])} | {_points(row['run_level'])} |")
    return "\n".join(lines)


def dtype_pairs(results):
    """`[(float32 result, bfloat16 result), ...]`: recorded runs of one device and profile in both dtypes
    (`results` as `[(path, result), ...]`; the newest of each kind, in the order given)."""
    runs = {}
    for _, result in results:
        key = (result["device_type"], result["provenance"]["device"]["name"], result["config"]["profile"],
               result["config"]["batch"], result["config"]["seq_len"])
        runs.setdefault(key, {}).setdefault(result["dtype"], result)
    return [(kinds["float32"], kinds["bfloat16"]) for kinds in runs.values() if {"float32", "bfloat16"} <= set(kinds)]


def _matmul_rate(result):
    peak = result.get("matmul_peak") or {}
    return (peak.get("paired") or {}).get("median_tflops") or peak.get("tflops")


def dtype_comparison(fp32, bf16):
    """Per implementation at the headline shape, in each mode: the median times in float32 and in
    bfloat16 and the speed-up `fp32 ms / bf16 ms` (above 1: bfloat16 is faster). Returns
    `{"matmul": (fp32 TFLOP/s, bf16 TFLOP/s), "rows": [{"label", mode: (fp32 ms, bf16 ms, speed-up)}]}`,
    rows in float32 forward order."""
    modes = [mode for mode in fp32["config"]["modes"] if mode in bf16["config"]["modes"]]
    by_mode = {mode: (_headline_rows(fp32, mode), _headline_rows(bf16, mode)) for mode in modes}
    first = by_mode[modes[0]][0] if modes else {}
    labels = sorted((label for label in first if all(label in a and label in b for a, b in by_mode.values())),
                    key=lambda label: first[label]["ms_median"])
    rows = []
    for label in labels:
        row = {"label": label}
        for mode, (a, b) in by_mode.items():
            row[mode] = (a[label]["ms_median"], b[label]["ms_median"], a[label]["ms_median"] / b[label]["ms_median"])
        rows.append(row)
    return {"matmul": (_matmul_rate(fp32), _matmul_rate(bf16)), "modes": modes, "rows": rows}


def dtype_comparison_table(fp32, bf16):
    """Markdown: the matmul rates in both dtypes, then `dtype_comparison` as a table."""
    comparison = dtype_comparison(fp32, bf16)
    modes = comparison["modes"]
    header = "| implementation | " + " | ".join(f"{MODE_TITLES[m]}: float32 ms | bfloat16 ms | bf16 speed" for m in modes) + " |"
    lines = [header, "|---|" + "--:|--:|--:|" * len(modes)]
    for row in comparison["rows"]:
        cells = []
        for mode in modes:
            fp32_ms, bf16_ms, speed = row[mode]
            cells += [number(fp32_ms), number(bf16_ms), f"{speed:.2f}×"]
        lines.append(f"| `{row['label']}` | " + " | ".join(cells) + " |")
    fp32_rate, bf16_rate = comparison["matmul"]
    config = fp32["config"]
    intro = (f"B={config['batch']}, T={config['seq_len']}, d_model {config['d_model']}, {config['num_heads']} heads. "
             f"The {fp32['matmul_peak']['size']}² matmul: {number(fp32_rate)} TFLOP/s in float32, {number(bf16_rate)} "
             f"in bfloat16 ({bf16_rate / fp32_rate:.2f}×). bf16 speed = float32 ms / bfloat16 ms: above 1, "
             "bfloat16 is faster.")
    return intro + "\n\n" + "\n".join(lines)


def dtype_verdict(fp32, bf16, mode="forward", margin=0.05):
    """One sentence: which classes bfloat16 makes faster, which slower and which about the same (within
    `margin`) in `mode` at the headline shape."""
    comparison = dtype_comparison(fp32, bf16)
    groups = {"faster": [], "slower": [], "about the same": []}
    for row in comparison["rows"]:
        speed = row[mode][2]
        groups["faster" if speed > 1 + margin else "slower" if speed < 1 - margin else "about the same"].append(
            f"`{row['label']}` ({speed:.2f}×)")
    parts = [f"{what}: {', '.join(labels)}" for what, labels in groups.items() if labels]
    return (f"{MODE_TITLES[mode].capitalize()}, bfloat16 against float32 (more than {margin:.0%} apart counts): "
            + "; ".join(parts) + ".")


# --- The long profile (`--profile long`, attention/bench/long.py): memory slopes and block sparsity ---------

# The fields of a long run's `block_sparse.rows`, with their meaning (the schema page shows this table).
SPARSE_ROW_FIELDS = {
    "pattern": "Key of `block_sparse.patterns`, which describes the mask in words.",
    "kernel": '`"flex_block_mask"` (compiled FlexAttention with the pattern\'s `BlockMask`) or `"sdpa_dense_mask"` '
              "(SDPA with the mask as a dense boolean `(T, T)` tensor).",
    "seq_len": "T, queries and keys.", "batch": "B.", "num_heads": "H.", "head_dim": "D.",
    "mode": '`"forward"`, under `torch.no_grad()`.',
    "status": '`"ok"` or `"failed"`.', "reason": 'Why it failed (`"out of memory"`, or the error).',
    "mask_density": "Share of the T² (query, key) pairs the mask attends.",
    "block_share": "Share of the `(128 x 128)` blocks the kernel computes: those holding an attended pair for "
                   "FlexAttention, all of them (1) for SDPA.",
    "mask_bytes": "Bytes of the mask the kernel reads: the `BlockMask`'s index tensors, or the dense boolean mask.",
    "block_mask_s": "Seconds to build the `BlockMask` (FlexAttention rows; `null` for SDPA).",
    "flops_useful": "`4·B·H·D` × attended pairs: the work the mask asks for, the same for both kernels.",
    "flops_dense": "`4·B·H·D·T²`: the work of every pair.",
    "checked_queries": "Query rows (spread over the sequence) compared with the float64 reference, all heads, "
                       "batch element 0.",
    "tolerance": "`{atol, rtol}` of the run's dtype.",
    "correct": "Matched the reference on the checked rows.", "max_abs_error": "Largest `|out - ref|` there.",
    "first_call_s": "The first call alone (s), compilation included.",
    "ms_median": "Median per-call time over the timing blocks (ms); also `ms_q1`, `ms_q3`, `ms_iqr`, `ms_min`, "
                 "`ms_max`, `repeats`, `calls_per_repeat` and `cpu_utilization`, as in the rows above.",
    "tflops_useful": "`flops_useful / ms_median`, in TFLOP/s.",
    "matmul_tflops_paired": "The matmul rate timed in blocks interleaved with this row's.",
    "share_of_paired_matmul": "`tflops_useful / matmul_tflops_paired`.",
    "peak_memory_bytes": "Peak tensor memory of one call, the mask excluded (it exists before the call).",
    "sdpa_backends": "SDPA backends the profiler saw run (`[\"n/a\"]` for FlexAttention).",
}


# What every block-sparse row has, measured or not.
SPARSE_ID_FIELDS = ("pattern", "kernel", "seq_len", "batch", "num_heads", "head_dim", "mode", "status", "reason",
                    "mask_density", "block_share", "mask_bytes", "flops_useful", "flops_dense")


def block_sparse_fields_table():
    """Markdown table of `SPARSE_ROW_FIELDS`, for the schema page."""
    return "\n".join(["| field | meaning |", "|---|---|"]
                     + [f"| `{name}` | {meaning} |" for name, meaning in SPARSE_ROW_FIELDS.items()])


SPARSE_KERNEL_TITLES = {"flex_block_mask": "FlexAttention + BlockMask", "sdpa_dense_mask": "SDPA + dense mask"}


def validate_block_sparse(section):
    """Problems of a long run's `block_sparse` section, as sentences (`[]` if consistent)."""
    problems = []
    for number_, row in enumerate(section.get("rows") or []):
        where = f"block_sparse row {number_} ({row.get('pattern')}, {row.get('kernel')}, T={row.get('seq_len')})"
        required = SPARSE_ROW_FIELDS if row.get("status") == "ok" else SPARSE_ID_FIELDS
        absent = [key for key in required if key not in row]
        if absent:
            problems.append(f"{where}: missing field(s) {', '.join(absent)}")
            continue
        if row["kernel"] not in SPARSE_KERNEL_TITLES:
            problems.append(f"{where}: unknown kernel {row['kernel']!r}")
        if row["status"] != "ok":
            continue
        times = [row.get(key) for key in ("ms_min", "ms_q1", "ms_median", "ms_q3", "ms_max")]
        if any(not isinstance(t, (int, float)) or t <= 0 for t in times) or times != sorted(times):
            problems.append(f"{where}: times are not positive and ordered min <= q1 <= median <= q3 <= max: {times}")
            continue
        expected = row["flops_useful"] / (row["ms_median"] / 1e3) / 1e12
        if not math.isclose(row["tflops_useful"] or 0, expected, rel_tol=1e-3):
            problems.append(f"{where}: tflops_useful {row['tflops_useful']} is not flops_useful / ms_median = "
                            f"{expected:.4g}")
        paired = row["matmul_tflops_paired"]
        if paired and not math.isclose(row["share_of_paired_matmul"] or 0, expected / paired, rel_tol=1e-3):
            problems.append(f"{where}: share_of_paired_matmul {row['share_of_paired_matmul']} is not tflops_useful / "
                            f"matmul_tflops_paired = {expected / paired:.4g}")
        if not 0 < row["mask_density"] <= row["block_share"] <= 1:
            problems.append(f"{where}: expected 0 < mask_density <= block_share <= 1, got {row['mask_density']} "
                            f"and {row['block_share']}")
        if row["correct"] not in (True, False):
            problems.append(f"{where}: correct must be true or false, got {row['correct']!r}")
    return problems


def block_sparse_rows(result, pattern=None):
    """The long run's block-sparse rows (of one `pattern`, or all); `[]` for runs without them."""
    rows = (result.get("block_sparse") or {}).get("rows") or []
    return [row for row in rows if pattern is None or row["pattern"] == pattern]


def _sparse_pairs(result, pattern):
    """`{seq_len: {kernel: row}}` of one pattern, lengths ascending."""
    pairs = {}
    for row in block_sparse_rows(result, pattern):
        pairs.setdefault(row["seq_len"], {})[row["kernel"]] = row
    return dict(sorted(pairs.items()))


def _usable(row):
    return row is not None and row["status"] == "ok" and row["correct"] is True


def crossovers(result):
    """Per pattern, where the block-sparse kernel overtakes the dense mask, read from the measurements.

    Returns `{pattern: {"crossover", "longest", "speedup", "block_share", "mask_density", "flex_ms",
    "dense_ms"}}`: `crossover` is the shortest measured length from which FlexAttention with the
    BlockMask is faster than SDPA with the dense mask at that length and every longer one measured
    (None if it is not faster at the longest); `speedup` is the dense time over the Flex time at the
    longest length where both ran correctly.
    """
    found = {}
    for pattern in (result.get("block_sparse") or {}).get("patterns", {}):
        both = [(t, pair["flex_block_mask"], pair["sdpa_dense_mask"])
                for t, pair in _sparse_pairs(result, pattern).items()
                if _usable(pair.get("flex_block_mask")) and _usable(pair.get("sdpa_dense_mask"))]
        if not both:
            continue
        crossover = None
        for t, flex, dense in reversed(both):
            if flex["ms_median"] >= dense["ms_median"]:
                break
            crossover = t
        longest, flex, dense = both[-1]
        found[pattern] = dict(crossover=crossover, longest=longest, speedup=dense["ms_median"] / flex["ms_median"],
                              block_share=flex["block_share"], mask_density=flex["mask_density"],
                              flex_ms=flex["ms_median"], dense_ms=dense["ms_median"])
    return found


def crossover_table(result):
    """Markdown: per pattern, the crossover length and the speed-up and block share at the longest length."""
    lines = ["| pattern | Flex faster from | at T | blocks computed | pairs attended | Flex ms | dense SDPA ms "
             "| speed-up |", "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for pattern, found in crossovers(result).items():
        crossover = f"T={found['crossover']}" if found["crossover"] else "not within the lengths measured"
        lines.append(f"| {pattern} | {crossover} | {found['longest']} | {_percent(found['block_share'])} "
                     f"| {_percent(found['mask_density'])} | {number(found['flex_ms'])} | {number(found['dense_ms'])} "
                     f"| {found['speedup']:.2f}x |")
    return "\n".join(lines)


def _memory_cell(row):
    return f"{_mebibytes(row['peak_memory_bytes'])} ({_mebibytes(row['mask_bytes'])})"


def block_sparse_table(result, pattern=None):
    """Markdown: per pattern and length, both kernels' median time, speed-up, blocks computed and memory."""
    parts = []
    patterns = (result.get("block_sparse") or {}).get("patterns", {})
    for name in [pattern] if pattern else list(patterns):
        lines = [f"**{name}**: {patterns[name]}\n",
                 "| T | pairs attended | blocks computed | Flex ms | dense SDPA ms | speed-up | Flex MiB "
                 "(BlockMask) | dense MiB (mask) |", "|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for t, pair in _sparse_pairs(result, name).items():
            flex, dense = pair.get("flex_block_mask"), pair.get("sdpa_dense_mask")

            def cell(row, value):
                if row is None:
                    return ""
                if row["status"] != "ok":
                    return "OOM" if row["reason"] == "out of memory" else row["status"]
                return "incorrect" if row["correct"] is not True else value(row)

            speedup = (f"{dense['ms_median'] / flex['ms_median']:.2f}x" if _usable(flex) and _usable(dense) else "—")
            first = flex or dense
            lines.append(
                f"| {t} | {_percent(first['mask_density'])} | {_percent(flex['block_share']) if flex else '—'} "
                f"| {cell(flex, lambda r: number(r['ms_median']))} | {cell(dense, lambda r: number(r['ms_median']))} "
                f"| {speedup} | {cell(flex, _memory_cell)} | {cell(dense, _memory_cell)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def memory_slopes(result, mode, shortest=2048):
    """Fitted growth of peak memory with T: `{label: {"slope", "lengths"}}` per implementation.

    The slope is the least-squares fit of log(peak bytes) against log(T) over the measured lengths
    `>= shortest` (at least two): 2 for memory that grows as T², 1 for T. Below `shortest` the weights'
    gradients and other fixed costs hide the growth.
    """
    slopes = {}
    for label, points in _sweep_series(result, mode, "peak_memory_bytes").items():
        points = [(t, v) for t, v in points if t >= shortest and v > 0]
        if len(points) < 2:
            continue
        xs, ys = [math.log(t) for t, _ in points], [math.log(v) for _, v in points]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
        slopes[label] = {"slope": slope, "lengths": [t for t, _ in points]}
    return slopes


def memory_slope_table(result, shortest=2048):
    """Markdown: the fitted memory slope per implementation and mode, with the lengths fitted and the peak at
    the longest of them."""
    lines = ["| implementation | mode | fitted slope (peak ∝ T^slope) | lengths fitted | peak at the longest (MiB) |",
             "|---|---|--:|---|--:|"]
    for mode in result["config"]["modes"]:
        peaks = {(r["label"], r["seq_len"]): r["peak_memory_bytes"] for r in sweep_rows(result, mode)}
        for label, fit in memory_slopes(result, mode, shortest).items():
            lengths = fit["lengths"]
            lines.append(f"| `{label}` | {MODE_TITLES.get(mode, mode)} | {fit['slope']:.2f} | "
                         f"{lengths[0]}..{lengths[-1]} | {_mebibytes(peaks[(label, lengths[-1])])} |")
    return "\n".join(lines)


def plot_block_sparse(result):
    """A `Figure`: per pattern, both kernels' median time against T (log-log), the crossover marked."""
    from matplotlib.figure import Figure

    patterns = list((result.get("block_sparse") or {}).get("patterns", {}))
    columns = 2
    rows_ = max(1, math.ceil(len(patterns) / columns))
    fig = Figure(figsize=(9, 3.4 * rows_))
    axes = fig.subplots(rows_, columns, squeeze=False).ravel()
    found = crossovers(result)
    for ax, pattern in zip(axes, patterns):
        pairs = _sparse_pairs(result, pattern)
        for kernel, marker in (("flex_block_mask", "o"), ("sdpa_dense_mask", "s")):
            points = [(t, pair[kernel]["ms_median"]) for t, pair in pairs.items() if _usable(pair.get(kernel))]
            if points:
                ax.plot(*zip(*points), marker=marker, markersize=4, label=SPARSE_KERNEL_TITLES[kernel])
        crossover = found.get(pattern, {}).get("crossover")
        if crossover:
            ax.axvline(crossover, color="k", linestyle=":", linewidth=1, label=f"Flex faster from T={crossover}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(pattern, fontsize=10)
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("ms per call (median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(patterns):]:
        ax.set_visible(False)
    section = result.get("block_sparse") or {}
    fig.suptitle(f"Block-sparse FlexAttention against a dense SDPA mask, forward, B={section.get('batch')}, "
                 f"{section.get('num_heads')} heads of {section.get('head_dim')}: {_title_suffix(result)}", fontsize=10)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------------------
# Decode profile (`python -m attention.bench --profile decode`, attention/bench/decode.py)

def decode_fields_table():
    """The decode rows' fields and their meanings, as a Markdown table (the schema page)."""
    from attention.bench.decode import DECODE_ROW_FIELDS

    lines = ["| Field | Meaning |", "| --- | --- |"]
    return "\n".join(lines + [f"| `{name}` | {meaning} |" for name, meaning in DECODE_ROW_FIELDS.items()])


def validate_decode(section):
    """Problems of a decode result's `decode` section, as sentences (the numbers recomputed from each row)."""
    from attention.bench.decode import DECODE_ROW_FIELDS

    problems = []
    bandwidth = section.get("bandwidth") or {}
    if not isinstance(bandwidth.get("read_gbps"), (int, float)) or bandwidth["read_gbps"] <= 0:
        problems.append("decode.bandwidth.read_gbps is missing or not positive")
    rows = section.get("rows") or []
    if not rows:
        problems.append("decode: no rows")
    for number, row in enumerate(rows):
        where = (f"decode row {number} ({row.get('model')}, {row.get('kernel')}, B={row.get('batch')}, "
                 f"context={row.get('context')})")
        absent = [key for key in DECODE_ROW_FIELDS if key not in row]
        if absent:
            problems.append(f"{where}: missing field(s) {', '.join(absent)}")
            continue
        if row["status"] not in ("ok", "skipped", "failed"):
            problems.append(f"{where}: unknown status {row['status']!r}")
        if row["status"] != "ok":
            continue
        times = [row[key] for key in ("ms_min", "ms_q1", "ms_median", "ms_q3", "ms_max")]
        if any(not isinstance(t, (int, float)) or t <= 0 for t in times) or times != sorted(times):
            problems.append(f"{where}: times are not positive and ordered min <= q1 <= median <= q3 <= max: {times}")
            continue
        seconds = row["ms_median"] / 1e3
        expected = {
            "tokens_per_s": row["batch"] / seconds,
            "cache_bytes_read": row["batch"] * (row["context"] + 1) * row["cache_bytes_per_token"],
            "bytes_read": row["cache_bytes_read"] + row["weight_bytes"],
            "gbps": row["bytes_read"] / seconds / 1e9,
            "share_of_paired_bandwidth": row["gbps"] / row["bandwidth_gbps_paired"],
            "tflops": row["flops"] / seconds / 1e12,
        }
        matmul = (section.get("matmul") or {}).get("tflops")
        if matmul:
            expected["share_of_matmul"] = row["tflops"] / matmul
        for key, value in expected.items():
            if not isinstance(row[key], (int, float)) or not math.isclose(row[key], value, rel_tol=1e-3):
                problems.append(f"{where}: {key} {row[key]} does not match its definition ({value:.4g})")
        if row["correct"] not in (True, False):
            problems.append(f"{where}: correct must be true or false, got {row['correct']!r}")
    return problems


def decode_rows(result, batch=None, model=None, kernel=None, context=None):
    """The measured, correct decode rows of `result` matching the given values."""
    wanted = {"batch": batch, "model": model, "kernel": kernel, "context": context}
    return [row for row in (result.get("decode") or {}).get("rows", [])
            if row["status"] == "ok" and row["correct"] is True
            and all(value is None or row[key] == value for key, value in wanted.items())]


def decode_best(result, model, batch, context):
    """The fastest correct row of `model` at `batch` and `context` (any kernel), or None."""
    rows = decode_rows(result, batch=batch, model=model, context=context)
    return min(rows, key=lambda row: row["ms_median"]) if rows else None


def _decode_axes(result):
    rows = (result.get("decode") or {}).get("rows", [])
    return (list(dict.fromkeys(row["model"] for row in rows)), list(dict.fromkeys(row["kernel"] for row in rows)),
            sorted({row["batch"] for row in rows}), sorted({row["context"] for row in rows}))


def decode_table(result, batch):
    """Markdown: tokens per second and share of the measured read bandwidth, per model and kernel (rows) and
    context (columns), at one batch size. Skipped or failed rows say so; wrong rows say WRONG."""
    models, kernels, _, contexts = _decode_axes(result)
    rows = (result.get("decode") or {}).get("rows", [])
    header = "| Model (K/V heads) | Kernel | " + " | ".join(f"{c:,}" for c in contexts) + " |"
    lines = [header, "| --- | --- | " + " | ".join("---:" for _ in contexts) + " |"]
    for model in models:
        for kernel in kernels:
            cells = []
            for context in contexts:
                row = next((r for r in rows if (r["model"], r["kernel"], r["batch"], r["context"])
                            == (model, kernel, batch, context)), None)
                if row is None:
                    cells.append("")
                elif row["status"] != "ok":
                    cells.append(row["status"])
                elif row["correct"] is not True:
                    cells.append("WRONG")
                else:
                    cells.append(f"{row['tokens_per_s']:,.0f} tok/s · {row['share_of_paired_bandwidth']:.0%}")
            kv = next((r["num_kv_heads"] for r in rows if r["model"] == model), "?")
            lines.append(f"| {model} ({kv}) | `{kernel}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def decode_summary_table(result, contexts=None):
    """Markdown: per batch and model, the fastest kernel's tokens/s and bandwidth share at a few contexts,
    and the cache bytes per token."""
    models, _, batches, all_contexts = _decode_axes(result)
    contexts = [c for c in (contexts or all_contexts) if c in all_contexts]
    lines = ["| Batch | Model | K/V heads | Cache per token | " + " | ".join(f"{c:,} context" for c in contexts) + " |",
             "| ---: | --- | ---: | ---: | " + " | ".join("---:" for _ in contexts) + " |"]
    rows = (result.get("decode") or {}).get("rows", [])
    for batch in batches:
        for model in models:
            sample = next(r for r in rows if r["model"] == model)
            cells = []
            for context in contexts:
                best = decode_best(result, model, batch, context)
                cells.append("" if best is None else f"{best['tokens_per_s']:,.0f} tok/s, "
                             f"{best['share_of_paired_bandwidth']:.0%} (`{best['kernel']}`)")
            lines.append(f"| {batch} | {model} | {sample['num_kv_heads']} | "
                         f"{sample['cache_bytes_per_token'] / 1024:,.0f} KiB | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_decode(result, metric="tokens_per_s"):
    """Figure: `metric` (tokens_per_s or share_of_paired_bandwidth) against context, one panel per batch size,
    one colour per model, solid for the `matmul` kernel and dashed for `sdpa`."""
    from matplotlib.figure import Figure

    models, kernels, batches, _ = _decode_axes(result)
    fig = Figure(figsize=(5.2 * len(batches), 4.2), layout="constrained")
    axes = fig.subplots(1, len(batches), squeeze=False)[0]
    styles = {"matmul": "-", "sdpa": "--"}
    colors = {model: f"C{i}" for i, model in enumerate(models)}
    for ax, batch in zip(axes, batches):
        for model in models:
            for kernel in kernels:
                rows = sorted(decode_rows(result, batch=batch, model=model, kernel=kernel), key=lambda r: r["context"])
                if rows:
                    values = [r[metric] * (100 if metric.startswith("share") else 1) for r in rows]
                    ax.plot([r["context"] for r in rows], values, styles.get(kernel, ":"), marker="o",
                            color=colors[model], label=f"{model} ({rows[0]['num_kv_heads']} K/V) {kernel}")
        ax.set_xscale("log", base=2)
        if metric == "tokens_per_s":
            ax.set_yscale("log")
            ax.set_ylabel("tokens per second (one layer)")
        else:
            ax.set_ylabel("% of measured read bandwidth")
            ax.set_ylim(bottom=0)
        ax.set_xlabel("context (cached positions)")
        ax.set_title(f"batch {batch}")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()  # every panel draws the same lines
    fig.legend(handles, labels, loc="outside lower center", ncols=len(models), fontsize=8)
    fig.suptitle(f"Decode step, {result['provenance']['device']['name']}, {result['dtype']}", fontsize=10)
    return fig
