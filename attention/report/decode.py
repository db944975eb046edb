"""The decode sweep's results shown: rows by layer, kernel, batch and context, tables, charts and its section of the
Benchmarks page (the sweep itself: `attention.bench.sweeps.decode`).
"""

import statistics

from attention.bench.sweeps.decode import NAME
from attention.report.format import collapsed, number, table, title_suffix


def decode_rows(result, batch=None, model=None, kernel=None, context=None):
    """The measured, correct decode rows of `result` matching the given values."""
    wanted = {"batch": batch, "model": model, "kernel": kernel, "context": context}
    return [row for row in (result.get(NAME) or {}).get("rows", []) if row["status"] == "ok" and row["correct"] is True
            and all(value is None or row[key] == value for key, value in wanted.items())]


def decode_best(result, model, batch, context):
    """The fastest correct row of `model` at `batch` and `context` (any kernel), or None."""
    return min(decode_rows(result, batch, model, None, context), key=lambda row: row["ms_median"], default=None)


def shown_share(result):
    """The bandwidth share the tables and charts show: against the run's peak (its best read or copy) where the run
    measured one, else against the read timed beside each row (runs recorded before the peak was)."""
    return "share_of_peak_bandwidth" if "peak_gbps" in result[NAME]["bandwidth"] else "share_of_paired_bandwidth"


def share_words(result):
    return ("the run's peak bandwidth" if shown_share(result) == "share_of_peak_bandwidth"
            else "the read bandwidth measured beside the row")


def axes(result, models=None):
    rows = [row for row in result[NAME]["rows"] if models is None or row["model"] in models]
    return (list(dict.fromkeys(r["model"] for r in rows)), list(dict.fromkeys(r["kernel"] for r in rows)),
            sorted({r["batch"] for r in rows}), sorted({r["context"] for r in rows}))


def decode_table(result, batch, models=None):
    """Tokens per second and bandwidth share (`shown_share`) per model and kernel (rows) and context (columns), at one
    batch size, of `models` (default all); skipped or failed rows say so, wrong ones WRONG."""
    models, kernels, _, contexts = axes(result, models)
    share = shown_share(result)
    cells = {(r["model"], r["kernel"], r["context"]): r for r in result[NAME]["rows"] if r["batch"] == batch}

    def cell(row):
        if row is None or row["status"] != "ok":
            return "" if row is None else row["status"]
        return f"{row['tokens_per_s']:,.0f} tok/s · {row[share]:.0%}" if row["correct"] else "WRONG"
    kv = {r["model"]: r["num_kv_heads"] for r in result[NAME]["rows"]}
    return table(["Model (K/V heads)", "Kernel"] + [f"{c:,}" for c in contexts],
                 [[f"{model} ({kv[model]})", f"`{kernel}`"] + [cell(cells.get((model, kernel, c))) for c in contexts]
                  for model in models for kernel in kernels if any((model, kernel, c) in cells for c in contexts)],
                 "ll" + "r" * len(contexts))


def decode_summary_table(result, contexts=None, models=None):
    """Per batch and model (`models`, default all): the fastest kernel's tokens/s and bandwidth share (`shown_share`)
    at `contexts` (default all), and the cache bytes per token."""
    models, _, batches, measured = axes(result, models)
    share = shown_share(result)
    contexts = [c for c in contexts or measured if c in measured]
    first = {r["model"]: r for r in reversed(result[NAME]["rows"])}

    def cell(best):
        return "" if best is None else (f"{best['tokens_per_s']:,.0f} tok/s, {best[share]:.0%} "
                                        f"(`{best['kernel']}`)")
    return table(["Batch", "Model", "K/V heads", "Cache per token"] + [f"{c:,} context" for c in contexts],
                 [[batch, model, first[model]["num_kv_heads"], f"{first[model]['cache_bytes_per_token'] / 1024:,g} KiB"]
                  + [cell(decode_best(result, model, batch, c)) for c in contexts] for batch in batches for model in models],
                 "rlrr" + "r" * len(contexts))


def plot_decode(result, metric="tokens_per_s", models=None):
    """`metric` (tokens_per_s or a bandwidth share) against context, a panel per batch size, a colour per
    model (`models`, default all), solid for the `matmul` kernel and dashed for the others."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    models, kernels, batches, _ = axes(result, models)
    colors = [f"C{i}" for i in range(len(models))] if len(models) <= 10 else colormaps["tab20"].colors  # one per model
    fig = Figure(figsize=(5.2 * len(batches), 4.2), layout="constrained")
    panels = fig.subplots(1, len(batches), squeeze=False)[0]
    for ax, batch in zip(panels, batches):
        for color, model in enumerate(models):
            for kernel in kernels:
                rows = sorted(decode_rows(result, batch, model, kernel), key=lambda r: r["context"])
                if rows:
                    ax.plot([r["context"] for r in rows], [r[metric] * (100 if metric.startswith("share") else 1)
                                                           for r in rows], "-" if kernel == "matmul" else "--",
                            marker="o", color=colors[color], label=f"{model} ({rows[0]['num_kv_heads']} K/V) {kernel}")
        ax.set_xscale("log", base=2)
        if metric == "tokens_per_s":
            ax.set(yscale="log", ylabel="tokens per second (one layer)")
        else:
            ax.set(ylabel="% of the run's peak bandwidth" if metric == "share_of_peak_bandwidth"
                   else "% of the read bandwidth beside it", ylim=(0, None))
        ax.set(xlabel="context (cached positions)", title=f"batch {batch}")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = panels[0].get_legend_handles_labels()  # every panel draws the same lines
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), fontsize=8)
    fig.suptitle(f"Decode step, {title_suffix(result)}", fontsize=10)
    return fig


def bandwidth_note(result):
    bandwidth, matmul = result[NAME]["bandwidth"], result[NAME]["matmul_peak"]
    reads = [s["read_gbps"] for s in bandwidth["samples"]]
    paired = [r["bandwidth_gbps_paired"] for r in decode_rows(result)]
    note = (f"Read rate timed beside each row (a sum over {bandwidth['bytes'] / 2**20:,.0f} MiB): median "
            f"{statistics.median(paired):.1f} GB/s (lowest {min(paired):.1f}, highest {max(paired):.1f})." if paired else "")
    if "peak_gbps" in bandwidth:
        sizes = ", ".join(f"{size / 2**20:,.0f}" for size in result[NAME]["ceiling_bytes"])
        cache = bandwidth["last_level_cache_bytes"]
        note = (f"Bandwidth ceiling of this run: **{bandwidth['peak_gbps']:.1f} GB/s**, the best of {len(reads)} samples "
                f"(at the start and after each model) of a read (a sum) and a copy (reads and writes counted) over "
                f"{sizes} MiB" + (f", past the {cache / 2**20:,.0f} MiB last-level cache" if cache else "") + "; "
                f"medians of the samples: read {bandwidth['read_gbps']:.1f} GB/s (lowest {min(reads):.1f}), copy "
                f"{bandwidth['copy_gbps']:.1f}. Shares in the tables and charts are against the ceiling. " + note)
    else:
        note = (f"Read bandwidth (a sum over {bandwidth['bytes'] / 2**20:,.0f} MiB, same run): median "
                f"{bandwidth['read_gbps']:.1f} GB/s of {len(reads)} samples; a copy: {bandwidth['copy_gbps']:.1f} GB/s. "
                "Each row's share is against the read rate timed beside it. " + note)
    return note + (f" Matmul rate (2048² {result['dtype']}, same run): {number(matmul['tflops'])} TFLOP/s." if matmul else "")


def charts(result):
    return {"tokens": (plot_decode(result, "tokens_per_s"), f"decode tokens per second against context, "
                                                             f"{title_suffix(result)}"),
            "share": (plot_decode(result, shown_share(result)), f"decode step's share of {share_words(result)} "
                                                                  f"against context, {title_suffix(result)}")}


def tables(result):
    return "\n\n".join([bandwidth_note(result), decode_summary_table(result)] + [
        f"Batch {batch}: tokens per second (one layer) and share of {share_words(result)}\n\n"
        + decode_table(result, batch) for batch in axes(result)[2]])


def page(result, images):
    section = result[NAME]
    return "\n\n".join([
        f"The fastest kernel per model, {section['num_heads']} query heads of {section['head_dim']} (MHA, GQA, MQA, the "
        f"model families' layers and MLA at those sizes), one attention layer; each cell: tokens per second and the share of {share_words(result)}:",
        decode_summary_table(result), *images.values(), bandwidth_note(result)] + [
        collapsed(f"Batch {batch}: every kernel and context", decode_table(result, batch)) for batch in axes(result)[2]])
