"""The ring sweep's results shown: time, memory per process and bytes sent per process count, tables, charts and its
section of the Benchmarks page (the sweep itself: `attention.bench.sweeps.ring`).
"""

from attention.bench import core
from attention.bench.sweeps.ring import MODES, NAME
from attention.report.format import (MODE_TITLES, collapsed, mebibytes, nested, number, run_line, status_cell, table,
                                       title_suffix)


def ring_rows(result):
    """`{world_size: {mode: row}}` of a run, process counts ascending."""
    return nested((result.get(NAME) or {}).get("rows", []), "world_size", "mode")


def both_modes(pair, value):
    """A cell of both modes' `value`, "forward / forward + backward"; a row that did not run or was not correct
    says why (`format.status_cell`)."""
    return " / ".join(status_cell(pair.get(mode), value) or "—" for mode in MODES)


def ring_table(result):
    """Per process count: memory per process, time and bytes sent (forward / forward + backward), and whether every
    process sent exactly the bytes computed from the shapes."""
    lines = []
    for world_size, pair in ring_rows(result).items():
        counted = [row["sent_as_expected"] for row in pair.values() if row["status"] == "ok"]
        first = pair.get("forward") or pair.get("forward_backward")
        lines.append([world_size, first["local_len"], mebibytes(first["shard_bytes"]),
                      both_modes(pair, lambda r: mebibytes(r["peak_memory_bytes"])),
                      both_modes(pair, lambda r: number(r["ms_median"])), f"{first['kv_block_bytes'] / 2**10:,.0f}",
                      both_modes(pair, lambda r: f"{sum(r['rank_sent_bytes'][0]) / 2**10:,.0f}"),
                      "—" if not counted else "yes" if all(counted) else "NO"])
    return table(["P", "T / P", "shard MiB", "peak MiB (fwd / fwd+bwd)", "ms (fwd / fwd+bwd)", "K/V block KiB",
                  "sent KiB (fwd / fwd+bwd)", "sent = computed"], lines)


def plot_ring(result):
    """Memory per process (shard + the call's peak) and time per call against P, both modes."""
    from matplotlib.figure import Figure

    section, rows = result[NAME], ring_rows(result)
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    memory, timing = fig.subplots(1, 2)
    for mode, marker in zip(MODES, "os"):
        points = [(p, pair[mode]) for p, pair in rows.items() if core.usable(pair.get(mode))]
        for ax, value in ((memory, lambda r: (r["shard_bytes"] + r["peak_memory_bytes"]) / 2**20),
                          (timing, lambda r: r["ms_median"])):
            ax.plot([p for p, _ in points], [value(r) for _, r in points], marker=marker, label=mode.replace("_", " + "))
    for ax, ylabel, title in ((memory, "shard + call's peak, largest process (MiB)", "Tensor memory per process"),
                              (timing, "ms per call (median, slowest process)", "Time per call")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(list(rows), [str(p) for p in rows])
        ax.set(xlabel="processes P (total length fixed)", ylabel=ylabel, title=title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Ring attention, T = {section['seq_len']:,}, B = {section['batch']}, {section['num_heads']} heads "
                 f"({section['num_kv_heads']} K/V) of {section['head_dim']}, {'causal, ' if section['causal'] else ''}"
                 f"{section['layout']}: {title_suffix(result)}", fontsize=10)
    return fig


def sizes_text(section):
    return (f"one sequence of T = {section['seq_len']:,} (B = {section['batch']}, {section['num_heads']} query heads, "
            f"{section['num_kv_heads']} key/value heads of {section['head_dim']}, "
            f"{'causal' if section['causal'] else 'not causal'}, {section['layout']} split)")


def cores_note(result):
    """What the times can and cannot show on this machine, with the run's own time ratios."""
    cores, rows = result["provenance"]["device"]["cpu_count"], ring_rows(result)
    threads = ", ".join(f"{pair[next(iter(pair))]['threads_per_process'] or '?'} at P = {p}" for p, pair in rows.items())
    ratios = {}
    for mode in MODES:
        timed = [(p, pair[mode]["ms_median"]) for p, pair in rows.items() if core.usable(pair.get(mode))]
        if len(timed) > 1:
            ratios[mode] = (timed[0][0], timed[-1][0], timed[-1][1] / timed[0][1])
    measured = "; ".join(f"{MODE_TITLES[mode]}, P = {most} took {ratio:.2f} times P = {fewest}'s time"
                         for mode, (fewest, most, ratio) in ratios.items())
    return (f"The P processes share this machine's {cores} cores (torch threads per process: {threads}), so a "
            "speed-up from more devices cannot show here: whatever P, the same cores do the whole sequence's work. "
            + (f"Measured: {measured}. " if ratios else "")
            + ("Where the time falls with P on the same cores, the gain comes from how the work is cut and scheduled "
               "(the score tile of one chunk pair has `(T / 2P)²` entries, smaller as P grows; one thread per process "
               "instead of threads sharing each operation), not from more hardware. "
               if any(ratio < 1 for _, _, ratio in ratios.values()) else "")
            + "What P changes for each process is the memory it needs and the bytes it sends.")


def bytes_note(result):
    """The bytes per step, counted against computed, in words from the run."""
    parts = []
    for p, pair in ring_rows(result).items():
        row = pair.get("forward")
        if row is None or row["status"] != "ok" or p == 1:
            continue
        steps = len(row["expected_sent_bytes"])
        parts.append(f"at P = {p}, {steps} forward {'step' if steps == 1 else 'steps'} of "
                     f"{row['kv_block_bytes'] / 2**10:,.0f} KiB (one key/value block) per process, "
                     + ("exactly the computed bytes on every process" if row["sent_as_expected"]
                        else "NOT the computed bytes on some process"))
    return ("Bytes on the wire: " + "; ".join(parts) + ".") if parts else ""


def charts(result):
    return {"ring": (plot_ring(result), ("ring attention: memory per process and time per call against the number of "
                                         f"processes, {title_suffix(result)}"))}


def tables(result):
    return "\n\n".join(part for part in (ring_table(result), bytes_note(result), cores_note(result)) if part)


def page(result, images, path=None):
    """The run's section of the Benchmarks page; with the run's `path`, the ring page's: led by the run's file and
    device, with the memory per process and the reference check in words."""
    rows, device = ring_rows(result), result["provenance"]["device"]
    fewest, most = (rows[p].get("forward_backward") for p in (min(rows), max(rows)))
    checked = [row for pair in rows.values() for row in pair.values()]
    memory = (f"The forward + backward call's peak per process falls from {mebibytes(fewest['peak_memory_bytes'])} MiB on "
              f"{fewest['world_size']} {'process' if fewest['world_size'] == 1 else 'processes'} to "
              f"{mebibytes(most['peak_memory_bytes'])} MiB on {most['world_size']}, beside shards of "
              f"{mebibytes(fewest['shard_bytes'])} and {mebibytes(most['shard_bytes'])} MiB. "
              if core.usable(fewest) and core.usable(most) else "")
    verdict = ("Every call matched the reference" if all(map(core.usable, checked)) else "NOT every call matched the "
               "reference") + f" (largest difference {max(row['max_abs_error'] or 0.0 for row in checked):.1e})."
    lead = (f"From the recorded run {run_line(path, result)}; {device['cpu_count']} cores, {sizes_text(result[NAME])}:"
            if path else
            f"Context-parallel (ring) attention on {sizes_text(result[NAME])} split over P local processes (gloo); each "
            "call checked against the float64 reference on the whole sequence, its time the slowest process's:")
    charts = images.values() if path else [collapsed("Memory and time against P (chart)", image)  # the Benchmarks page
                                           for image in images.values()]
    return "\n\n".join(part for part in (lead, ring_table(result), *charts, memory + verdict if path else "",
                                         bytes_note(result), cores_note(result)) if part)
