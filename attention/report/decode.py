"""The decode sweep's results shown: rows by layer, kernel, batch and context, tables, charts and its section of the
Benchmarks page (the sweep itself: `attention.bench.sweeps.decode`).
"""

import statistics

from attention.bench.sweeps.decode import NAME
from attention.bench.results import is_stale
from attention.report.format import collapsed, number, run_line, status_cell, table, title_suffix

GROUPED = ("MHA", "GQA", "MQA")  # the KV cache page's layers; the others are on the current models and MLA pages
GRID = "Every model, kernel, batch and context, in both dtypes: [Benchmarks](../../benchmarks/#decoding)."
STYLES = ["-o", "--s", ":^", "-.v"]  # a line style per batch size
COPY_WORDS = " (· copy: the step's peak memory reached the bytes of the cache it reads, as a copy of it would)"
SHARES = {"share_of_peak_bandwidth": "the run's peak bandwidth",  # a bandwidth share's field: what it is a share of
          "share_of_paired_bandwidth": "the read bandwidth measured beside the row"}


def decode_rows(result, batch=None, model=None, kernel=None, context=None):
    """The measured, correct decode rows of `result` matching the given values."""
    wanted = {"batch": batch, "model": model, "kernel": kernel, "context": context}
    return [row for row in (result.get(NAME) or {}).get("rows", []) if row["status"] == "ok" and row["correct"] is True
            and all(value is None or row[key] == value for key, value in wanted.items())]


def decode_best(result, model, batch, context, kernel=None):
    """The fastest correct row of `model` at `batch` and `context` (through `kernel`, default any), or None."""
    return min(decode_rows(result, batch, model, kernel, context), key=lambda row: row["ms_median"], default=None)


def shown_share(result):
    """The bandwidth share the tables and charts show: against the run's peak (its best read or copy) where the run
    measured one, else against the read timed beside each row (runs recorded before the peak was)."""
    return "share_of_peak_bandwidth" if "peak_gbps" in result[NAME]["bandwidth"] else "share_of_paired_bandwidth"


def share_words(result):
    return SHARES[shown_share(result)]


def cell(result, row):
    """A row's tokens per second and bandwidth share (`shown_share`), as "78 · 27%"; "78 · 27% · copy": `copies_cache`."""
    return f"{row['tokens_per_s']:,.0f} · {row[shown_share(result)]:.0%}" + (" · copy" if row.get("copies_cache") else "")


def axes(result, models=None):
    """The models (`models`, default all), kernels, batch sizes and contexts of the run's rows, and a row per model."""
    rows = [row for row in result[NAME]["rows"] if models is None or row["model"] in models]
    return (list(dict.fromkeys(r["model"] for r in rows)), list(dict.fromkeys(r["kernel"] for r in rows)),
            sorted({r["batch"] for r in rows}), sorted({r["context"] for r in rows}), {r["model"]: r for r in rows})


def decode_table(result, batch, models=None, contexts=None):
    """`cell`s per model and kernel (rows) and context (columns), at one batch size, of `models` and `contexts`
    (default all); skipped, failed or incorrect rows say so."""
    models, kernels, _, measured, layer = axes(result, models)
    contexts = [c for c in measured if contexts is None or c in contexts]
    cells = {(r["model"], r["kernel"], r["context"]): r for r in result[NAME]["rows"] if r["batch"] == batch}
    return table(["Model (K/V heads)", "Kernel"] + [f"{c:,}" for c in contexts],
                 [[f"{model} ({layer[model]['num_kv_heads']})", f"`{kernel}`"]
                  + [status_cell(cells.get((model, kernel, c)), lambda row: cell(result, row)) for c in contexts]
                  for model in models for kernel in kernels if any((model, kernel, c) in cells for c in contexts)],
                 "ll" + "r" * len(contexts))


def decode_summary_table(result, contexts=None, models=None, batches=None):
    """Per model (`models`, default all; its K/V heads and cache bytes per token in the label): the fastest kernel's
    `cell` at each of `batches` and `contexts` (default all). The kernel goes in the label where one kernel is the
    fastest in every cell of the row, else in each cell."""
    models, _, measured_batches, measured, layer = axes(result, models)
    columns = [(b, c) for b in batches or measured_batches for c in contexts or measured if b in measured_batches
               and c in measured]
    lines = []
    for model in models:
        best = [decode_best(result, model, batch, context) for batch, context in columns]
        kernels = sorted({row["kernel"] for row in best if row})
        one = f" `{kernels[0]}`" if len(kernels) == 1 else ""
        lines.append([f"{model} ({layer[model]['num_kv_heads']} K/V, {layer[model]['cache_bytes_per_token'] / 1024:,g} "
                      f"KiB per token){one}"] + ["" if row is None else cell(result, row) + ("" if one else
                                                 f" `{row['kernel']}`") for row in best])
    return table(["Model (K/V heads, cache) kernel"] + [f"B={b}, {c:,}" for b, c in columns], lines)


def plot_decode(result, metric="tokens_per_s", models=None):
    """`metric` (tokens_per_s or a bandwidth share) against context: small multiples, a panel per model (`models`,
    default all) on shared axes, a colour per kernel and a line style per batch size."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    models, kernels, batches, _, layer = axes(result, models)
    colors = dict(zip(kernels, ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]))
    columns = min(len(models), 3)  # about the text column's width, so the panels' words keep their size
    fig = Figure(figsize=(2.5 * columns + 0.6, 1.9 * -(-len(models) // columns) + 1.0), layout="constrained")
    panels = fig.subplots(-(-len(models) // columns), columns, squeeze=False, sharex=True, sharey=True).ravel()
    for index, ax in enumerate(panels):
        ax.set_visible(index < len(models))
        if index < len(models) <= index + columns:  # the lowest panel of its column: the x axis's labels
            ax.tick_params(labelbottom=True)
            ax.set_xlabel("context (positions)", fontsize=8)
    for ax, model in zip(panels, models):
        for kernel, batch, style in [(k, b, s) for k in kernels for b, s in zip(batches, STYLES)]:
            points = sorted(decode_rows(result, batch, model, kernel), key=lambda r: r["context"])
            if points:
                    ax.plot([r["context"] for r in points], [r[metric] * (100 if metric.startswith("share") else 1)
                                                         for r in points], style, color=colors[kernel], markersize=3)
        ax.set_title(f"{model} ({layer[model]['num_kv_heads']} K/V)", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(labelsize=7)
    panels[0].set_yscale("log" if metric == "tokens_per_s" else "linear")
    fig.supylabel("tokens per second, one attention layer" if metric == "tokens_per_s" else f"% of {SHARES[metric]}",
                  fontsize=9)
    handles = ([Line2D([], [], color=colors[k], linewidth=2, label=f"kernel {k}") for k in kernels]
               + [Line2D([], [], color="black", linestyle=style[:-1], marker=style[-1], markersize=3, label=f"batch {b}")
                  for b, style in zip(batches, STYLES)])
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    fig.suptitle(f"Decode step of one attention layer, {title_suffix(result)}", fontsize=10)
    return fig


def bandwidth_note(result):
    bandwidth, matmul = result[NAME]["bandwidth"], result[NAME]["matmul_peak"]
    reads = [s["read_gbps"] for s in bandwidth["samples"]]
    paired = [r["bandwidth_gbps_paired"] for r in decode_rows(result)]
    note = (f"Read rate timed beside each row (a sum over {bandwidth['bytes'] / 2**20:,.0f} MiB): median "
            f"{statistics.median(paired):.1f} GB/s (lowest {min(paired):.1f}, highest {max(paired):.1f})." if paired else "")
    if "peak_gbps" in bandwidth:
        sizes = ", ".join(f"{size / 2**20:,.0f}" for size in result[NAME]["ceiling_bytes"])
        cache = bandwidth["last_level_cache_bytes"]
        note = (f"Bandwidth ceiling of this run: **{bandwidth['peak_gbps']:.1f} GB/s**, the best of {len(reads)} samples "
                f"(at the start and after each model) of a read (a sum) and a copy (reads and writes counted) over "
                f"{sizes} MiB" + (f", past the {cache / 2**20:,.0f} MiB last-level cache" if cache else "") + "; "
                f"medians of the samples: read {bandwidth['read_gbps']:.1f} GB/s (lowest {min(reads):.1f}), copy "
                f"{bandwidth['copy_gbps']:.1f}. Shares in the tables and charts are against the ceiling. " + note)
    else:
        note = (f"Read bandwidth (a sum over {bandwidth['bytes'] / 2**20:,.0f} MiB, same run): median "
                f"{bandwidth['read_gbps']:.1f} GB/s of {len(reads)} samples; a copy: {bandwidth['copy_gbps']:.1f} GB/s. "
                "Each row's share is against the read rate timed beside it. " + note)
    return note + (f" Matmul rate ({matmul['size']:,}² {result['dtype']}, same run): {number(matmul['tflops'])} TFLOP/s." if matmul else "")


ATTENTION_CHOICES, PROJECTION_CHOICES = ("sdpa", "matmul"), ("linear", "row_split")  # the words of a row's `chose`


def attention_choice(row):
    """The attention kernel an `auto` row's timing chose (`sdpa` or `matmul`), "?" where its `chose` names none."""
    return next((word for word in row["chose"].split() if word in ATTENTION_CHOICES), "?")


def auto_rows(result, models=None):
    """The `auto` rows (of `models`, default all) timed in turn with the forced kernels (`auto_over_fastest` set)."""
    return [row for row in decode_rows(result, kernel="auto")
            if row.get("auto_over_fastest") is not None and (models is None or row["model"] in models)]


def auto_sentence(result, models=None, goal=1.05):
    """The default's time against the fastest forced kernel's at every shape, each pair timed call by call in turn on
    the same cache (`auto_over_fastest`), in words; "" without any."""
    rows = auto_rows(result, models)
    if not rows:
        return ""
    worst = max(rows, key=lambda row: row["auto_over_fastest"])
    within = sum(row["auto_over_fastest"] <= goal for row in rows)
    chose, fastest = attention_choice(worst), worst["fastest_forced"]
    why = (f"`auto` chose `{chose}`, the fastest kernel's attention" if chose == fastest
           else f"`auto` chose `{chose}`, not `{fastest}`")
    again = [row for row in rows if row.get("in_turn_earlier")]
    firsts = ", ".join(f"{row['in_turn_earlier'][0]:.2f}x" for row in again)
    retimed = "" if not again else (
        f" {len(again)} shape{'s' if len(again) > 1 else ''} came out past {goal:.2f}x at first and "
        f"{'were' if len(again) > 1 else 'was'} timed in turn again (first ratios {firsts}; "
        f"{sum(row['auto_over_fastest'] <= goal for row in again)} within {goal:.2f}x the next time).")
    return (f"Timed call by call in turn with the forced kernels on the same cache, `auto` ran within {goal - 1:.0%} of "
            f"the fastest at {within} of {len(rows)} shapes; the largest ratio: {worst['auto_over_fastest']:.2f}x "
            f"`{fastest}`'s time ({worst['model']}, batch {worst['batch']}, {worst['context']:,} positions; {why})."
            + retimed)


def contexts_words(contexts, measured):
    """`contexts` (of the run's `measured` ones) in words: "every context", neighbours as "a to b", else listed."""
    if contexts == measured:
        return "every context"
    start = measured.index(contexts[0])
    if len(contexts) > 2 and measured[start:start + len(contexts)] == contexts:
        return f"{contexts[0]:,} to {contexts[-1]:,}"
    return ", ".join(f"{context:,}" for context in contexts)


def choice_words(result, models=GROUPED):
    """What `auto`'s timing chose on the run's machine for each of `models`, by batch size and context, in words."""
    measured, parts = axes(result)[3], []
    for model in models:
        chosen = {}
        for row in sorted(decode_rows(result, model=model, kernel="auto"), key=lambda row: (row["batch"], row["context"])):
            chosen.setdefault(attention_choice(row), {}).setdefault(row["batch"], []).append(row["context"])
        everywhere = len(chosen) == 1 and all(contexts == measured for contexts in next(iter(chosen.values())).values())
        if everywhere:
            parts.append(f"{model} `{next(iter(chosen))}` everywhere")
        elif chosen:
            parts.append(f"{model} " + "; ".join(f"`{kernel}` at " + ", ".join(
                f"batch {batch} ({contexts_words(contexts, measured)})" for batch, contexts in by_batch.items())
                for kernel, by_batch in chosen.items()))
    projections = sorted({word for row in decode_rows(result, kernel="auto", batch=1) for word in row["chose"].split()
                          if word in PROJECTION_CHOICES})
    split = (f" One token's projections: `{projections[0]}`." if len(projections) == 1 else
             " One token's projections: `linear` or `row_split` by weight shape." if projections else "")
    return "; ".join(parts) + "." + split if parts else ""


def choice_section(runs, models=GROUPED):
    """Per recorded run (`[(path, result)]`) with `auto` rows: its device, what the timing chose there and how close
    the default came to the fastest forced kernel, one bullet each (a sentence saying so where no run has `auto` rows)."""
    lines = [f"- **{title_suffix(result)}** (`{path.rsplit('/', 1)[-1]}`{', stale' if is_stale(result) else ''}): "
             f"{choice_words(result, models)} "
             f"{auto_sentence(result, models)}" for path, result in runs if auto_rows(result, models)]
    return "\n".join(lines) or "No recorded run times `auto` yet: the decode profile records it beside the forced kernels."


def charts(result):
    return {kind: (plot_decode(result, metric), f"decode {words} of one attention layer against context, a panel per "
                                                f"model, {title_suffix(result)}")
            for kind, metric, words in (("tokens", "tokens_per_s", "tokens per second"),
                                        ("share", shown_share(result), f"step's share of {share_words(result)}"))}


def batch_tables(result):
    """A `decode_table` per batch size: every model, kernel and context."""
    return [f"**Batch {batch}**: tok/s (tokens per second, one layer) · share of {share_words(result)}{COPY_WORDS}\n\n"
            + decode_table(result, batch) for batch in axes(result)[2]]


def tables(result):
    return "\n\n".join(part for part in [bandwidth_note(result), auto_sentence(result), decode_summary_table(result),
                                       *batch_tables(result)] if part)


def page(result, images):
    """The run on the Benchmarks page: the fastest kernel per model at the two longest contexts, the tokens chart; the
    bandwidth chart and every kernel and context collapsed."""
    section, images = result[NAME], dict(images)
    return "\n\n".join([
        f"One attention layer of {section['num_heads']} query heads of {section['head_dim']} (MHA, GQA, MQA, the model "
        f"families' layers and MLA at those sizes): the fastest kernel's tokens per second · share of "
        f"{share_words(result)}, at the two longest contexts:",
        decode_summary_table(result, contexts=axes(result)[3][-2:]), images.pop("tokens", ""),
        " ".join(part for part in (bandwidth_note(result), auto_sentence(result)) if part),
        collapsed("Every kernel and context, and the share of the bandwidth against context",
                  "\n\n".join(batch_tables(result) + list(images.values())))])


# --- The teaching pages' sections: the few rows their text discusses, in words, and a link to the whole grid ---------


def mla_pairs(result):
    """MLA's (absorbed, naive) rows measured at the same batch size and context."""
    return [(a, n) for a in decode_rows(result, model="MLA", kernel="absorbed")
            for n in decode_rows(result, a["batch"], "MLA", "naive", a["context"])]


def forced_only(result):
    """`result` with the forced kernels' decode rows only (what `auto` chose is said apart: `choice_section`)."""
    rows = [row for row in result[NAME]["rows"] if row["kernel"] != "auto"]
    return result | {NAME: result[NAME] | {"rows": rows}}


def teaching(path, result, models, contexts, lines, fastest=False):
    """A teaching page's recorded-run section: `models` at batch 1 and `contexts`, every kernel (`decode_table`) or
    with `fastest` the fastest (`decode_summary_table`), then `lines` as bullets and a link to the whole grid."""
    return "\n\n".join([
        f"From the recorded run {run_line(path, result)}: one attention layer of {result[NAME]['num_heads']} query "
        f"heads of {result[NAME]['head_dim']}, batch 1; each cell: tokens per second · share of {share_words(result)}.",
        decode_summary_table(result, contexts, models, [1]) if fastest else decode_table(result, 1, models, contexts),
        "\n".join(f"- {line}" for line in lines), GRID])


def cache_section(path, result, contexts=(4096, 16384, 32768), context=16384):
    """The KV cache page's recorded run: MHA, GQA and MQA through both kernels at batch 1 (6 rows), then what the
    smaller caches buy at `context` (the fastest kernels)."""
    result = forced_only(result)
    mha, gqa, mqa = (decode_best(result, model, 1, context) for model in GROUPED)
    return teaching(path, result, GROUPED, contexts, [
        f"At {context:,} positions GQA reads {mha['cache_bytes_per_token'] // gqa['cache_bytes_per_token']}x less "
        f"cache per token than MHA and runs {gqa['tokens_per_s'] / mha['tokens_per_s']:.1f}x as many tokens/s "
        f"(`{gqa['kernel']}`); MQA {mha['cache_bytes_per_token'] // mqa['cache_bytes_per_token']}x less and "
        f"{mqa['tokens_per_s'] / mha['tokens_per_s']:.1f}x: the query and output projections' weights, read at every "
        "step too, do not shrink."])


def layers_section(path, result, layers, context=16384):
    """The current models page's recorded run: the fastest kernel of each of `layers` at batch 1 and `context` (a row
    per layer), then in words each local layer's cache and speed against its global twin's."""
    result = forced_only(result)
    lines = []
    for name, twin in (("Gemma-2-local", "Gemma-2-global"), ("gpt-oss-local", "gpt-oss-global")):
        local, full = (decode_best(result, layer, 1, context) for layer in (name, twin))
        if local and full:
            lines.append(f"{name} reads {local['cache_bytes_read'] / 2**20:,.1f} MiB of cache per step where {twin} "
                         f"reads {full['cache_bytes_read'] / 2**20:,.1f} MiB, and runs "
                         f"{local['tokens_per_s'] / full['tokens_per_s']:.1f}x its tokens/s: the weights, "
                         f"{local['weight_bytes'] / 2**20:,.0f} MiB read at every step, do not shrink with the window.")
    return teaching(path, result, layers, [context], lines, fastest=True)


def latent_section(path, result, contexts=(4096, 16384, 32768), context=16384):
    """The MLA page's recorded run: GQA, MQA and MLA's two paths at batch 1 (6 rows), then in words: the absorbed
    path's rate against GQA's at `context`, and where the naive path is faster."""
    result = forced_only(result)
    absorbed, gqa = decode_best(result, "MLA", 1, context, "absorbed"), decode_best(result, "GQA", 1, context)
    pairs = mla_pairs(result)
    faster = [f"batch {a['batch']} at {a['context']:,}" for a, n in pairs if n["tokens_per_s"] > a["tokens_per_s"]]
    ratios = [a["tokens_per_s"] / n["tokens_per_s"] for a, n in pairs]
    return teaching(path, result, ["GQA", "MQA", "MLA"], contexts, [
        f"At {context:,} positions the absorbed path runs {absorbed['tokens_per_s']:,.0f} tokens/s, reading "
        f"{absorbed['cache_bytes_per_token']:,} bytes of cache per position; GQA {gqa['tokens_per_s']:,.0f} with "
        f"`{gqa['kernel']}`, reading {gqa['cache_bytes_per_token']:,}: "
        f"{absorbed['tokens_per_s'] / gqa['tokens_per_s']:.2f}x GQA's rate.", "The naive path is faster than the absorbed one " + (f"at {', '.join(faster)}." if faster else
        f"in none of the {len(pairs)} pairs of batch size and context measured: the absorbed path runs "
        f"{min(ratios):.1f}x to {max(ratios):.1f}x its tokens per second.")])
