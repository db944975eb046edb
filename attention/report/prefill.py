"""The prefill sweep's results shown: MLA's two paths per prompt length, where each is faster, tables, charts and its
section of the Benchmarks page (the sweep itself: `attention.bench.sweeps.prefill`).
"""

from attention.bench import core
from attention.bench.sweeps.prefill import NAME
from attention.models.deepseek_v3 import PATHS
from attention.report.format import collapsed, nested, number, percent, status_cell, table, title_suffix


def by_length(result):
    """`{tokens: {path: row}}`, lengths ascending."""
    return nested((result.get(NAME) or {}).get("rows", []), "tokens", "path")


def faster_path(pair):
    """`"naive"` or `"absorbed"`, the path whose time's interquartile range lies wholly below the other's, or `"tie"`
    where the two ranges overlap (the run cannot tell them apart)."""
    absorbed, naive = pair["absorbed"], pair["naive"]
    if naive["ms_q3"] < absorbed["ms_q1"]:
        return "naive"
    return "absorbed" if absorbed["ms_q3"] < naive["ms_q1"] else "tie"


def naive_faster_from(result):
    """The shortest measured prompt from which the naive path is faster (`faster_path`) at that length and every
    longer one where both were measured, or None; and the lengths where both were measured."""
    pairs = by_length(result)
    both = [t for t, pair in pairs.items() if all(core.usable(pair.get(path)) for path in PATHS)]
    found = None
    for t in reversed(both):
        if faster_path(pairs[t]) != "naive":
            break
        found = t
    return found, both


def prefill_table(result):
    """Per prompt length: each path's median time, TFLOP/s and share of the paired matmul, and the ratio."""
    lines = []
    for t, pair in by_length(result).items():
        absorbed, naive = pair.get("absorbed"), pair.get("naive")
        cells = [status_cell(row, lambda r: f"{number(r['ms_median'])} ms · {number(r['tflops'])} TFLOP/s · "
                                            f"{percent(r['share_of_paired_matmul'])}") for row in (absorbed, naive)]
        ratio = (f"{absorbed['ms_median'] / naive['ms_median']:.2f}x" + (" (tie)" if faster_path(pair) == "tie" else "")
                 if core.usable(absorbed) and core.usable(naive) else "—")
        lines.append([f"{t:,}", *cells, ratio])
    return table(["T (prompt)", "absorbed", "naive", "absorbed time / naive time"], lines, "rrrr")


def plot_prefill(result):
    """Each path's median time against the prompt length (log-log)."""
    from matplotlib.figure import Figure

    section = result[NAME]
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    for path, marker in zip(PATHS, "os"):
        points = [(t, pair[path]["ms_median"]) for t, pair in by_length(result).items() if core.usable(pair.get(path))]
        if points:
            ax.plot(*zip(*points), marker=marker, label=f"MLA {path}")
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="prompt length T (tokens)", ylabel="ms per forward (median)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"MLA prefill, batch {section['batch']}, {section['num_heads']} heads of {section['head_dim']}: "
                 f"{title_suffix(result)}", fontsize=10)
    return fig


def charts(result):
    return {"prefill": (plot_prefill(result), f"MLA prefill time of the absorbed and naive paths against prompt "
                                              f"length, {title_suffix(result)}")}


def summary(result):
    """Where each path is faster, in words, from the measured rows."""
    found, both = naive_faster_from(result)
    if not both:
        return "No prompt length has both paths measured and correct."
    pairs = by_length(result)
    ratios = [pairs[t]["absorbed"]["ms_median"] / pairs[t]["naive"]["ms_median"] for t in both]
    if found is None:
        where = "The naive path is not faster at the longest prompt measured"
    elif found == both[0]:
        where = f"The naive path is faster at every prompt length measured ({both[0]:,} to {both[-1]:,} tokens)"
    else:
        where = f"The naive path is faster from {found:,} tokens on"
    ties = [f"{t:,}" for t in both if faster_path(pairs[t]) == "tie"]
    return (f"{where}; the absorbed path takes {min(ratios):.2f}x to {max(ratios):.2f}x the naive path's time over "
            f"{both[0]:,} to {both[-1]:,} tokens" + (f" (a tie at {', '.join(ties)} tokens: the two times' interquartile "
                                                   "ranges overlap)" if ties else "") + ".")


def tables(result):
    return summary(result) + "\n\n" + prefill_table(result)


def page(result, images):
    section = result[NAME]
    return "\n\n".join([
        f"Multi-head latent attention, one layer's causal forward over a whole prompt (no cache), batch "
        f"{section['batch']}, {section['num_heads']} heads of {section['head_dim']} at DeepSeek-V3's widths; each cell: "
        "median time, TFLOP/s and the share of the matmul timed beside the row.", summary(result),
        *images.values(), collapsed("Every prompt length, both paths", prefill_table(result))])
