"""Figures of masks, position encodings, attention weights and tables of numbers, for the docs and notebooks.

Every `plot_*` function returns a `matplotlib.figure.Figure` built without pyplot, so it works under
any backend (Agg included), holds no global state and needs no `plt.close`. Show one in a notebook
with `attention.display.show(fig)`: it displays a PNG rendered at twice the figure's on-screen size
(`figure_png`: crisp on high-density screens), on a white background (legible in dark mode), with
alt text (`figure_alt`), whatever the kernel's matplotlib backend is. (A bare `Figure` left as a
cell's last expression displays as text, `<Figure size ...>`, unless pyplot happens to be
imported.) Elsewhere call `fig.savefig(path)`.

Masks are drawn like meta-pytorch/attention-gym's: one cell per (query, key) pair, a cell grid and
`Q0...`/`KV0...` ticks (or the tokens) when the matrix is small. Every figure has a title, axis
labels with units and a colour bar. matplotlib is imported inside the functions, so
`import attention.plotting` works without it.
"""

import base64
import html
import io
import math

import torch
from matplotlib.colors import SymLogNorm

from attention.checks import check_int
from attention.masks import dense_mask
from attention.positional import alibi_bias, alibi_slopes, rotary_angles, sinusoidal_table

# Up to this many rows or columns a matrix gets one tick per cell (Q0, Q1, ... / KV0, KV1, ...) and a grid.
MAX_LABELLED_CELLS = 16
# A figure inch is this many CSS pixels on the page; the PNG holds PIXEL_RATIO device pixels per CSS pixel.
CSS_DPI = 96
PIXEL_RATIO = 2
# The lowest weight a log-scale weight map tells apart; smaller weights share its colour.
LOG_SCALE_FLOOR = 1e-3
# The colour of masked pairs (weight 0) on a log-scale weight map: off the scale, a grey no colour of magma is.
MASKED_GREY = "#9e9e9e"
# Inches: 960 CSS pixels, about the text column of the site on a wide screen.
MAX_FIGURE_WIDTH = 10.0


def figure_png(fig, pixel_ratio=PIXEL_RATIO):
    """Render a figure to PNG for a web page: `(png_bytes, css_width, css_height)`.

    The PNG has `pixel_ratio` pixels per CSS pixel; shown at `css_width x css_height` it is sharp on
    screens of up to that density. The background is opaque white so dark page themes keep it legible.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=CSS_DPI * pixel_ratio, facecolor="white", bbox_inches="tight", pad_inches=0.08)
    png = buffer.getvalue()
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # the IHDR chunk
    return png, round(width / pixel_ratio), round(height / pixel_ratio)


def figure_alt(fig):
    """A figure's alt text: its suptitle, else the titles of its panels (colour bars left out)."""
    suptitle = fig.get_suptitle()
    titles = [ax.get_title() for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.get_title()]
    text = suptitle or "; ".join(dict.fromkeys(titles)) or "figure"
    return " ".join(text.split())  # one line: titles may hold newlines


def figure_html(fig, alt=None):
    """An `<img>` element holding the figure as a data URI, sized for high-density screens, with alt text."""
    png, width, height = figure_png(fig)
    alt = figure_alt(fig) if alt is None else alt
    return (f'<img class="attention-figure" src="data:image/png;base64,{base64.b64encode(png).decode()}" '
            f'width="{width}" height="{height}" alt="{html.escape(alt)}">')


def plot_mask(mask, q_len=None, kv_len=None, title=None, batch_index=0, head_index=0):
    """Draw one mask: attended pairs dark, masked pairs light.

    Args:
        mask: a predicate `mask_mod(b, h, q_idx, kv_idx)`, or a boolean tensor `(Tq, Tk)` or
            `(B, H, Tq, Tk)` (True = attend).
        q_len: Tq, needed for a predicate.
        kv_len: Tk for a predicate; defaults to `q_len`.
        title: figure title; defaults to the predicate's `__name__` and its density.
        batch_index: which sequence of a 4-D mask to draw.
        head_index: which head of a 4-D mask to draw.

    Returns:
        A Figure with two axes: the mask and its colour bar.
    """
    name, matrix = mask_matrix(mask, q_len, kv_len, batch_index, head_index)
    fig = new_figure(1, 1, matrix.shape)
    ax = fig.add_subplot()
    image = draw_mask(ax, matrix)
    ax.set_title(title if title is not None else f"{name} (density {matrix.float().mean().item():.2f})")
    mask_colorbar(fig, image, [ax])
    return fig


def plot_masks(masks, q_len=None, kv_len=None, ncols=3, title="Attention masks", q_offset=0):
    """Draw several masks side by side, one panel each.

    Args:
        masks: dict from a panel title to a predicate or a boolean `(Tq, Tk)` tensor.
        q_len: Tq, needed for predicates.
        kv_len: Tk for predicates; defaults to `q_len`.
        ncols: panels per row.
        title: figure title.
        q_offset: the position of the first query, for queries that come after cached keys (a chunk
            of 5 queries after 10 cached positions: `q_offset=10`, ticks `Q10...Q14`). Tensors only:
            a predicate is drawn from query 0.

    Returns:
        A Figure with `len(masks)` mask axes and one shared colour bar.
    """
    if not isinstance(masks, dict) or not masks:
        raise ValueError(f"masks must be a non-empty dict from title to mask, got masks={masks!r}")
    check_int("q_offset", q_offset, minimum=0)
    if q_offset and any(callable(mask) for mask in masks.values()):
        raise ValueError(f"q_offset={q_offset} labels tensor masks only; a predicate is drawn from query 0")
    matrices = {name: mask_matrix(mask, q_len, kv_len, 0, 0)[1] for name, mask in masks.items()}
    cell_shape = next(iter(matrices.values())).shape
    nrows, ncols = grid_shape(len(matrices), ncols, cell_shape)
    fig = new_figure(nrows, ncols, cell_shape)
    axes = [fig.add_subplot(nrows, ncols, index + 1) for index in range(len(matrices))]
    for ax, (name, matrix) in zip(axes, matrices.items()):
        q_labels = [f"Q{q_offset + i}" for i in range(matrix.shape[0])] if q_offset else None
        image = draw_mask(ax, matrix, q_labels=q_labels)
        if q_offset:
            ax.set_ylabel("query position i (tokens)")
        ax.set_title(f"{name}\ndensity {matrix.float().mean().item():.2f}", fontsize="medium")
    outer_labels(axes, ncols)
    fig.suptitle(title)
    mask_colorbar(fig, image, axes)
    return fig


def plot_sinusoidal(num_positions=64, dim=32, base=10000.0, title=None):
    """Heat map of the sinusoidal encoding table, positions down and features across.

    Returns:
        A Figure with two axes: the table and its colour bar.
    """
    table = sinusoidal_table(num_positions, dim, base, dtype=torch.float64)  # (T, dim)
    return plot_table(table, title or f"Sinusoidal position encoding (dim={dim}, base={base:g})",
                      "feature index (even: sin, odd: cos)", "encoding value (unitless, in [-1, 1])", symmetric=True)


def plot_learned(embedding, title="Learned position embedding"):
    """Heat map of a learned position embedding, positions down and features across.

    Args:
        embedding: a `LearnedPositionalEmbedding` (its `weight`) or a `(max_len, dim)` tensor.
        title: figure title.

    Returns:
        A Figure with two axes: the table and its colour bar.
    """
    weight = embedding.weight if hasattr(embedding, "weight") else embedding
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"embedding must be a LearnedPositionalEmbedding or a (max_len, dim) tensor, got {type(embedding).__name__}")
    return plot_table(weight.detach().cpu().double(), title, "feature index", "embedding value (unitless)", symmetric=True)


def plot_rope_angles(seq_len=64, head_dim=32, base=10000.0, num_lines=4, title=None):
    """Rotary embeddings as rotation angles: pair i at position t turns by `t * base ** (-2i / head_dim)`.

    Left: the angle of every (position, pair) wrapped into `[-pi, pi)`, the rotation actually applied.
    Right: the unwrapped angle over positions for `num_lines` pairs spread over the frequencies,
    on a log scale: fast pairs encode short distances, slow pairs long ones.

    Returns:
        A Figure with three axes: the heat map, its colour bar and the line plot.
    """
    angles = rotary_angles(seq_len, head_dim, base)  # (T, D/2), radians
    wrapped = torch.remainder(angles + math.pi, 2 * math.pi) - math.pi  # (T, D/2) in [-pi, pi)
    fig = new_figure(1, 2, (seq_len, head_dim // 2))
    heat_ax, line_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    image = heat_ax.imshow(wrapped.numpy(), cmap="twilight", vmin=-math.pi, vmax=math.pi, aspect="auto", interpolation="nearest")
    heat_ax.set_xlabel("pair index i (features i and i + head_dim/2)")
    heat_ax.set_ylabel("position t (tokens)")
    heat_ax.set_title("rotation angle, wrapped")
    colorbar = fig.colorbar(image, ax=heat_ax)
    colorbar.set_label("angle (rad)")
    pairs = sorted(set(torch.linspace(0, head_dim // 2 - 1, max(1, min(num_lines, head_dim // 2))).round().long().tolist()))
    positions = torch.arange(1, seq_len)  # position 0 has angle 0, off a log scale
    for pair in pairs:
        line_ax.plot(positions.numpy(), angles[1:, pair].numpy(), label=f"pair {pair}: {base ** (-2 * pair / head_dim):.2g} rad/token")
    line_ax.set_yscale("log")
    line_ax.set_xlabel("position t (tokens)")
    line_ax.set_ylabel("angle t * theta_i (rad, log scale)")
    line_ax.set_title("rotation angle over positions")
    line_ax.legend(fontsize="small")
    fig.suptitle(title or f"Rotary embedding angles (head_dim={head_dim}, base={base:g})")
    return fig


def plot_alibi(num_heads=8, seq_len=16, causal=True, ncols=4, title=None):
    """ALiBi's additive score bias, one panel per head: `-m_h * (i - j)` (causal) or `-m_h * |i - j|`.

    Masked pairs (keys after the query, causal form) are left blank.

    Returns:
        A Figure with `num_heads` bias axes and one shared colour bar.
    """
    bias = alibi_bias(num_heads, seq_len, seq_len, causal=causal, dtype=torch.float64)  # (H, T, T)
    bias = torch.where(torch.isinf(bias), torch.full_like(bias, float("nan")), bias)  # blank where masked
    slopes = alibi_slopes(num_heads)
    nrows, ncols = grid_shape(num_heads, ncols, (seq_len, seq_len))
    fig = new_figure(nrows, ncols, (seq_len, seq_len))
    axes = [fig.add_subplot(nrows, ncols, head + 1) for head in range(num_heads)]
    lowest = torch.nan_to_num(bias, nan=0.0).min().item()
    # Symmetric-log colours: the slopes differ by up to 2**8, so on a linear scale every head but the
    # steepest few would be one flat colour. Below |bias| = the smallest slope the scale is linear.
    norm = SymLogNorm(linthresh=slopes.min().item(), vmin=lowest, vmax=0.0, base=10)
    for head, ax in enumerate(axes):
        image = draw_matrix(ax, bias[head], cmap="viridis", norm=norm)
        ax.set_title(f"head {head}: slope 1/{1 / slopes[head].item():.3g}", fontsize="medium")
    outer_labels(axes, ncols)
    form = "causal, -m (i - j)" if causal else "symmetric, -m |i - j|"
    fig.suptitle(title or f"ALiBi bias per head ({form})")
    colorbar = fig.colorbar(image, ax=axes)
    colorbar.set_label("bias added to the score (logit units, symmetric log scale)")
    return fig


def plot_attention_weights(weights, ncols=4, title="Attention weights per head", tokens=None, mask=None,
                           log_scale=False, head_titles=None, value_label=None):
    """Heat maps of attention weights `(H, Tq, Tk)`, one panel per head (e.g. `weights[0]` of a batch).

    Args:
        weights: a `(H, Tq, Tk)` tensor of attention weights (rows sum to 1, or 0 where fully masked).
        ncols: panels per row.
        title: figure title.
        tokens: labels for the axes: one sequence of strings for self-attention (`Tq == Tk`), or a
            pair `(query_tokens, key_tokens)`. Without it the ticks are `Q0...`/`KV0...` when small.
        mask: the boolean mask the weights were computed under (True = attend), `(Tq, Tk)` or
            `(B, H, Tq, Tk)` (batch 0, head 0 is drawn), or a mask predicate; drawn as the first panel.
        log_scale: colours on a log scale from `LOG_SCALE_FLOOR` to 1, so weights that differ by
            factors far below the largest weight stay apart (a linear scale draws them all near black).
        head_titles: one title per head (default "head h").
        value_label: the colour bar's label, for matrices that are not softmax weights (a linear attention's decay
            mask); default "attention weight (rows sum to 1)".

    Returns:
        A Figure with `H` weight axes (plus the mask's) and their colour bars.
    """
    if not isinstance(weights, torch.Tensor) or weights.dim() != 3:
        raise ValueError(f"weights must be a (H, Tq, Tk) tensor, got {type(weights).__name__} of shape {tuple(getattr(weights, 'shape', ()))}")
    weights = weights.detach().cpu().double()
    num_heads, q_len, kv_len = weights.shape
    q_labels, kv_labels = token_labels(tokens, q_len, kv_len)
    panels = num_heads + (mask is not None)
    nrows, ncols = grid_shape(panels, ncols, weights.shape[1:])
    fig = new_figure(nrows, ncols, weights.shape[1:])
    axes = [fig.add_subplot(nrows, ncols, index + 1) for index in range(panels)]
    all_axes = axes
    if mask is not None:
        _, matrix = mask_matrix(mask, q_len, kv_len, 0, 0)
        if tuple(matrix.shape) != (q_len, kv_len):
            raise ValueError(f"mask must cover the weights' (Tq, Tk) = {(q_len, kv_len)}, got {tuple(matrix.shape)}")
        mask_ax, axes = axes[0], axes[1:]
        image = draw_mask(mask_ax, matrix, q_labels, kv_labels)
        mask_ax.set_title("the mask (dark = attend)", fontsize="medium")
        mask_colorbar(fig, image, [mask_ax])
    if head_titles is not None and len(head_titles) != num_heads:
        raise ValueError(f"head_titles must name the {num_heads} heads, got {len(head_titles)} titles")
    if log_scale:
        from matplotlib import colormaps
        from matplotlib.colors import LogNorm

        # Masked pairs (weight 0) are off the log scale: drawn grey (MASKED_GREY), apart from the smallest weights;
        # weights below the floor take the colour of the lowest weights.
        scale = dict(cmap=colormaps["magma"].with_extremes(bad=MASKED_GREY, under="black"),
                     norm=LogNorm(vmin=LOG_SCALE_FLOOR, vmax=1.0))
    else:
        scale = dict(cmap="magma", vmin=0.0, vmax=1.0)
    for head, ax in enumerate(axes):
        image = draw_matrix(ax, weights[head], q_labels, kv_labels, **scale)
        ax.set_title(head_titles[head] if head_titles is not None else f"head {head}", fontsize="medium")
    outer_labels(all_axes, ncols)
    fig.suptitle(title)
    colorbar = fig.colorbar(image, ax=axes)
    colorbar.set_label(value_label or "attention weight (rows sum to 1" + (", log scale; grey: masked)" if log_scale else ")"))
    return fig


def plot_heatmaps(panels, row_labels, col_labels, xlabel, ylabel, value_label, title, log_scale=True, cell_format="{:.1f}"):
    """Tables of numbers as heat maps, one panel each, sharing rows, columns and one colour scale;
    each cell shows its value. Readable where a line chart of many overlapping series is not.

    Args:
        panels: dict from a panel title to a `(len(row_labels), len(col_labels))` tensor or nested list
            (NaN: a blank cell, e.g. not measured).
        row_labels, col_labels: the labels of the rows (down the left) and of the columns (along the bottom).
        xlabel, ylabel: axis labels, with units.
        value_label: the colour bar's label, with units.
        title: figure title.
        log_scale: a logarithmic colour scale (the values must be positive).
        cell_format: format of the number written in each cell.

    Returns:
        A Figure with `len(panels)` heat-map axes and one shared colour bar.
    """
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    if not isinstance(panels, dict) or not panels:
        raise ValueError(f"panels must be a non-empty dict from title to a table of values, got panels={panels!r}")
    shape = (len(row_labels), len(col_labels))
    tables = {name: torch.as_tensor(values, dtype=torch.float64) for name, values in panels.items()}
    for name, table in tables.items():
        if tuple(table.shape) != shape:
            raise ValueError(f"panel {name!r} must be a (rows, columns) = {shape} table, got shape {tuple(table.shape)}")
    values = torch.cat([table.flatten() for table in tables.values()])
    values = values[~values.isnan()]
    if log_scale and (values <= 0).any():
        raise ValueError("log_scale needs positive values; pass log_scale=False for zero or negative ones")
    low, high = (values.min().item(), values.max().item()) if values.numel() else (1.0, 1.0)
    norm = LogNorm(low, max(high, low * 1.01)) if log_scale else Normalize(low, high if high > low else low + 1.0)
    panel_width = 0.75 * shape[1] + 0.3 * max(len(str(label)) for label in row_labels) / len(tables) + 1.0
    fig = Figure(figsize=(min(panel_width * len(tables) + 1.2, MAX_FIGURE_WIDTH), 0.32 * shape[0] + 1.8),
                 layout="constrained")
    axes = [fig.add_subplot(1, len(tables), index + 1) for index in range(len(tables))]
    for ax, (name, table) in zip(axes, tables.items()):
        image = ax.imshow(table.numpy(), cmap="YlOrRd", norm=norm, aspect="auto", interpolation="nearest")
        for (row, col), value in zip(((r, c) for r in range(shape[0]) for c in range(shape[1])), table.flatten().tolist()):
            if not math.isnan(value):  # dark text on light cells, white on dark ones
                ax.text(col, row, cell_format.format(value), ha="center", va="center", fontsize="small",
                        color="white" if norm(value) > 0.6 else "black")
        ax.set_xticks(range(shape[1]), [str(label) for label in col_labels])
        ax.set_yticks(range(shape[0]), [str(label) for label in row_labels])
        ax.tick_params(labelleft=ax is axes[0])  # the row labels once, on the left
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel if ax is axes[0] else "")
        ax.set_title(name, fontsize="medium")
    fig.suptitle(title)
    colorbar = fig.colorbar(image, ax=axes, shrink=0.8)
    colorbar.set_label(value_label)
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 1.5, 2, 3 rather than 3 x 10^0 on a log scale
    colorbar.ax.yaxis.set_major_formatter(plain)
    colorbar.ax.yaxis.set_minor_formatter(plain)
    return fig


def token_labels(tokens, q_len, kv_len):
    """`(query labels, key labels)` from `tokens` (one sequence, or a pair); `(None, None)` without tokens."""
    if tokens is None:
        return None, None
    if len(tokens) == 2 and not isinstance(tokens[0], str):
        q_labels, kv_labels = (list(map(str, labels)) for labels in tokens)
    else:
        q_labels = kv_labels = list(map(str, tokens))
    if len(q_labels) != q_len or len(kv_labels) != kv_len:
        raise ValueError(f"tokens must label Tq = {q_len} queries and Tk = {kv_len} keys, "
                         f"got {len(q_labels)} query and {len(kv_labels)} key labels")
    return q_labels, kv_labels


def mask_matrix(mask, q_len, kv_len, batch_index, head_index):
    """`(name, (Tq, Tk) boolean tensor)` for a predicate or a 2-D or 4-D boolean tensor."""
    if callable(mask):
        if q_len is None:
            raise ValueError(f"q_len is needed to draw the predicate {getattr(mask, '__name__', mask)!r}, got q_len=None")
        kv_len = q_len if kv_len is None else kv_len
        return getattr(mask, "__name__", "mask"), dense_mask(mask, q_len, kv_len).cpu()
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() not in (2, 4):
        raise ValueError(f"mask must be a mask_mod or a boolean (Tq, Tk) or (B, H, Tq, Tk) tensor, got {type(mask).__name__} "
                         f"{getattr(mask, 'dtype', '')} {tuple(getattr(mask, 'shape', ()))}")
    matrix = mask if mask.dim() == 2 else mask[batch_index, head_index]
    return "mask", matrix.cpu()


def draw_mask(ax, matrix, q_labels=None, kv_labels=None):
    """Draw a boolean `(Tq, Tk)` mask on `ax` in two colours; returns the image."""
    from matplotlib.colors import BoundaryNorm, ListedColormap

    cmap = ListedColormap(["#eeeeee", "#1f5fa6"])
    norm = BoundaryNorm([-0.5, 0.5, 1.5], cmap.N)
    return draw_matrix(ax, matrix.to(torch.float64), q_labels, kv_labels, cmap=cmap, norm=norm)


def draw_matrix(ax, matrix, q_labels=None, kv_labels=None, **imshow_kwargs):
    """`imshow` a `(Tq, Tk)` matrix with query/key axis labels; one tick per cell and a grid when the
    matrix is small or labels are given (`Q0...`/`KV0...` by default)."""
    Tq, Tk = matrix.shape
    image = ax.imshow(matrix.numpy(), interpolation="nearest", aspect="equal", **imshow_kwargs)
    ax.set_xlabel("key position j (tokens)" if kv_labels is None else "key token")
    ax.set_ylabel("query position i (tokens)" if q_labels is None else "query token")
    if q_labels is not None or (Tq <= MAX_LABELLED_CELLS and Tk <= MAX_LABELLED_CELLS):
        fontsize = "x-small" if q_labels is None else "small"
        ax.set_xticks(range(Tk), kv_labels or [f"KV{j}" for j in range(Tk)], rotation=90, fontsize=fontsize)
        ax.set_yticks(range(Tq), q_labels or [f"Q{i}" for i in range(Tq)], fontsize=fontsize)
        ax.set_xticks([j - 0.5 for j in range(1, Tk)], minor=True)
        ax.set_yticks([i - 0.5 for i in range(1, Tq)], minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="minor", length=0)
    return image


def mask_colorbar(fig, image, axes):
    """A two-entry colour bar: masked / attend."""
    colorbar = fig.colorbar(image, ax=axes, ticks=[0, 1], shrink=0.8)
    colorbar.ax.set_yticklabels(["masked", "attend"])
    colorbar.set_label("mask value (True = attend)")
    return colorbar


def plot_table(table, title, feature_label, value_label, symmetric):
    """Heat map of a `(positions, features)` table with a labelled colour bar."""
    fig = new_figure(1, 1, table.shape)
    ax = fig.add_subplot()
    limit = table.abs().max().item() or 1.0
    image = ax.imshow(table.numpy(), cmap="RdBu_r" if symmetric else "viridis", vmin=-limit if symmetric else None,
                      vmax=limit if symmetric else None, aspect="auto", interpolation="nearest")
    ax.set_xlabel(feature_label)
    ax.set_ylabel("position t (tokens)")
    ax.set_title(title)
    colorbar = fig.colorbar(image, ax=ax)
    colorbar.set_label(value_label)
    return fig


def grid_shape(count, ncols, cell_shape=None):
    """`(nrows, ncols)` of a grid holding `count` panels, at most `ncols` per row, and with a
    `cell_shape` (Tq, Tk), no more per row than fit in `MAX_FIGURE_WIDTH` (wider would shrink the text)."""
    check_int("ncols", ncols)
    ncols = min(ncols, count)
    while cell_shape is not None and ncols > 1 and figure_size(1, ncols, cell_shape)[0] > MAX_FIGURE_WIDTH:
        ncols -= 1
    return math.ceil(count / ncols), ncols


def figure_size(nrows, ncols, cell_shape):
    """`(width, height)` in inches of a grid of panels showing `(rows, cols)` matrices."""
    rows, cols = cell_shape
    panel_height = 3.2 if max(rows, cols) > 12 else 2.4
    panel_width = min(max(panel_height * cols / max(rows, 1), 2.5), 6.0) + 0.5
    return panel_width * ncols + 1.0, panel_height * nrows + 0.8


def new_figure(nrows, ncols, cell_shape):
    """An empty Figure sized for a grid of panels, with constrained layout."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figure_size(nrows, ncols, cell_shape), layout="constrained")
    fig.get_layout_engine().set(h_pad=0.1)  # the default lets a suptitle touch two-line panel titles
    return fig


def outer_labels(axes, ncols):
    """In a grid of panels, keep the axis labels of the left column and the bottom panels only."""
    for index, ax in enumerate(axes):
        if index % ncols:
            ax.set_ylabel("")
        if index + ncols < len(axes):
            ax.set_xlabel("")


def flash_tiles(T_q, T_k, block_m, block_n, causal):
    """`{(query tile, key tile): kind}` of a FlashAttention forward over `T_q` queries and `T_k` keys in tiles of
    `block_m` x `block_n`: "skipped" (causal: past the tile's last query, never loaded), "masked" (loaded, and some of
    its pairs are masked: on the diagonal, or past `T_q` or `T_k` at the edges) or "full"."""
    tiles = {}
    for i in range(math.ceil(T_q / block_m)):
        end = min(T_k, (i + 1) * block_m) if causal else T_k  # the kernel's loop bound for query tile i
        for j in range(math.ceil(T_k / block_n)):
            edge = (i + 1) * block_m > T_q or (j + 1) * block_n > T_k
            diagonal = causal and (j + 1) * block_n - 1 > i * block_m  # a key past the tile's first query
            tiles[i, j] = "skipped" if j * block_n >= end else "masked" if edge or diagonal else "full"
    return tiles


def plot_flash_tiles(T_q, T_k, block_m, block_n, title=None):
    """The score matrix of a FlashAttention forward cut into tiles, not causal and causal side by side: which tiles a
    program loads and computes in full, which it masks inside, and which it skips (`flash_tiles`)."""
    from matplotlib.patches import Patch, Rectangle

    colors = {"full": "#4c72b0", "masked": "#dd8452", "skipped": "#eeeeee"}
    fig = new_figure(1, 2, (T_q, T_k))
    for ax, causal in zip(fig.subplots(1, 2), (False, True)):
        for (i, j), kind in flash_tiles(T_q, T_k, block_m, block_n, causal).items():
            ax.add_patch(Rectangle((j * block_n, i * block_m), block_n, block_m, facecolor=colors[kind],
                                   edgecolor="white", linewidth=1.5))
        ax.plot([0, T_k, T_k], [T_q, T_q, 0], color="black", linestyle="--", linewidth=1)  # the real lengths
        rows, cols = math.ceil(T_q / block_m), math.ceil(T_k / block_n)
        ax.set(xlim=(0, cols * block_n), ylim=(rows * block_m, 0), xlabel="key position",
               ylabel="query position (a program per row of tiles)", title="causal" if causal else "not causal")
        ax.set_aspect("equal")
        for i in range(rows):
            ax.text(cols * block_n + 4, (i + 0.5) * block_m, f"program {i}", va="center", fontsize=8)
    fig.legend(handles=[Patch(color=colors[kind], label=label) for kind, label in (
        ("full", "computed, no mask"), ("masked", "computed, masked inside"), ("skipped", "skipped: never loaded"))],
        loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle(title or f"Tiles of {block_m} queries x {block_n} keys over T_q = {T_q}, T_k = {T_k} "
                          "(dashed: the real lengths)", fontsize=10)
    return fig
