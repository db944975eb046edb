"""The block-sparse sweep's results shown: FlexAttention against SDPA with a dense mask per pattern and length, the
crossovers, tables, charts and its section of the Benchmarks page (the sweep: `attention.bench.sweeps.block_sparse`).
"""

import math

from attention.bench import core
from attention.bench.sweeps.block_sparse import KERNELS, NAME
from attention.report.format import collapsed, mebibytes, nested, number, percent, status_cell, table, title_suffix


def block_sparse_rows(result, pattern=None):
    """The run's block-sparse rows (of one `pattern`, or all); `[]` for runs without them."""
    return [row for row in (result.get(NAME) or {}).get("rows", []) if pattern in (None, row["pattern"])]


def pairs_by_length(result, pattern):
    """`{seq_len: {kernel: row}}` of one pattern, lengths ascending."""
    return nested(block_sparse_rows(result, pattern), "seq_len", "kernel")


def crossovers(result):
    """Per pattern, where the block-sparse kernel overtakes the dense mask, read from the measurements:
    `{pattern: {"crossover", "longest", "speedup", "block_share", "mask_density", "flex_ms", "dense_ms"}}`;
    `crossover` is the shortest length from which FlexAttention is faster at that length and every longer
    one (None if not at the longest); `speedup` the dense time over Flex's at the longest length both ran."""
    found = {}
    for pattern in (result.get(NAME) or {}).get("patterns", {}):
        both = [(t, pair["flex_block_mask"], pair["sdpa_dense_mask"]) for t, pair in pairs_by_length(result, pattern).items()
                if core.usable(pair.get("flex_block_mask")) and core.usable(pair.get("sdpa_dense_mask"))]
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
    """Per pattern: the speed-up at the longest length, the crossover length, blocks computed and both times."""
    return table(["pattern", "speed-up", "at T", "Flex faster from", "blocks computed", "pairs attended", "Flex ms",
                  "dense SDPA ms"],
                 [[pattern, f"{found['speedup']:.2f}x", found["longest"], f"T={found['crossover']}" if found["crossover"]
                   else "not within the lengths measured", percent(found["block_share"]), percent(found["mask_density"]),
                   number(found["flex_ms"]), number(found["dense_ms"])] for pattern, found in crossovers(result).items()])


def causal_note(result):
    """For the causal pattern, FlexAttention's kernel against `sdpa_causal` (`is_causal=True`, no mask) at the longest
    length both ran, where the run's sequence sweep has it at the same batch and heads; else ""."""
    flex = {row["seq_len"]: row for row in block_sparse_rows(result, "causal") if row["kernel"] == "flex_block_mask"
            and core.usable(row)}
    sdpa = {row["seq_len"]: row for row in result.get("rows", []) if row["label"] == "sdpa_causal" and row["mode"] ==
            "forward" and core.usable(row) and (row["batch"], row["num_heads"], row["head_dim"]) ==
            (result[NAME]["batch"], result[NAME]["num_heads"], result[NAME]["head_dim"])}
    if not set(flex) & set(sdpa):
        return ""
    t = max(set(flex) & set(sdpa))
    return (f"Causal attention needs no mask at all: `sdpa_causal` (`is_causal=True`, which skips the blocks above the "
            f"diagonal too) takes {number(sdpa[t]['ms_median'])} ms at T={t} in this run's forward sweep, a whole layer "
            f"with its projections, against {number(flex[t]['ms_median'])} ms for FlexAttention's kernel alone.")


def block_sparse_table(result, pattern=None):
    """Per pattern and length: the speed-up, both kernels' median time, blocks computed and memory."""
    patterns, parts = (result.get(NAME) or {}).get("patterns", {}), []
    for name in [pattern] if pattern else patterns:
        lines = []
        for t, pair in pairs_by_length(result, name).items():
            flex, dense = pair.get("flex_block_mask"), pair.get("sdpa_dense_mask")
            memory = lambda r: f"{mebibytes(r['peak_memory_bytes'])} ({mebibytes(r['mask_bytes'])})"  # noqa: E731
            lines.append([t, f"{dense['ms_median'] / flex['ms_median']:.2f}x" if core.usable(flex) and core.usable(dense)
                          else "—", status_cell(flex, lambda r: number(r["ms_median"])),
                          status_cell(dense, lambda r: number(r["ms_median"])), percent((flex or dense)["mask_density"]),
                          percent(flex["block_share"]) if flex else "—", status_cell(flex, memory), status_cell(dense, memory)])
        parts.append(f"**{name}**: {patterns[name]}\n\n" + table(
            ["T", "speed-up", "Flex ms", "dense SDPA ms", "pairs attended", "blocks computed", "Flex MiB (BlockMask)",
             "dense MiB (mask)"], lines, "r" * 8))
    return "\n\n".join(parts)


def plot_block_sparse(result):
    """Per pattern, both kernels' median time against T (log-log), the crossover marked."""
    from matplotlib.figure import Figure

    section = result.get(NAME) or {}
    patterns, found = list(section.get("patterns", {})), crossovers(result)
    fig = Figure(figsize=(9, 3.4 * max(1, math.ceil(len(patterns) / 2))), layout="constrained")
    axes = fig.subplots(max(1, math.ceil(len(patterns) / 2)), 2, squeeze=False).ravel()
    for ax, pattern in zip(axes, patterns):
        for kernel, marker in zip(KERNELS, "os"):
            points = [(t, pair[kernel]["ms_median"]) for t, pair in pairs_by_length(result, pattern).items()
                      if core.usable(pair.get(kernel))]
            if points:
                ax.plot(*zip(*points), marker=marker, markersize=4, label=KERNELS[kernel])
        if found.get(pattern, {}).get("crossover"):
            crossover = found[pattern]["crossover"]
            ax.axvline(crossover, color="k", linestyle=":", linewidth=1, label=f"Flex faster from T={crossover}")
        ax.set_xscale("log", base=2)
        ax.set(yscale="log", title=pattern, xlabel="sequence length T", ylabel="ms per call (median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(patterns):]:
        ax.set_visible(False)
    fig.suptitle(f"Block-sparse FlexAttention against a dense SDPA mask, forward, B={section.get('batch')}, "
                 f"{section.get('num_heads')} heads of {section.get('head_dim')}: {title_suffix(result)}", fontsize=10)
    return fig


def charts(result):
    return {"block-sparse": (plot_block_sparse(result), "FlexAttention with a BlockMask against SDPA with a dense mask, "
                             f"time against sequence length per mask pattern, {title_suffix(result)}")}


def tables(result):
    return crossover_table(result) + "\n\n" + block_sparse_table(result)


def page(result, images):
    section = result[NAME]
    return "\n\n".join([
        f"Block sparsity, forward, batch {section['batch']}, {section['num_heads']} heads of {section['head_dim']}: "
        "where FlexAttention with a `BlockMask` overtakes SDPA with the same mask as a dense boolean tensor, read from "
        "the measurements.", crossover_table(result), causal_note(result),
        *(collapsed("Time against sequence length, per pattern (chart)", image) for image in images.values()),
        collapsed("Every length, both kernels", block_sparse_table(result))])
