"""The long-context profile's recorded run on the teaching pages (Tiled attention, Masks, Numerics, Stacked single
heads): the few rows each page's text discusses, with sentences written from the numbers (the whole run: Benchmarks).
"""

from attention.bench.core import usable
from attention.bench.results import RESULTS_DIR, find_results, is_stale, load_result
from attention.causal.tiled import TiledAttention
from attention.report import prose
from attention.report.block_sparse import crossover_table, crossovers, plot_block_sparse
from attention.report.format import (MODE_TITLES, mebibytes, nested, number, run_device, run_line, table,
                                     title_suffix)
from attention.report.sequence import memory_slopes, plot_memory_vs_seq_len, shape_rows, sweep_rows, sweep_table, tied

CLASSES = ("split_heads", "tiled", "sdpa_causal")  # drawn and tabled, in this order


def recorded(folder="long", device_type="cpu", dtype="float32"):
    """`(path, result)`: the newest run, not compiled, of a device type and dtype under `docs/results/<folder>/`."""
    for path in find_results(RESULTS_DIR / folder, device_type=device_type):
        if (result := load_result(path))["dtype"] == dtype and not (result.get("config") or {}).get("compile"):
            return path.relative_to(RESULTS_DIR.parents[1]).as_posix(), result
    raise FileNotFoundError(f"no recorded {device_type} {dtype} run in docs/results/{folder}")


def recorded_runs(folder, dtype="float32"):
    """`[(path, result)]`: every run of `dtype` under `docs/results/<folder>/`, newest first."""
    runs = [(path.relative_to(RESULTS_DIR.parents[1]).as_posix(), load_result(path))
            for path in find_results(RESULTS_DIR / folder)]
    return [(path, result) for path, result in runs if result["dtype"] == dtype]


def device_titled(fig, result):
    """`fig` with the device in its titles named as `run_device` does, on a line of its own."""
    for text in [*fig.texts, *(ax.title for ax in fig.axes)]:
        text.set_text(text.get_text().replace(f": {title_suffix(result)}", f"\n{run_device(result)}, {result['dtype']}"))
    return fig


def memory_chart(result, mode="forward_backward"):
    """`sequence.plot_memory_vs_seq_len` of the `CLASSES` (their own colour, marker and line style each, so that lines
    lying on each other stay apart), its title naming the device as `run_device` does."""
    return device_titled(plot_memory_vs_seq_len(result, mode, CLASSES), result)


def tiled_section(path, result):
    """The Tiled attention page's recorded run: a table of the three classes' training peak memory and time at the
    longer lengths, the fitted growth, `tiled` against the naive class and against the fused kernel, and the
    compiled run (the newest top-level run with `torch.compile`), in words."""
    rows, config = nested(filter(usable, sweep_rows(result, "forward_backward")), "label", "seq_len"), result["config"]
    lengths = [t for t in config["seq_lens"] if t >= 1024]
    shown = {"MiB": lambda row: mebibytes(row["peak_memory_bytes"]), "ms": lambda row: number(row["ms_median"])}
    grid = table(["T"] + [f"`{label}` {unit}" for unit in shown for label in CLASSES],
                 [[f"{t:,}"] + [text(rows[label][t]) if t in rows.get(label, {}) else "—"
                                for text in shown.values() for label in CLASSES] for t in lengths])
    slopes = {mode: memory_slopes(result, mode) for mode in ("forward_backward", "forward")}
    growth = "; ".join(f"{'in forward + backward' if mode == 'forward_backward' else 'in the forward pass'} as "
                       + ", ".join(f"`T^{fit[label]['slope']:.2f}`" for label in CLASSES if label in fit)
                       for mode, fit in slopes.items())
    parts = [f"From the recorded run {run_line(path, result)}; batch {config['sweep_batch']}, d_model {config['d_model']}, "
             f"{config['num_heads']} heads, forward + backward (peak MiB of one call, median ms):", grid,
             f"Fitted over `T` ≥ 2048, the peak of `{'`, `'.join(CLASSES)}` grows {growth}."]
    naive_lengths = sorted(rows.get("split_heads", {}))
    skipped = next((row for row in sweep_rows(result, "forward_backward") if row["label"] == "split_heads"
                    and row["seq_len"] > naive_lengths[-1] and row["status"] == "skipped"), None)
    if skipped:
        parts.append(f"The run skipped `split_heads` at `T = {skipped['seq_len']:,}`: {skipped['reason']}.")
    tile = TiledAttention(8, 8, 8, 0.0, 1).block_size  # its default
    longest = max(naive_lengths)
    parts.append(prose.tiled_against_naive_sentence(
        prose.file_label(path, is_stale(result)), {t: r["ms_median"] for t, r in rows["tiled"].items()},
        {t: r["ms_median"] for t, r in rows["split_heads"].items()})
        + f" One `(B, H, T, T)` float32 score tensor is {config['num_heads'] * longest**2 * 4 / 2**20:,.0f} MiB at "
        f"`T = {longest:,}`; one tile of scores of `tiled`, every head, is {config['num_heads'] * tile**2 * 4 / 2**10:,.0f} KiB.")
    at = max(t for t in rows["tiled"] if t in rows.get("sdpa_causal", {}))
    kind, ratio = prose.ratio_words(rows["tiled"][at]["ms_median"], rows["sdpa_causal"][at]["ms_median"])
    parts.append(f"Against the fused kernel at `T = {at:,}`, `tiled` takes {prose.times(ratio)} the time of `sdpa_causal` "
                 + ("for the same O(T) memory: the algorithm is the same, the difference is the kernel (one C++ loop "
                    "over tiles, against Python's)." if kind == "more" else "or less, for the same O(T) memory."))
    compiled = [path for path in find_results(RESULTS_DIR, result["device_type"]) if load_result(path)["config"]["compile"]]
    if compiled:
        run = load_result(compiled[0])
        times = {title: tuple(next(r["ms_median"] for r in shape_rows(run, mode) if r["label"] == f"{label} (compiled)")
                              for label in ("tiled", "sdpa_causal")) for mode, title in MODE_TITLES.items()}
        parts.append(prose.compiled_sentence(prose.file_label(compiled[0].name, is_stale(run)), run["config"]["seq_len"],
                                             times))
    return "\n\n".join(parts)


def block_sparse_chart(result):
    """`block_sparse.plot_block_sparse`, its title naming the device as `run_device` does."""
    return device_titled(plot_block_sparse(result), result)


def partial_share(pattern, seq_len):
    """The share of a block-sparse sweep pattern's computed blocks at `seq_len` that are partial: FlexAttention evaluates
    the mask for every pair of a partial block, never in a full one."""
    from attention.bench.sweeps.block_sparse import PATTERNS
    from attention.masks import block_mask

    blocks = block_mask(PATTERNS[pattern][1](seq_len, "cpu"), seq_len, seq_len, device="cpu")
    partial, full = blocks.kv_num_blocks.sum().item(), blocks.full_kv_num_blocks
    return partial / (partial + (0 if full is None else full.sum().item()))


def block_sparse_section(path, result, kinds_at=4096):
    """The Masks page's recorded run: the patterns, where FlexAttention overtakes the dense mask, and what a computed
    block costs in each kernel, set beside each pattern's share of partial blocks at `kinds_at` (`partial_share`)."""
    section, found = result["block_sparse"], crossovers(result)
    partial = {pattern: partial_share(pattern, kinds_at) for pattern in found}
    per_block = {pattern: entry["flex_ms"] / entry["block_share"] / entry["dense_ms"] for pattern, entry in found.items()}
    lines = [f"`{pattern}`, {section['patterns'][pattern]}: FlexAttention "
             + (f"overtakes the dense mask from `T = {entry['crossover']:,}`" if entry["crossover"]
                else "does not overtake the dense mask at any length measured")
             + f"; at `T = {entry['longest']:,}` it computes {entry['block_share']:.0%} of the blocks for "
               f"{entry['mask_density']:.0%} of the pairs and is {entry['speedup']:.2f} times as fast. A computed block "
               f"costs it {per_block[pattern]:.1f} times the dense kernel's; {partial[pattern]:.0%} "
               f"of its computed blocks at `T = {kinds_at:,}` are partial." for pattern, entry in found.items()]
    most = max(partial, key=partial.get)
    costlier = [f"`{pattern}`" for pattern, ratio in per_block.items() if ratio > 1]
    return "\n\n".join([
        f"From the recorded run {run_line(path, result)}; forward, batch {section['batch']}, {section['num_heads']} heads "
        f"of {section['head_dim']}, `T` = {section['seq_lens'][0]:,} to {section['seq_lens'][-1]:,}:",
        crossover_table(result), "\n".join(f"- {line}" for line in lines),
        f"`{most}` has the largest share of partial blocks, and "
        + ("the highest" if per_block[most] == max(per_block.values()) else "not the highest")
        + " cost per computed block. Had a computed block cost the same in both kernels, the speed-up would be one over "
          "the share of blocks computed; it is less for " + (
              "every pattern, so on this CPU skipping blocks pays only once most of them can be skipped."
              if len(costlier) == len(per_block) else (", ".join(costlier) or "none of them") + ".")])


def stacked_section(path, result):
    """The Stacked single heads page's recorded run (the default profile): `stacked_heads` against `split_heads` at
    every shape, forward, with `sdpa_causal` for scale; then, per mode, where `stacked_heads` is faster, slower or
    tied (`sequence.tied`: the interquartile ranges overlap), and how much memory each needs."""
    config = result["config"]
    rows = {(r["label"], r["mode"], r["batch"], r["seq_len"]): r for r in result["rows"] if usable(r) and not r["compiled"]}
    compared = {mode: [(b, t, *(rows.get((label, mode, b, t)) for label in ("stacked_heads", "split_heads", "sdpa_causal")))
                       for b, t in config["shapes"]] for mode in config["modes"]}
    compared = {mode: [(b, t, st, sp, sd, "tied" if tied(st, sp) else "faster" if st["ms_median"] < sp["ms_median"]
                        else "slower") for b, t, st, sp, sd in group if st and sp] for mode, group in compared.items()}
    lines = [[b, f"{t:,}", number(st["ms_median"]), number(sp["ms_median"]), word, mebibytes(st["peak_memory_bytes"]),
              mebibytes(sp["peak_memory_bytes"]), number(sd["ms_median"]) if sd else "—"]
             for b, t, st, sp, sd, word in compared["forward"]]
    parts = [f"From the recorded run {run_line(path, result)}, d_model {config['d_model']}, {config['num_heads']} heads; "
             "forward, median ms per call and peak MiB:",
             table(["B", "T", "`stacked_heads` ms", "`split_heads` ms", "stacked is", "stacked MiB", "split MiB",
                    "`sdpa_causal` ms"], lines, "rrrrlrrr"), ""]
    for mode, group in compared.items():
        shapes = {word: ", ".join(f"({b}, {t:,})" for b, t, *_, w in group if w == word) for word in ("faster", "slower", "tied")}
        ratios = [sp["peak_memory_bytes"] / st["peak_memory_bytes"] for _, _, st, sp, _, _ in group]
        parts.append(f"- **{MODE_TITLES[mode].capitalize()}.** Time: `stacked_heads` is "
                     + "; ".join(f"{word} at (B, T) = {where}" for word, where in shapes.items() if where)
                     + f". Peak memory: `split_heads` needs {min(ratios):.1f} to {max(ratios):.1f} times as much.")
    b, t, st, sp, _, _ = max(compared["forward"], key=lambda shape: shape[0] * shape[1])
    one_head = b * t * t * 4  # one head's (B, T, T) float32 scores
    parts.append(f"- **Where the memory goes** (forward, B = {b}, T = {t:,}): `split_heads` peaks at "
                 f"{sp['peak_memory_bytes'] / (one_head * config['num_heads']):.1f} times one `(B, H, T, T)` score "
                 f"tensor ({one_head * config['num_heads'] / 2**20:,.0f} MiB), `stacked_heads` at "
                 f"{st['peak_memory_bytes'] / one_head:.1f} times one head's `(B, T, T)` ({one_head / 2**20:,.0f} MiB).")
    return "\n\n".join(parts[:3]) + "\n".join(parts[3:])


def memory_section(path, result, labels=("split_heads", "stacked_heads", "sdpa_causal", "sdpa_mask", "flex")):
    """The Numerics page's recorded run: the forward peak memory of a few classes against T, and at the longest length
    the naive class against the fused kernel, in words."""
    config, heads, item = result["config"], result["config"]["num_heads"], 4 if result["dtype"] == "float32" else 2
    rows = {(r["label"], r["seq_len"]): r for r in sweep_rows(result, "forward") if usable(r) and r["label"] in labels}
    lengths = sorted({t for _, t in rows})
    parts = [f"From the recorded run {run_line(path, result)}; forward, batch {config['sweep_batch']}, d_model "
             f"{config['d_model']}, {heads} heads, peak MiB of one call:",
             sweep_table(result, "forward", "peak_memory_bytes", labels)]
    longest, half = lengths[-1], lengths[-1] // 2
    if all((label, t) in rows for label in ("split_heads", "sdpa_causal") for t in (half, longest)):
        naive, fused = (rows[label, longest]["peak_memory_bytes"] for label in ("split_heads", "sdpa_causal"))
        scores = heads * longest**2 * item  # one (H, T, T) score tensor of the run's dtype
        parts.append(
            f"At `T = {longest:,}`, `split_heads`, which holds the `({heads}, T, T)` scores of all heads at once, peaks at "
            f"{mebibytes(naive)} MiB, {naive / scores:.1f} times one such {result['dtype']} tensor ({scores / 2**20:,.0f} "
            f"MiB): each step from scores to weights makes a new one while the previous one is still alive. `sdpa_causal` "
            f"(SDPA backend: {', '.join(rows['sdpa_causal', longest]['sdpa_backends'] or ['n/a'])}) works through blocks "
            f"of keys: {mebibytes(fused)} MiB, {naive / fused:.0f} times less. From `T = {half:,}` to `{longest:,}`, "
            f"`split_heads` grew ×{naive / rows['split_heads', half]['peak_memory_bytes']:.1f} (`T²` would be ×4) and "
            f"`sdpa_causal` ×{fused / rows['sdpa_causal', half]['peak_memory_bytes']:.1f} (`T`: ×2).")
    return "\n\n".join(parts)
