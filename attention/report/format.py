"""Words and numbers for the tables (number formats, the device's identity, Markdown blocks, the provenance
note), so that a number or a device reads the same everywhere. Nothing here measures; strings from a results file
arrive escaped (`attention.bench.results.escaped`)."""

import math
import re
import textwrap

from attention.bench.core import usable
from attention.bench.metrics import CONTENDED_BELOW
from attention.machine import cpu_features_label
from attention.bench.results import all_rows, changed_sources, is_stale

MODE_TITLES = {"forward": "forward", "forward_backward": "forward + backward"}


def number(value, digits=3):
    """`value` with `digits` significant digits and thousands separators; "—" for None."""
    if value is None:
        return "—"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def nested(rows, outer, inner):
    """`{row[outer]: {row[inner]: row}}` of `rows`, the outer keys ascending (a sweep's rows by size, then by kernel)."""
    grouped = {}
    for row in rows:
        grouped.setdefault(row[outer], {})[row[inner]] = row
    return dict(sorted(grouped.items()))


def faster_from(rows, fast, slow):
    """The shortest measured length from which `fast`'s median is below `slow`'s at that length and every longer one
    where both were measured (None where it never is), and the lengths where both were measured."""
    pairs = nested(rows, "seq_len", "kernel")
    both = sorted(T for T, pair in pairs.items() if usable(pair.get(fast)) and usable(pair.get(slow)))
    from_ = [T for i, T in enumerate(both) if all(pairs[U][fast]["ms_median"] < pairs[U][slow]["ms_median"]
                                                  for U in both[i:])]
    return (from_[0] if from_ else None), both, pairs


def crossover_sentence(rows, fast, slow, unit, words):
    """Where kernel `fast` overtakes `slow` (rows keyed by `seq_len` and `kernel`; `words` names each kernel), in
    words, from the measured rows; "" where they share no length."""
    found, both, pairs = faster_from(rows, fast, slow)
    if not both:
        return ""
    last = pairs[both[-1]]
    ratio = last[slow]["ms_median"] / last[fast]["ms_median"]
    where = ("at every length measured" if found == both[0] else
             f"from {found:,} {unit}s on" if found is not None else "at no length measured")
    name = words[fast]
    return (f"{name[0].upper() + name[1:]} is faster than {words[slow]} {where} (of {both[0]:,} to {both[-1]:,} "
            f"{unit}s); at {both[-1]:,} it takes {number(last[fast]['ms_median'])} ms against "
            f"{number(last[slow]['ms_median'])} ms ({ratio:.2f}x).")


def mebibytes(value):
    return "—" if value is None else f"{value / 2**20:,.1f}"


def percent(share):
    return "—" if share is None else f"{share * 100:.0f}%"


def table(header, rows, align=None):
    """A Markdown table; `align` has an "l" or "r" per column (default: the first left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "|".join("---" if a == "l" else "--:" for a in align) + "|"]
                     + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def status_cell(row, text):
    """A table cell: `text(row)` for a measured row, else why there is no number ("" for no row, "OOM", "skipped",
    "failed", "incorrect")."""
    if row is None or row["status"] != "ok":
        return "" if row is None else "OOM" if row["reason"] == "out of memory" else row["status"]
    return "incorrect" if row["correct"] is False else text(row)


def collapsed(title, body, kind="note"):
    """A collapsed admonition (pymdownx.details) holding `body`."""
    return f'??? {kind} "{title}"\n\n' + textwrap.indent(body, "    ")


def short_cpu(name, vendor=False):
    """A CPU model as people say it: "Intel(R) Xeon(R) Processor" -> "Xeon", "AMD EPYC 7R13 Processor" -> "EPYC 7R13"
    ("Intel Xeon", "AMD EPYC 7R13" with `vendor`)."""
    name = re.sub(r"\((R|TM)\)|\b(Processor|CPU)\b|\b\d+-Core\b|@.*" + ("" if vendor else r"|\b(Intel|AMD)\b"), " ", name)
    return " ".join(name.split()) or name


def reader_device(device):
    """A device as its owner names it: "AMD EPYC, 2 cores" (a CPU, its logical cores), a GPU by its name."""
    return device["name"] if device["type"] != "cpu" else f"{short_cpu(device['cpu'], True)}, {device['cpu_count']} cores"


def device_label(device):
    """The identity a reader matches a run to: for a CPU its model and what sets its matmul speed ("Xeon, AMX",
    "EPYC, AVX2", "Xeon, flags unknown" for runs recorded before the flags were); for a GPU its name."""
    if device["type"] != "cpu":
        return device["name"]
    return f"{short_cpu(device['cpu'])}, {cpu_features_label(device.get('cpu_flags'))}"


def devices_line(results):
    """One sentence counting the devices `results` (`[(name, result)]`) come from, by their identity."""
    labels = sorted({f"{device_label(r['provenance']['device'])} ({r['device_type']}, "
                     f"{r['provenance']['device']['cpu_count']} logical cores)" for _, r in results})
    if not labels:
        return "No results recorded yet."
    count = "one device" if len(labels) == 1 else f"{len(labels)} devices"
    return (f"All numbers on this page so far come from {count}, told apart by CPU model and the instructions "
            f"that set its matmul speed (AVX2, AVX-512, AMX): " + "; ".join(labels) + ".")


def run_device(result):
    """The run's device as a reader knows it; a run from before CPU flags were kept says so, not "flags unknown"."""
    device = result["provenance"]["device"]
    if device["type"] == "cpu" and device.get("cpu_flags") is None:
        return f"{short_cpu(device['cpu'])} (recorded before CPU flags were kept)"
    return device_label(device)


def run_line(path, result):
    """A run in one phrase: its file where `path` is given (marked stale where the code changed since), else its
    profile and whether it predates the current code; its device (`run_device`), dtype and date."""
    stale, date = is_stale(result), result["provenance"]["date_utc"][:10]
    if path is None:
        return (f"{run_device(result)}, {result['dtype']}, {result['profile']} profile, recorded {date}"
                + (" (predates the current code)" if stale else ""))
    return f"`{path}`" + (" (stale)" if stale else "") + f": {run_device(result)}, {result['dtype']}, recorded {date}"


def title_suffix(result):
    return f"{device_label(result['provenance']['device'])}, {result['dtype']}"


def provenance_summary(result):
    """Markdown bullet list: what ran where, when, from which code, and whether that code is current (it says
    plainly when the run predates the current sources)."""
    provenance = result["provenance"]
    device, git = provenance["device"], provenance.get("git") or {}
    commit = "not a git checkout" if git.get("commit") is None else f"`{git['commit'][:12]}`" + (
        " with uncommitted changes under `attention/`" if git.get("dirty") else "")
    versions = [f"torch {provenance['torch']}"] + [f"{name} {provenance[key]}" for key, name in
                                                   (("cuda", "CUDA"), ("cudnn", "cuDNN")) if provenance.get(key)]
    flags = ", ".join(device.get("cpu_flags") or []) or "none of them" if device.get("cpu_flags") is not None \
        else "not recorded (a run from before they were)"
    hardware = (f"{device['name']}, {device['cpu_count']} logical cores, {device['torch_num_threads']} torch threads"
                if device["type"] == "cpu" else f"{device['name']} (host CPU: {device['cpu']}, {device['cpu_count']} "
                                                f"logical cores)")
    lines = [f"- **Device**: {device['type']}: {hardware}; identified as **{device_label(device)}**",
             f"- **CPU flags that change results** (AVX2, FMA, AVX-512, AMX): {flags}",
             f"- **Software**: {', '.join(versions)}, Python {provenance['python']}, {provenance['platform']}",
             f"- **Run**: {provenance['date_utc']}, profile `{result['profile']}`, dtype `{result['dtype']}`, "
             f"{provenance.get('duration_s', '?')} s" + ("" if result.get("complete") else " (**incomplete run**)"),
             f"- **Command**: `{provenance['command']}`",
             f"- **Code**: commit {commit}; sources sha256 `{provenance['source_hash'][:16]}`"]
    shares = [row["cpu_utilization"] for row in all_rows(result) if row.get("cpu_utilization") is not None]
    if shares:
        lines.append(f"- **CPU share**: median {sorted(shares)[len(shares) // 2]:.0%} of the threads' time; "
                     f"{sum(share < CONTENDED_BELOW for share in shares)} of {len(shares)} rows below "
                     f"{CONTENDED_BELOW:.0%} (other processes running)")
    if provenance.get("load_average_start"):
        lines.append(f"- **Load average** (1/5/15 min) before the run: {provenance['load_average_start']}; after it: "
                     f"{provenance.get('load_average_end')}")
    if is_stale(result):
        changed = changed_sources(result)
        lines.append("- **Stale**: this run predates the current code; changed since: "
                     + ", ".join(f"`{path}`" for path in changed[:8]) + (f" and {len(changed) - 8} more"
                                                                         if len(changed) > 8 else ""))
    else:
        lines.append("- **Current**: recorded with the current `attention/` sources")
    return "\n".join(lines) + "\n"
