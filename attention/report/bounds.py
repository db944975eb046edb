"""The bounds sweep's results shown: PyTorch's kernels alone against the yardsticks, in a table and in sentences that
say what in the other profiles' shares is PyTorch's and what is the implementation's (the sweep itself:
`attention.bench.sweeps.bounds`).
"""

from attention.bench import core
from attention.bench.sweeps.bounds import KERNELS, NAME
from attention.machine import cpu_features_label
from attention.report.format import number, percent, run_line, status_cell, table

UNIT_NAMES = {"matmul": "TFLOP/s", "read": "GB/s"}
YARDSTICK_NAMES = {"matmul": "matmul", "read": "sum"}


def bound_rows(result):
    return (result.get(NAME) or {}).get("rows", [])


def shape_text(row):
    if row["bound"] == "matmul":
        return f"B {row['batch']}, {row['num_heads']} heads of {row['head_dim']}, T {row['keys']:,}"
    return f"B {row['batch']}, {row['num_heads']} heads of {row['head_dim']}, 1 query over {row['keys']:,} positions"


def bounds_table(result):
    lines = [[f"`{row['kernel']}`", shape_text(row), status_cell(row, lambda r: number(r["ms_median"])),
              status_cell(row, lambda r: f"{number(r['rate'])} {UNIT_NAMES[r['bound']]}"),
              status_cell(row, lambda r: f"{number(r['yardstick_rate_paired'])} {UNIT_NAMES[r['bound']]} "
                                         f"({YARDSTICK_NAMES[r['bound']]})"),
              status_cell(row, lambda r: percent(r["share_of_paired_yardstick"]))] for row in bound_rows(result)]
    return table(["kernel", "shape", "ms", "rate", "yardstick beside it", "share"], lines, "llrrrr")


def bfloat16_words(flags):
    """How this CPU multiplies bfloat16 matrices, from its flags (`machine.cpu_flags`)."""
    if flags is None:
        return "its instruction-set flags were not recorded"
    if "amx_bf16" in flags:
        return "bfloat16 matrices multiply on AMX tiles"
    if "avx512_bf16" in flags:
        return "bfloat16 matrices multiply with AVX-512 BF16 dot products (no AMX)"
    return "no instruction multiplies bfloat16 numbers (neither AMX nor AVX-512 BF16): PyTorch widens them to float32 first"


def prompt_sentence(result, row):
    """What a prompt's (prefill's) share of the paired matmul owes to PyTorch's SDPA kernel, from the run."""
    dtype, flags = result["dtype"], result["provenance"]["device"].get("cpu_flags")
    text = (f"**A prompt.** PyTorch's causal SDPA kernel alone ({shape_text(row)}, no projection) ran at "
            f"{number(row['rate'])} TFLOP/s, {percent(row['share_of_paired_yardstick'])} of the {dtype} matmul "
            f"({result[NAME]['matmul_size']:,}²) timed beside it.")
    if dtype == "bfloat16":
        text += f" On this CPU ({cpu_features_label(flags)}), {bfloat16_words(flags)}."
    text += (" The classes' shares on the sequence, long and prefill tabs count their projections too, which run at "
             "about the matmul's rate; the attention of a class that calls this kernel runs no faster than it. What "
             "separates this share from 100% is PyTorch's kernel on this machine, not this project's code.")
    goal = {"float32": 0.9, "bfloat16": 0.6}.get(dtype)
    if goal is not None and row["share_of_paired_yardstick"] < goal:
        text += (f" So {percent(goal)} of the paired matmul in {dtype} is not a goal for a class built on PyTorch's "
                 "kernels here; the project's own kernels are the GPU's (Triton).")
    return text


def decode_sentence(rows):
    """What a decode step's share of the paired read owes to PyTorch's operations, from the run's read rows at one
    cache length."""
    best, *others = sorted(rows, key=lambda row: -row["share_of_paired_yardstick"])
    text = (f"**A decode step.** Over a cache of {best['keys']:,} positions ({shape_text(best).split(', 1 query')[0]}), "
            f"the fastest single PyTorch operation here is `{best['kernel']}` at {number(best['rate'])} GB/s, "
            f"{percent(best['share_of_paired_yardstick'])} of the plain read timed beside it")
    text += "".join(f"; `{row['kernel']}` reads at {number(row['rate'])} GB/s "
                    f"({percent(row['share_of_paired_yardstick'])})" for row in others)
    return text + (". A decode step reads its cache through operations like these (at its own shapes) and its "
                   "weights through `F.linear`: what separates this share from 100% is how PyTorch's operations read "
                   "memory on this machine, not this project's code.")


def sentences(result):
    usable = [row for row in bound_rows(result) if core.usable(row)]
    parts = [prompt_sentence(result, row) for row in usable if row["bound"] == "matmul"]
    for keys in dict.fromkeys(row["keys"] for row in usable if row["bound"] == "read"):
        parts.append(decode_sentence([row for row in usable if row["bound"] == "read" and row["keys"] == keys]))
    return parts


def charts(result):
    return {}


def tables(result):
    return "\n\n".join([bounds_table(result), *sentences(result)])


def page(result, images, path=None):
    """The run's section of the Benchmarks page: what each kernel is, the table, then the sentences."""
    lead = ("PyTorch's kernels alone, each timed beside the yardstick the other profiles measure against ("
            + "; ".join(f"`{name}`: `{kernel.call}` over {kernel.over}" for name, kernel in KERNELS.items())
            + ")"
            + (f", from {run_line(path, result)}" if path else "") + ":")
    return "\n\n".join([lead, bounds_table(result), *sentences(result)])
