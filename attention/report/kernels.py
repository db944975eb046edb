"""The kernels sweep's results shown: each attention kernel's rate per prompt length, a table per head size, causal
setting and mode, and the SDPA backend that actually ran (the sweep itself: `attention.bench.sweeps.kernels`).
"""

from attention.bench import core
from attention.bench.sweeps.kernels import NAME
from attention.report.format import number, percent, run_line, status_cell, table

MODE_WORDS = {"forward": "forward", "forward_backward": "forward and backward"}


def kernel_rows(result):
    return (result.get(NAME) or {}).get("rows", [])


def rate_cell(row):
    ran = "" if not row["kernel"].startswith("sdpa") or not row["sdpa_backends"] else f" ({', '.join(row['sdpa_backends'])})"
    return status_cell(row, lambda r: f"{number(r['tflops'])} ({percent(r['share_of_paired_matmul'])}){ran}")


def kernel_tables(result):
    """A table per head size, causal setting and mode: kernels down, prompt lengths across, each cell its TFLOP/s
    (its share of the matmul timed beside it; for SDPA, the backend the profiler saw)."""
    rows, parts = kernel_rows(result), []
    for case in dict.fromkeys((row["head_dim"], row["causal"], row["mode"]) for row in rows):
        chosen = [row for row in rows if (row["head_dim"], row["causal"], row["mode"]) == case]
        lengths = list(dict.fromkeys(row["seq_len"] for row in chosen))
        cells = {(row["kernel"], row["seq_len"]): row for row in chosen}
        lines = [[f"`{kernel}`", *(rate_cell(cells[kernel, T]) if (kernel, T) in cells else "" for T in lengths)]
                 for kernel in dict.fromkeys(row["kernel"] for row in chosen)]
        parts.append(f"**Head size {case[0]}, {'causal' if case[1] else 'not causal'}, {MODE_WORDS[case[2]]}**, "
                     f"TFLOP/s (share of the {result[NAME]['matmul_size']:,}² matmul timed beside it):\n\n"
                     + table(["kernel", *(f"T {T:,}" for T in lengths)], lines, "l" + "r" * len(lengths)))
    return "\n\n".join(parts)


def best_sentence(result):
    """The fastest correct kernel of each table, in words; "" without any measured row."""
    rows = [row for row in kernel_rows(result) if core.usable(row)]
    if not rows:
        return ""
    longest, best = max(row["seq_len"] for row in rows), {}
    for row in (row for row in rows if row["seq_len"] == longest):
        case = (row["head_dim"], row["causal"], row["mode"])
        if case not in best or row["tflops"] > best[case]["tflops"]:
            best[case] = row
    return f"Fastest at T {longest:,}: " + "; ".join(
        f"head size {D}, {'causal' if causal else 'not causal'}, {MODE_WORDS[mode]}: `{row['kernel']}` at "
        f"{number(row['tflops'])} TFLOP/s ({percent(row['share_of_paired_matmul'])})"
        for (D, causal, mode), row in best.items()) + "."


def charts(result):
    return {}


def tables(result):
    return "\n\n".join(part for part in (best_sentence(result), kernel_tables(result)) if part)


def page(result, images, path=None):
    lead = ("The attention kernel alone on prompts, each kernel checked against float64 at a small shape first"
            + (f", from {run_line(path, result)}" if path else "") + ":")
    return "\n\n".join(part for part in (lead, best_sentence(result), kernel_tables(result)) if part)
