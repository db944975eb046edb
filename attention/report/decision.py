"""The home page's decision table: per task and device, the class to use and why, from the recorded runs' numbers."""

from attention.bench.results import is_stale
from attention.report.block_sparse import crossovers
from attention.report.decode import decode_rows
from attention.report.compare import headline_rows
from attention.report.format import reader_device, table
from attention.report.sequence import fastest, kernel_kind, leaders

DECISION_DEVICES = {"cpu": "CPU", "cuda": "NVIDIA GPU"}
NOT_MEASURED = "not measured yet"
# Why the named classes are fast, by how their attention handles the (T, T) scores (`kernel_kind`).
WHY = {"fused": "fused kernels, which never write the (T, T) scores out",
       "tiled": "tiles, which never hold the whole (T, T) scores", "written out": "though it writes the (T, T) scores out"}


def where(results):
    """The devices (as readers name them) and dtypes of `results`: "AMD EPYC, 2 cores (float32, bfloat16)"."""
    devices = {}
    for result in results:
        devices.setdefault(reader_device(result["provenance"]["device"]), []).append(result["dtype"])
    return " and ".join(f"{device} ({', '.join(dtypes)})" for device, dtypes in devices.items())


def ordered(runs):
    """`runs` (`[(name, result)]`) by device, float32 first, and a closing clause where any predates the code."""
    results = sorted((result for _, result in runs), key=lambda r: (reader_device(r["provenance"]["device"]),
                                                                    r["dtype"] != "float32"))
    return results, " (Recorded with older code.)" if any(map(is_stale, results)) else ""


def why(kinds, stale):
    """Why the named classes are fast, from how they handle the scores (`WHY`), and the stale clause."""
    return ": " + ", ".join(WHY[kind] for kind in sorted(kinds)) + "." + stale


def _winners_cell(runs, mode):
    """Each run's answer at its headline shape in `mode` (`leaders`: one class, or the tied ones), runs with the same
    answer together, then why, from how the named classes handle the scores."""
    (results, stale), answers, kinds = ordered(runs), {}, set()
    for result in results:
        config = result["config"]
        for entry in fastest(result):
            if (entry["mode"], entry["batch"], entry["seq_len"], entry["compiled"]) == (
                    mode, config["batch"], config["seq_len"], False):
                answers.setdefault(leaders(entry), []).append(result)
                kinds |= {kernel_kind(row, mode, result["device_type"]) for row in [entry["fastest"], *entry["tied"]]}
    if not answers:
        return NOT_MEASURED
    return "; ".join(f"{answer} on {where(results)}" for answer, results in answers.items()) + why(kinds, stale)


def _pair_cell(runs, one, other):
    """Training time of two classes (labels `one`, `other`) in each run that has both, at its headline shape, the
    faster first, and why it is."""
    (results, stale), cells, kinds = ordered(runs), [], set()
    for result in results:
        rows = headline_rows(result, "forward_backward")
        if one in rows and other in rows:
            first, second = sorted((rows[one], rows[other]), key=lambda row: row["ms_median"])
            cells.append(f"`{first['label']}` trains in {first['ms_median']:,.0f} ms, `{second['label']}` in "
                         f"{second['ms_median']:,.0f} on {where([result])}")
            kinds.add(kernel_kind(first, "forward_backward", result["device_type"]))
    return "; ".join(cells) + why(kinds, stale) if cells else NOT_MEASURED


def _decode_cell(decode_runs):
    """The `gqa` layer's best decode kernel at batch 1 and the longest context, in tokens/s of one layer, the runs of
    one device and kernel together."""
    (results, stale), answers = ordered(decode_runs), {}
    for result in results:
        rows = decode_rows(result, batch=1, model="GQA")
        if not rows:
            continue
        context = max(row["context"] for row in rows)
        by_kernel = {row["kernel"]: row for row in rows if row["context"] == context and row["kernel"] != "auto"}
        best = max(by_kernel.values(), key=lambda row: row["tokens_per_s"])  # `auto` times these, keeps the faster
        others = ", ".join(f"`{kernel}` {row['tokens_per_s']:,.0f}" for kernel, row in by_kernel.items() if row is not best)
        answer = (f"`gqa` (its default, `decode_kernel=\"auto\"`, times the kernels where it runs: `{best['kernel']}` "
                  f"was the faster here) on "
                  f"{reader_device(result['provenance']['device'])}: one attention layer ({best['num_heads']} query "
                  f"heads of {best['head_dim']}, {best['num_kv_heads']} K/V heads), batch 1, a {context:,}-token cache")
        answers.setdefault(answer, []).append(f"{best['tokens_per_s']:,.0f} tokens/s in {result['dtype']}"
                                              + (f" (against {others})" if others else ""))
    return ("; ".join(f"{answer}: {', '.join(values)}" for answer, values in answers.items()) + ". A model runs this "
            "once per layer. A step is memory-bound, and the grouped matmuls read each K/V head once for its whole "
            "group of query heads." + stale if answers else NOT_MEASURED)


def _mask_cell(long_runs):
    """Where a `BlockMask` overtakes a dense boolean mask, per pattern, from the long runs' block-sparse sweeps."""
    (results, stale), cells = ordered(long_runs), []
    for result in results:
        found = crossovers(result)
        if not found:
            continue
        sparse = [f"{pattern.replace('_', ' ')} from `T = {entry['crossover']:,}`"
                  for pattern, entry in found.items() if entry["crossover"] and pattern != "causal"]
        never = [pattern.replace("_", " ") for pattern, entry in found.items() if not entry["crossover"]]
        cells.append("`sdpa_mask` or `MultiHeadAttention` (a boolean mask through SDPA) for short sequences; `flex` "
                     "with a `BlockMask` once it skips enough blocks: " + ", ".join(sparse)
                     + (f" (not within the lengths measured: {', '.join(never)})" if never else "")
                     + f", forward, on {where([result])}")
    return ("; ".join(cells) + ", as FlexAttention pays per block it computes, not per pair. Plain causal attention "
            "needs no mask: `sdpa_causal` (`is_causal=True`) skips the blocks above the diagonal too." + stale if cells
            else NOT_MEASURED)


def decision_table(runs, decode_runs, long_runs):
    """Markdown: the home page's "Which one should I use?" table, one row per use and one column per device
    type, each cell read from the recorded runs of that device (`{device type: [(file name, result), ...]}` each:
    default profile, decode profile, long profile), naming the devices and saying why, or "not measured yet"."""
    rows = {
        "Training (forward + backward)": lambda kind: _winners_cell(runs[kind], "forward_backward"),
        "Prefill (a prompt's forward pass, no cache yet)": lambda kind: _winners_cell(runs[kind], "forward"),
        "Decoding with a KV cache": lambda kind: _decode_cell(decode_runs[kind]),
        "A GQA model (fewer K/V heads)": lambda kind: _pair_cell(runs[kind], "gqa", "gqa_flex"),
        "A custom mask": lambda kind: _mask_cell(long_runs[kind]),
    }
    return table(["You want", *DECISION_DEVICES.values()],
                 [[use, *map(cell, DECISION_DEVICES)] for use, cell in rows.items()], "l" * (1 + len(DECISION_DEVICES)))


def split_by_device(named_results):
    """`{device type: [(name, result), ...]}` for every `DECISION_DEVICES` type (empty where none)."""
    split = {kind: [] for kind in DECISION_DEVICES}
    for name, result in named_results:
        split.setdefault(result["device_type"], []).append((name, result))
    return split
