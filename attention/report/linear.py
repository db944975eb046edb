"""The linear sweep's results shown: the gated delta rule's forms against SDPA by prompt length, the chunk size, and a
decode step over a state against one over a KV cache, with the crossovers in words (the sweep itself:
`attention.bench.sweeps.linear`)."""

from attention.bench import core
from attention.bench.sweeps.linear import DECODE_KERNELS, NAME, PREFILL_KERNELS
from attention.report.format import (collapsed, crossover_sentence, mebibytes, nested, number, percent, run_line,
                                     status_cell, table, title_suffix)

KERNEL_WORDS = {"recurrent": "the recurrent form", "chunked": "the chunked form", "quadratic": "the quadratic form",
                "sdpa": "SDPA's causal attention", "state_step": "the state step", "kv_cache_step": "the KV cache step"}


def part_rows(result, part):
    return [row for row in (result.get(NAME) or {}).get("rows", []) if row["part"] == part]


def cell(row):
    return status_cell(row, lambda r: f"{number(r['ms_median'])} ms · {number(r['tflops'])} TFLOP/s · "
                                      f"{percent(r['share_of_paired_matmul'])}")


def across(rows, key, header, label):
    """A table of `rows`: one line per kernel, one column per `key` value (`header` names it)."""
    by_kernel = nested(rows, "kernel", key)
    values = list(dict.fromkeys(row[key] for row in sorted(rows, key=lambda row: row[key])))
    lines = [[f"`{kernel}`", *(cell(cells[value]) if value in cells else "" for value in values)]
             for kernel, cells in by_kernel.items()]
    return table([label, *(f"{header} {value:,}" for value in values)], lines, "l" + "r" * len(values))


def chunk_sentence(result):
    rows = [row for row in part_rows(result, "chunk") if core.usable(row)]
    if not rows:
        return ""
    best, worst = min(rows, key=lambda row: row["ms_median"]), max(rows, key=lambda row: row["ms_median"])
    return (f"At {best['seq_len']:,} tokens the fastest chunk is {best['chunk_size']} positions "
            f"({number(best['ms_median'])} ms); the slowest measured, {worst['chunk_size']}, takes "
            f"{worst['ms_median'] / best['ms_median']:.2f}x as long.")


def decode_table(result):
    """Per context: each step's median time and the bytes it reads that are not weights."""
    pairs = nested(part_rows(result, "decode"), "seq_len", "kernel")
    lines = [[f"{T:,}", *(status_cell(pair.get(kernel), lambda r: f"{number(r['ms_median'])} ms · "
                                                                    f"{mebibytes(r['memory_bytes'])} MiB")
                          if pair.get(kernel) else "" for kernel in DECODE_KERNELS)]
             for T, pair in pairs.items()]
    return table(["cached positions", "state step", "KV cache step"], lines, "rrr")


def shape(result):
    config = result[NAME]
    return f"batch {config['batch']}, {config['num_heads']} heads of {config['head_dim']}"


def summary(result):
    """The crossovers, in words, each from the run's own rows."""
    prefill, decode = part_rows(result, "prefill"), part_rows(result, "decode")
    return " ".join(part for part in (
        crossover_sentence(prefill, "chunked", "sdpa", "token", KERNEL_WORDS),
        crossover_sentence(prefill, "chunked", "recurrent", "token", KERNEL_WORDS),
        chunk_sentence(result),
        crossover_sentence(decode, "state_step", "kv_cache_step", "cached position", KERNEL_WORDS)) if part)


def plot_prefill(result):
    """Each prefill kernel's median time against the prompt length (log-log)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    by_kernel = nested(part_rows(result, "prefill"), "kernel", "seq_len")
    for kernel, marker in zip(PREFILL_KERNELS, "os^D"):
        points = sorted((T, row["ms_median"]) for T, row in by_kernel.get(kernel, {}).items() if core.usable(row))
        if points:
            ax.plot(*zip(*points), marker=marker, label=KERNEL_WORDS[kernel])
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="prompt length T (tokens)", ylabel="ms per prompt (median)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"Gated delta rule and SDPA, {shape(result)}: {title_suffix(result)}", fontsize=10)
    return fig


def charts(result):
    if not any(core.usable(row) for row in part_rows(result, "prefill")):
        return {}
    return {"prefill": (plot_prefill(result), f"Prompt time of the gated delta rule's recurrent, chunked and quadratic "
                                              f"forms and of SDPA's causal attention against prompt length, "
                                              f"{title_suffix(result)}")}


CELLS = "each cell: median time, TFLOP/s and the share of the matmul timed beside the row"


def tables(result):
    return "\n\n".join(part for part in (
        summary(result), across(part_rows(result, "prefill"), "seq_len", "T", "kernel"),
        across(part_rows(result, "chunk"), "chunk_size", "chunk", "kernel"), decode_table(result)) if part)


def page(result, images, path=None):
    """The Benchmarks page's section: where the chunked form overtakes SDPA, in words; the rest (every crossover, every
    row) collapsed."""
    prefill = part_rows(result, "prefill")
    lead = crossover_sentence(prefill, "chunked", "sdpa", "token", KERNEL_WORDS)  # the others: `summary`, collapsed
    details = (f"The attention core alone, {shape(result)}, each row checked against the rule's float64 definition first"
               + (f", from {run_line(path, result)}" if path else "") + f"; {CELLS}.\n\n" + summary(result))
    return "\n\n".join([lead, *(collapsed("Time against prompt length (chart)", image) for image in images.values()),
                        collapsed("Every crossover, every prompt length, each chunk size, a decode step: the state "
                                  "against the KV cache",
                                  "\n\n".join([details, across(prefill, "seq_len", "T", "kernel"),
                                                across(part_rows(result, "chunk"), "chunk_size", "chunk", "kernel"),
                                                decode_table(result)]))])


def times_table(result):
    """The prompt's median time (ms) per length (a line each) and kernel (a column each): the page's compact table."""
    pairs = nested(part_rows(result, "prefill"), "seq_len", "kernel")
    kernels = [kernel for kernel in PREFILL_KERNELS if any(kernel in pair for pair in pairs.values())]
    lines = [[f"{T:,}", *(status_cell(pair.get(kernel), lambda r: number(r["ms_median"])) for kernel in kernels)]
             for T, pair in pairs.items()]
    return table(["T (prompt)", *(f"{kernel} ms" for kernel in kernels)], lines, "r" * (len(kernels) + 1))


def linear_section(path, result):
    """The Linear attention page's recorded run: where the chunked form overtakes SDPA and the state step the KV cache
    step, in words, then each prompt's time per form and a decode step's per context."""
    config = result[NAME]
    recurrent, quadratic = config["recurrent_max_len"], config["quadratic_max_len"]
    limits = (f"forms timed to {recurrent:,} tokens" if recurrent == quadratic
              else f"forms timed to {recurrent:,} and {quadratic:,} tokens")
    return "\n\n".join([f"From the recorded run {run_line(path, result)}: the attention core alone, {shape(result)}, "
                        "each row checked against the rule's float64 definition first; the recurrent and quadratic "
                        f"{limits}.",
                        summary(result),
                        times_table(result), decode_table(result)])
