"""The home page's decision table: per task and device, the class to use, from the recorded runs' numbers."""

from attention.bench.results import is_stale
from attention.report.block_sparse import crossovers
from attention.report.decode import decode_rows
from attention.report.prose import file_label
from attention.report.sequence import fastest, shape_rows

DECISION_DEVICES = {"cpu": "CPU", "cuda": "NVIDIA GPU"}
NOT_MEASURED = "not measured yet"


def _winners(runs, mode):
    """`{class label: [file label, ...]}`: the fastest correct class at each run's headline shape in `mode`,
    ties named with it."""

    winners = {}
    for name, result in runs:
        config = result["config"]
        for entry in fastest(result):
            if (entry["mode"], entry["batch"], entry["seq_len"], entry["compiled"]) != (
                    mode, config["batch"], config["seq_len"], False):
                continue
            best = f"`{entry['fastest']['label']}`"
            if entry["tied"]:
                best += " (tied: " + ", ".join(f"`{row['label']}`" for row in entry["tied"]) + ")"
            winners.setdefault(best, []).append(file_label(name, is_stale(result)))
    return winners


def _winners_cell(runs, mode):
    winners = _winners(runs, mode)
    if not winners:
        return NOT_MEASURED
    return "; ".join(f"{best}, fastest in {', '.join(files)}" for best, files in winners.items())


def _pair_cell(runs, faster_label, slower_label):
    """Training time of two classes in each run that has both, at its headline shape."""

    cells = []
    for name, result in runs:
        rows = {row["label"]: row for row in shape_rows(result, "forward_backward")
                if row["status"] == "ok" and row["correct"] is True and not row["compiled"]}
        if faster_label in rows and slower_label in rows:
            a, b = rows[faster_label], rows[slower_label]
            first, second = (a, b) if a["ms_median"] <= b["ms_median"] else (b, a)
            cells.append(f"`{first['label']}` (training {first['ms_median']:,.0f} ms against `{second['label']}`'s "
                         f"{second['ms_median']:,.0f}) in {file_label(name, is_stale(result))}")
    return "; ".join(cells) or NOT_MEASURED


def _decode_cell(decode_runs):

    cells = []
    for name, result in decode_runs:
        rows = decode_rows(result, batch=1, model="GQA")
        if not rows:
            continue
        context = max(row["context"] for row in rows)
        by_kernel = {row["kernel"]: row for row in rows if row["context"] == context}
        best = max(by_kernel.values(), key=lambda row: row["tokens_per_s"])
        others = ", ".join(f"`{kernel}` {row['tokens_per_s']:,.0f}" for kernel, row in by_kernel.items()
                           if row is not best)
        cells.append(f"`gqa` with `decode_kernel=\"{best['kernel']}\"`: {best['tokens_per_s']:,.0f} tokens/s at a "
                     f"{context:,}-token cache, batch 1 (" + (f"{others}; " if others else "")
                     + f"{file_label(name, is_stale(result))})")
    return "; ".join(cells) or NOT_MEASURED


def _mask_cell(long_runs):

    cells = []
    for name, result in long_runs:
        found = crossovers(result)
        if not found:
            continue
        sparse = [f"{pattern.replace('_', ' ')} from `T = {entry['crossover']:,}`"
                  for pattern, entry in found.items() if entry["crossover"] and pattern != "causal"]
        never = [pattern.replace("_", " ") for pattern, entry in found.items() if not entry["crossover"]]
        cell = ("`sdpa_mask` or `MultiHeadAttention` (a boolean mask through SDPA) for short sequences; "
                "`flex` with a `BlockMask` once it skips enough blocks: " + ", ".join(sparse))
        if never:
            cell += f" (not within the lengths measured: {', '.join(never)})"
        cells.append(cell + f", forward, in {file_label(name, is_stale(result))}")
    return "; ".join(cells) or NOT_MEASURED


def decision_table(runs, decode_runs, long_runs):
    """Markdown: the home page's "Which one should I use?" table, one row per use and one column per device
    type, each cell read from the recorded runs of that device (`[(file name, result), ...]` each: default
    profile, decode profile, long profile) and naming them, or "not measured yet"."""
    rows = {
        "Training (forward + backward)": lambda kind: _winners_cell(runs[kind], "forward_backward"),
        "Prefill (a prompt's forward pass, no cache yet)": lambda kind: _winners_cell(runs[kind], "forward"),
        "Decoding with a KV cache": lambda kind: _decode_cell(decode_runs[kind]),
        "A GQA model (fewer K/V heads)": lambda kind: _pair_cell(runs[kind], "gqa", "gqa_flex"),
        "A custom mask": lambda kind: _mask_cell(long_runs[kind]),
    }
    header = "| You want | " + " | ".join(DECISION_DEVICES.values()) + " |"
    lines = [header, "|---|" + "---|" * len(DECISION_DEVICES)]
    for use, cell in rows.items():
        lines.append(f"| {use} | " + " | ".join(cell(kind) for kind in DECISION_DEVICES) + " |")
    return "\n".join(lines)


def split_by_device(named_results):
    """`{device type: [(name, result), ...]}` for every `DECISION_DEVICES` type (empty where none)."""
    split = {kind: [] for kind in DECISION_DEVICES}
    for name, result in named_results:
        split.setdefault(result["device_type"], []).append((name, result))
    return split


# --- KV cache page: the attention of one decode step -----------------------------------------------------
