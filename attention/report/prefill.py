"""The prefill sweep's results shown: MLA's two paths per prompt length, where each is faster, tables, charts, the
Benchmarks page's section and the MLA page's; and the grouped-query page's section, of a default-profile run."""

from attention.bench import core
from attention.bench.results import is_stale
from attention.bench.sweeps.prefill import NAME
from attention.models.deepseek_v3 import PATHS
from attention.report import prose
from attention.report.decode import mla_pairs
from attention.report.format import (MODE_TITLES, collapsed, device_label, mebibytes, nested, number, percent,
                                     run_line, status_cell, table, title_suffix)
from attention.report.sequence import shape_rows


def by_length(result):
    """`{tokens: {path: row}}`, lengths ascending."""
    return nested((result.get(NAME) or {}).get("rows", []), "tokens", "path")


def faster_path(pair):
    """`"naive"` or `"absorbed"`, the path whose time's interquartile range lies wholly below the other's, or `"tie"`
    where the two ranges overlap (the run cannot tell them apart)."""
    absorbed, naive = pair["absorbed"], pair["naive"]
    return ("naive" if naive["ms_q3"] < absorbed["ms_q1"] else "absorbed" if absorbed["ms_q3"] < naive["ms_q1"]
            else "tie")


def naive_faster_from(result):
    """The shortest measured prompt from which the naive path is faster (`faster_path`) at that length and every
    longer one where both were measured, or None; and the lengths where both were measured."""
    pairs = by_length(result)
    both = [t for t, pair in pairs.items() if all(core.usable(pair.get(path)) for path in PATHS)]
    from_ = [t for i, t in enumerate(both) if all(faster_path(pairs[u]) == "naive" for u in both[i:])]
    return (from_[0] if from_ else None), both


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
    fig.suptitle(f"MLA prefill, {shape(result)}: {title_suffix(result)}", fontsize=10)
    return fig


def charts(result):
    return {"prefill": (plot_prefill(result), f"MLA prefill time of the absorbed and naive paths against prompt "
                                              f"length, {title_suffix(result)}")}


CELLS = "each cell: median time, TFLOP/s and the share of the matmul timed beside the row"


def shape(result):
    """The sweep's batch size and heads, in words."""
    return f"batch {result[NAME]['batch']}, {result[NAME]['num_heads']} query heads of {result[NAME]['head_dim']}"


def summary(result):
    """Where each path is faster, in words, from the measured rows."""
    found, both = naive_faster_from(result)
    if not both:
        return "No prompt length has both paths measured and correct."
    pairs = by_length(result)
    ratios = [pairs[t]["absorbed"]["ms_median"] / pairs[t]["naive"]["ms_median"] for t in both]
    ties = [f"{t:,}" for t in both if faster_path(pairs[t]) == "tie"]
    return ("The naive path is not faster at the longest prompt measured" if found is None else
            f"The naive path is faster at every prompt length measured ({both[0]:,} to {both[-1]:,} tokens)"
            if found == both[0] else f"The naive path is faster from {found:,} tokens on") + (
        f"; the absorbed path takes {min(ratios):.2f}x to {max(ratios):.2f}x the naive path's time over {both[0]:,} to "
        f"{both[-1]:,} tokens" + (f" (a tie at {', '.join(ties)} tokens: the two times' interquartile ranges overlap)"
                                  if ties else "") + ".")


def tables(result):
    return summary(result) + "\n\n" + prefill_table(result)


def page(result, images):
    return "\n\n".join([f"Multi-head latent attention, one layer's causal forward over a whole prompt (no cache), "
                        f"{shape(result)} at DeepSeek-V3's widths; {CELLS}. {summary(result)}",
                        *(collapsed("Time against prompt length (chart)", image) for image in images.values()),
                        collapsed("Every prompt length, both paths", prefill_table(result))])


def latent_section(path, result, decode_result=None):
    """The MLA page's prefill run: both paths per prompt length (a row per length), where each is faster, and with
    `decode_result` (a decode run on the same kind of device) which path to use for which call."""
    found, both = naive_faster_from(result)
    device = device_label(result["provenance"]["device"])
    same = decode_result and device_label(decode_result["provenance"]["device"]) == device
    pairs = mla_pairs(decode_result) if same else []
    verdict = (f" So on {device}: **absorbed for decoding** (every decode step recorded on it), **naive for a prefill** "
               + ("at every prompt length measured" if found == both[0] else f"from {found:,} tokens on") + "."
               if found is not None and pairs and all(a["tokens_per_s"] > n["tokens_per_s"] for a, n in pairs) else "")
    return "\n\n".join([f"From the recorded run {run_line(path, result)}: one layer, {shape(result)}; {CELLS}.",
                        prefill_table(result), summary(result) + verdict])


GROUPED_QUERY_CLASSES = ("split_heads", "sdpa_causal", "gqa", "mqa", "flex", "gqa_flex")


def grouped_query_section(path, result):
    """The grouped-query page's recorded run (a default-profile run): at its headline shape, not compiled, each class
    of `GROUPED_QUERY_CLASSES` forward and forward + backward (a row per class), how time followed the FLOPs from
    `sdpa_causal` to `gqa` and `mqa`, and what a custom mask costs through `gqa_flex`."""
    config, modes = result["config"], list(MODE_TITLES)
    rows = {(row["implementation"], mode): row for mode in modes for row in shape_rows(result, mode)
            if not row["compiled"] and core.usable(row)}
    forward, both = ({name: rows[name, mode] for name, kind in rows if kind == mode} for mode in modes)
    lines = [[f"`{name}`", forward[name]["num_kv_heads"] or forward[name]["num_heads"],
              number(forward[name]["flops"] / 1e9), number(forward[name]["ms_median"]), number(both[name]["ms_median"]),
              mebibytes(both[name]["peak_memory_bytes"])] for name in GROUPED_QUERY_CLASSES]
    shares = {name: (forward[name]["flops"] / forward["sdpa_causal"]["flops"],
                     forward[name]["ms_median"] / forward["sdpa_causal"]["ms_median"]) for name in ("gqa", "mqa")}
    measured = {name: {mode: (rows[name, mode]["ms_median"], rows[name, mode]["peak_memory_bytes"] / 2**20)
                       for mode in modes} for name in ("gqa", "gqa_flex", "sdpa_mask", "flex")}
    score_mib = config["batch"] * config["num_heads"] * config["seq_len"] ** 2 * 4 / 2**20  # one (B, H, T, T) float32
    return "\n\n".join([
        f"From the recorded run {run_line(path, result)}: batch {config['batch']}, `T` = {config['seq_len']}, d_model "
        f"{config['d_model']}, {config['num_heads']} query heads.",
        table(["class", "K/V heads", "forward GFLOP", "forward ms", "fwd + bwd ms", "fwd + bwd peak MiB"], lines),
        "Fewer K/V heads shrink the key and value projections, while the attention core, one per query head, stays the "
        "same. " + prose.flops_and_time_sentence("sdpa_causal", shares),
        prose.custom_mask_sentence(path, is_stale(result), measured, score_mib)])
