"""The sparse sweep's results shown: DeepSeek sparse attention's gather form against dense latent attention by prompt
length and by cached context, the indexer's share of its time, and the crossovers in words (the sweep itself:
`attention.bench.sweeps.sparse`)."""

from attention.bench import core
from attention.bench.sweeps.sparse import KERNELS, NAME, WIDTHS
from attention.report.format import (collapsed, crossover_sentence, mebibytes, nested, number, percent, run_line,
                                     status_cell, table, title_suffix)

KERNEL_WORDS = {"gather": "DSA's gather form", "indexer": "the indexer alone", "mask": "DSA as a mask",
                "absorbed": "dense attention on the absorbed path", "sdpa": "dense attention through SDPA"}
UNITS = {"prefill": "token", "decode": "cached position"}
PART_WORDS = {part: KERNEL_WORDS | {"sdpa": f"{KERNEL_WORDS['sdpa']} ({mode})"} for part, mode in (  # sparse.attend's
    ("prefill", "MHA mode, the latent decompressed"), ("decode", "MQA mode, over the latent"))}


def part_rows(result, part):
    return [row for row in (result.get(NAME) or {}).get("rows", []) if row["part"] == part]


def indexer_sentence(rows, unit):
    """The indexer's share of the gather form's time at the longest length where both were measured."""
    pairs = nested(rows, "seq_len", "kernel")
    both = [T for T, pair in sorted(pairs.items()) if core.usable(pair.get("indexer")) and core.usable(pair.get("gather"))]
    if not both:
        return ""
    first, last = pairs[both[0]], pairs[both[-1]]
    share = [pair["indexer"]["ms_median"] / pair["gather"]["ms_median"] for pair in (first, last)]
    return (f"Choosing costs: the indexer and its top-k take {percent(share[1])} of the gather form's time at "
            f"{both[-1]:,} {unit}s ({percent(share[0])} at {both[0]:,}).")


def mask_sentence(rows):
    """How the mask form compares with dense attention at the longest prompt where both ran."""
    pairs = nested(rows, "seq_len", "kernel")
    both = [T for T, pair in sorted(pairs.items()) if core.usable(pair.get("mask")) and core.usable(pair.get("absorbed"))]
    if not both:
        return ""
    pair = pairs[both[-1]]
    ratio = pair["mask"]["ms_median"] / pair["absorbed"]["ms_median"]
    return (f"The mask form skips nothing: at {both[-1]:,} tokens it takes {ratio:.2f}x the time of dense attention on "
            f"the same path ({number(pair['mask']['ms_median'])} against {number(pair['absorbed']['ms_median'])} ms).")


def summary(result):
    """The crossovers and the indexer's share, in words, each from the run's own rows."""
    prefill, decode = part_rows(result, "prefill"), part_rows(result, "decode")
    return " ".join(part for part in (
        crossover_sentence(prefill, "gather", "sdpa", UNITS["prefill"], PART_WORDS["prefill"]),
        indexer_sentence(prefill, UNITS["prefill"]),
        mask_sentence(prefill),
        crossover_sentence(decode, "gather", "absorbed", UNITS["decode"], KERNEL_WORDS),
        crossover_sentence(decode, "gather", "sdpa", UNITS["decode"], PART_WORDS["decode"]),
        indexer_sentence(decode, UNITS["decode"])) if part)


def cell(row):
    return status_cell(row, lambda r: f"{number(r['ms_median'])} ms · {number(r['tflops'])} TFLOP/s · "
                                      f"{percent(r['share_of_paired_matmul'])}")


def across(rows, label):
    """A table of `rows`: one line per kernel, one column per length."""
    by_kernel = nested(rows, "kernel", "seq_len")
    lengths = sorted({row["seq_len"] for row in rows})
    lines = [[f"`{kernel}`", *(cell(by_kernel[kernel][T]) if T in by_kernel[kernel] else "" for T in lengths)]
             for kernel in KERNELS if kernel in by_kernel]
    return table([label, *(f"T {T:,}" for T in lengths)], lines, "l" + "r" * len(lengths))


def times_table(result, part):
    """Median time (ms) per length (a line each) and kernel (a column each); decoding, the cache bytes each step reads."""
    pairs = nested(part_rows(result, part), "seq_len", "kernel")
    kernels = [kernel for kernel in KERNELS if any(kernel in pair for pair in pairs.values())]
    decoding = part == "decode"

    def text(row):
        return number(row["ms_median"]) + (f" · {mebibytes(row['memory_bytes'])} MiB" if decoding else "")

    lines = [[f"{T:,}", *(status_cell(pair.get(kernel), text) for kernel in kernels)] for T, pair in sorted(pairs.items())]
    first = "cached positions" if decoding else "T (prompt)"
    return table([first, *(f"{kernel} ms" + (" · MiB read" if decoding else "") for kernel in kernels)], lines,
                 "r" * (len(kernels) + 1))


def shape(result):
    return ("batch {batch}, {num_heads} query heads over one latent of {kv_lora_rank} (and {qk_rope_head_dim} rotary), "
            "an indexer of {index_n_heads} heads of {index_head_dim}, top-k {top_k:,}").format(**result[NAME], **WIDTHS)


def plot(result, part):
    """Each kernel's median time against the length (log-log)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    by_kernel = nested(part_rows(result, part), "kernel", "seq_len")
    for kernel, marker in zip(KERNELS, "os^Dv"):
        points = sorted((T, row["ms_median"]) for T, row in by_kernel.get(kernel, {}).items() if core.usable(row))
        if points:
            ax.plot(*zip(*points), marker=marker, label=PART_WORDS[part][kernel])
    ax.set_xscale("log", base=2)
    what = "prompt length T (tokens)" if part == "prefill" else "cached positions"
    ax.set(yscale="log", xlabel=what, ylabel="ms per " + ("prompt" if part == "prefill" else "step") + " (median)")
    ax.grid(True, which="both", alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8)  # below the axes: the lines cross every corner
    fig.suptitle(f"DSA and dense latent attention, {part}: {title_suffix(result)}", fontsize=10)
    return fig


def charts(result):
    return {part: (plot(result, part), f"{part.capitalize()} time of DeepSeek sparse attention's gather form, its "
                   f"indexer alone, its mask form and dense latent attention against "
                   f"{'prompt length' if part == 'prefill' else 'the cached context'}, {title_suffix(result)}")
            for part in ("prefill", "decode") if any(core.usable(row) for row in part_rows(result, part))}


CELLS = "each cell: median time, TFLOP/s and the share of the matmul timed beside the row"


def tables(result):
    return "\n\n".join(part for part in (summary(result), across(part_rows(result, "prefill"), "prefill"),
                                         across(part_rows(result, "decode"), "decode")) if part)


def page(result, images, path=None):
    """The Benchmarks page's section: where the gather form overtakes dense attention, prefill and decode, in words;
    the rest (the indexer's share, the mask form, every row) collapsed."""
    prefill, decode = part_rows(result, "prefill"), part_rows(result, "decode")
    lead = " ".join(part for part in (
        crossover_sentence(prefill, "gather", "sdpa", UNITS["prefill"], PART_WORDS["prefill"]),
        crossover_sentence(decode, "gather", "absorbed", UNITS["decode"], KERNEL_WORDS)) if part)
    charts = "\n\n".join(images.values())
    details = (f"One DeepSeek-V3.2 layer's attention after its projections, {shape(result)}, each row checked against "
               "float64 first" + (f", from {run_line(path, result)}" if path else "") + f"; {CELLS}.\n\n"
               + summary(result) + "\n\n" + across(prefill, "prefill") + "\n\n" + across(decode, "decode"))
    return "\n\n".join([lead, *([collapsed("Time against prompt length and against context (charts)", charts)]
                                 if charts else []),
                        collapsed("Every crossover, the indexer's share, every row", details)])


def sparse_section(path, result):
    """The Sparse attention page's recorded run: the crossovers and the indexer's share in words, then each part's
    time per kernel."""
    return "\n\n".join([f"From the recorded run {run_line(path, result)}: one DeepSeek-V3.2 layer's attention after "
                        f"its projections, {shape(result)}, each row checked against float64 first.",
                        summary(result), times_table(result, "prefill"), times_table(result, "decode")])
