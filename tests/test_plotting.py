"""Every plotting helper returns a Figure with the expected axes, titles, axis labels and colour bars;
the display helpers (attention.display) show it as one image in a notebook and print plain text elsewhere."""

import io

import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from attention import display, plotting  # noqa: E402
from attention.masks import and_masks, bigbird, causal, dense_mask, document, sliding_window  # noqa: E402
from attention.positional import LearnedPositionalEmbedding  # noqa: E402

FIGURES = {
    "mask_mod": (lambda: plotting.plot_mask(sliding_window(3), q_len=8), 2),
    "mask_tensor_4d": (lambda: plotting.plot_mask(dense_mask(causal, 4, 6, batch=2, heads=2), title="causal, 4 x 6"), 2),
    "masks": (lambda: plotting.plot_masks({
        "causal": causal,
        "sliding window": sliding_window(4),
        "bigbird": bigbird(1, 1, 2, max_len=40),
        "packed documents": and_masks(causal, document(torch.tensor([0] * 20 + [1] * 20))),
        "tensor": dense_mask(causal, 40, 40),
    }, q_len=40), 6),
    "sinusoidal": (lambda: plotting.plot_sinusoidal(32, 16), 2),
    "learned": (lambda: plotting.plot_learned(LearnedPositionalEmbedding(20, 8)), 2),
    "rope": (lambda: plotting.plot_rope_angles(32, 16), 3),
    "alibi": (lambda: plotting.plot_alibi(6, 8), 7),
    "alibi_symmetric": (lambda: plotting.plot_alibi(4, 8, causal=False), 5),
    "attention_weights": (lambda: plotting.plot_attention_weights(torch.softmax(torch.randn(3, 5, 7), dim=-1)), 4),
    "attention_weights_log": (lambda: plotting.plot_attention_weights(
        torch.softmax(torch.randn(3, 5, 5), dim=-1).tril(), log_scale=True, head_titles=["a", "b", "c"]), 4),
    "masks_after_a_cache": (lambda: plotting.plot_masks(
        {"chunk": torch.ones(5, 15, dtype=torch.bool).tril(10)}, q_offset=10), 2),
    "heatmaps": (lambda: plotting.plot_heatmaps(
        {"float16": [[1.0, 2.5], [3.0, float("nan")]], "bfloat16": torch.tensor([[1.5, 1.0], [2.0, 4.0]])},
        ["split_heads", "sdpa_causal"], [128, 256], "sequence length T (tokens)", "implementation",
        "error / floor (×)", "Errors"), 3),
}


@pytest.mark.parametrize("name", FIGURES)
def test_plot_returns_a_labelled_figure(name):
    make, num_axes = FIGURES[name]
    fig = make()
    assert isinstance(fig, Figure)
    assert len(fig.axes) == num_axes
    colorbars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert colorbars, "every figure has a colour bar"
    assert all(ax.get_ylabel() for ax in colorbars)
    panels = [ax for ax in fig.axes if ax not in colorbars]
    has_suptitle = fig._suptitle is not None and fig._suptitle.get_text()
    for ax in panels:  # in a grid, the left column carries the y label and the bottom panels the x label
        spec = ax.get_subplotspec()
        below = [other for other in panels if other.get_subplotspec().colspan.start == spec.colspan.start
                 and other.get_subplotspec().rowspan.start > spec.rowspan.start]
        assert ax.get_ylabel() or spec.colspan.start > 0
        assert ax.get_xlabel() or below
        assert ax.get_title() or has_suptitle
    fig.savefig(io.BytesIO(), format="png")  # renders under Agg without error
    # Built with matplotlib.figure.Figure, not pyplot: no global figure registry to close it from.


def test_small_masks_get_cell_ticks():
    fig = plotting.plot_mask(causal, q_len=3, kv_len=4)
    ax = fig.axes[0]
    assert [label.get_text() for label in ax.get_xticklabels()] == ["KV0", "KV1", "KV2", "KV3"]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["Q0", "Q1", "Q2"]
    assert ax.get_title() == "causal (density 0.50)"


def test_plot_errors_name_the_problem():
    with pytest.raises(ValueError, match="q_len is needed"):
        plotting.plot_mask(causal)
    with pytest.raises(ValueError, match=r"weights must be a \(H, Tq, Tk\) tensor"):
        plotting.plot_attention_weights(torch.rand(4, 4))
    with pytest.raises(ValueError, match="mask must be a mask_mod or a boolean"):
        plotting.plot_mask(torch.ones(3, 3))


def test_heatmaps_write_each_value_and_label_the_rows_once():
    fig = plotting.plot_heatmaps({"a": [[1.0, 2.0]], "b": [[3.0, float("nan")]]}, ["row"], ["c0", "c1"],
                                 "column", "row name", "value (units)", "Two panels")
    left, right = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert [text.get_text() for text in left.texts] == ["1.0", "2.0"]
    assert [text.get_text() for text in right.texts] == ["3.0"], "a NaN cell stays blank"
    assert [label.get_text() for label in left.get_yticklabels()] == ["row"]
    assert left.yaxis.get_tick_params()["labelleft"] and not right.yaxis.get_tick_params()["labelleft"], \
        "row labels only on the left panel"
    assert [label.get_text() for label in left.get_xticklabels()] == ["c0", "c1"]
    assert plotting.figure_alt(fig) == "Two panels"
    with pytest.raises(ValueError, match=r"panel 'b' must be a \(rows, columns\) = \(1, 2\) table, got shape \(2,\)"):
        plotting.plot_heatmaps({"a": [[1.0, 2.0]], "b": [1.0, 2.0]}, ["row"], ["c0", "c1"], "x", "y", "v", "t")
    with pytest.raises(ValueError, match="log_scale needs positive values"):
        plotting.plot_heatmaps({"a": [[0.0, 2.0]]}, ["row"], ["c0", "c1"], "x", "y", "v", "t")
    with pytest.raises(ValueError, match="panels must be a non-empty dict"):
        plotting.plot_heatmaps({}, ["row"], ["c0"], "x", "y", "v", "t")
    linear = plotting.plot_heatmaps({"a": [[0.0, -2.0]]}, ["row"], ["c0", "c1"], "x", "y", "v", "t", log_scale=False,
                                    cell_format="{:.2f}")
    assert [text.get_text() for text in linear.axes[0].texts] == ["0.00", "-2.00"]


def test_attention_weights_with_tokens_and_mask():
    tokens = ["the", "cat", "sat", "<pad>"]
    mask = dense_mask(causal, 4, 4)
    fig = plotting.plot_attention_weights(torch.softmax(torch.randn(2, 4, 4), dim=-1), tokens=tokens, mask=mask)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 3 and panels[0].get_title() == "the mask (dark = attend)"
    for ax in panels:
        assert [label.get_text() for label in ax.get_xticklabels()] == tokens
        assert [label.get_text() for label in ax.get_yticklabels()] == tokens
    with pytest.raises(ValueError, match=r"tokens must label Tq = 4 queries and Tk = 4 keys"):
        plotting.plot_attention_weights(torch.rand(2, 4, 4), tokens=tokens[:3])
    with pytest.raises(ValueError, match=r"mask must cover the weights' \(Tq, Tk\) = \(4, 4\)"):
        plotting.plot_attention_weights(torch.rand(2, 4, 4), mask=dense_mask(causal, 4, 5))


def test_figure_html_holds_a_png_twice_its_css_size_with_alt_text():
    import base64
    import re

    from PIL import Image

    html = plotting.figure_html(plotting.plot_mask(causal, q_len=4))
    match = re.fullmatch(r'<img class="attention-figure" src="data:image/png;base64,(?P<png>[A-Za-z0-9+/=]+)" '
                         r'width="(?P<width>\d+)" height="(?P<height>\d+)" alt="(?P<alt>[^"]+)">', html)
    assert match, html[:200]
    image = Image.open(io.BytesIO(base64.b64decode(match["png"])))
    assert abs(image.width - 2 * int(match["width"])) <= 1 and abs(image.height - 2 * int(match["height"])) <= 1
    assert image.getpixel((0, 0))[:3] == (255, 255, 255), "an opaque white background, legible in dark mode"
    assert match["alt"] == "causal (density 0.62)"
    assert plotting.figure_alt(plotting.plot_masks({"a": causal}, q_len=3, title="Two\nlines")) == "Two lines"


@pytest.mark.parametrize("inline_backend", [False, True], ids=["no-pyplot", "inline-backend"])
def test_show_displays_an_image_whatever_the_backend(inline_backend):
    """`show` puts one `<img>` in the cell's output, with or without matplotlib-inline's Figure formatter."""
    interactiveshell = pytest.importorskip("IPython.core.interactiveshell")
    from IPython.utils.capture import capture_output

    shell = interactiveshell.InteractiveShell.instance()
    png_formatter = shell.display_formatter.formatters["image/png"]
    if inline_backend:  # what importing pyplot in a kernel does: a PNG printer for every Figure
        png_formatter.for_type(Figure, lambda fig: b"inline backend's PNG")
    try:
        with capture_output() as captured:
            result = display.show(plotting.plot_mask(causal, q_len=4))
    finally:
        png_formatter.type_printers.pop(Figure, None)
        interactiveshell.InteractiveShell.clear_instance()  # get_ipython() is None again
    assert result is None, "show returns None: a cell ending in show(...) prints no repr"
    assert len(captured.outputs) == 1
    data = captured.outputs[0].data
    assert data["text/html"].startswith('<img class="attention-figure" src="data:image/png;base64,')
    assert data["text/plain"] == "[figure: causal (density 0.62)]"


def test_show_does_nothing_outside_ipython(capsys):
    assert display.show(plotting.plot_mask(causal, q_len=4)) is None
    assert capsys.readouterr().out == ""


def test_text_helpers_print_plain_text_outside_ipython(capsys):
    display.show_markdown("**bold** text")
    display.show_table("Errors", ["name", "error"], [["`split_heads`", "1.2e-07"], ["`flex`", 0.5]])
    assert capsys.readouterr().out == ("**bold** text\n"
                                       "Errors\n"
                                       "name           error  \n"
                                       "`split_heads`  1.2e-07\n"
                                       "`flex`         0.5    \n")


def test_show_source_prints_the_file_and_the_dedented_source(capsys):
    display.show_source(plotting.figure_alt)
    out = capsys.readouterr().out
    assert out.startswith("# attention/plotting.py: figure_alt\ndef figure_alt(fig):\n")
    assert out.endswith("return \" \".join(text.split())  # one line: titles may hold newlines\n\n")


def test_show_shape_puts_the_label_on_its_own_line_and_the_shapes_in_aligned_columns(capsys):
    """The label came third, after 42 columns of shapes: off-screen on a phone, which left the shapes anonymous."""
    display.show_shape("x", torch.zeros(2, 4, 6), "(B, T, d_in)")
    display.show_shape("q = query(x).view(B, T, H, D).transpose(1, 2)", torch.zeros(2, 2, 4, 3), "(B, H, T, D)")
    display.show_shape("mask", dense_mask(causal, 4, 4), "(T, T)")
    lines = capsys.readouterr().out.splitlines()
    assert lines[::2] == ["x", "q = query(x).view(B, T, H, D).transpose(1, 2)", "mask"]
    assert lines[1] == "    (2, 4, 6)" + " " * 8 + "(B, T, d_in)"
    assert lines[3].index("(B, H, T, D)") == lines[1].index("(B, T, d_in)") == lines[5].index("(T, T)") == 21
    assert lines[5].startswith("    (4, 4) ")


def test_text_helpers_display_markdown_in_ipython():
    interactiveshell = pytest.importorskip("IPython.core.interactiveshell")
    from IPython.utils.capture import capture_output

    interactiveshell.InteractiveShell.instance()
    try:
        with capture_output() as captured:
            display.show_markdown("**bold**")
            display.show_table("Errors", ["name", "error"], [["`flex`", "0.5"]])
            display.show_source(plotting.figure_alt)
    finally:
        interactiveshell.InteractiveShell.clear_instance()
    assert captured.stdout == ""
    assert [output.data["text/markdown"] for output in captured.outputs[:2]] == [
        "**bold**", "**Errors**\n\n| name | error |\n|---|---|\n| `flex` | 0.5 |"]
    source = captured.outputs[2].data["text/markdown"]
    assert source.startswith("```python\n# attention/plotting.py: figure_alt\ndef figure_alt(fig):") and source.endswith("\n```")


def test_masks_after_a_cache_label_the_queries_by_position():
    fig = plotting.plot_masks({"chunk": torch.ones(5, 15, dtype=torch.bool).tril(10)}, q_offset=10)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["Q10", "Q11", "Q12", "Q13", "Q14"]
    assert fig.axes[0].get_xticklabels()[0].get_text() == "KV0"
    with pytest.raises(ValueError, match="q_offset=3 labels tensor masks only"):
        plotting.plot_masks({"causal": causal}, q_len=4, q_offset=3)
    with pytest.raises(ValueError, match="q_offset must be non-negative"):
        plotting.plot_masks({"chunk": torch.ones(2, 2, dtype=torch.bool)}, q_offset=-1)


def test_log_scale_weights_tell_small_weights_apart():
    """On a log scale two weights 100x apart, both far below the largest, get different colours."""
    weights = torch.tensor([[[1.0, 0.0], [0.99, 0.0099]]])  # (H, Tq, Tk)
    fig = plotting.plot_attention_weights(weights, log_scale=True)
    image = fig.axes[0].images[0]
    small, tiny = image.to_rgba(0.0099), image.to_rgba(0.99)
    assert small != tiny and image.norm.vmin == plotting.LOG_SCALE_FLOOR
    with pytest.raises(ValueError, match="head_titles must name the 1 heads"):
        plotting.plot_attention_weights(weights, head_titles=["a", "b"])


def test_log_scale_weights_draw_masked_pairs_grey_not_like_the_smallest_weights():
    """The ALiBi figure drew the masked future and the smallest weights in the same black."""
    from matplotlib.colors import to_rgba

    weights = torch.tensor([[[1.0, 0.0], [0.9999, 0.0001]]])  # (H, Tq, Tk): pair (0, 1) masked, (1, 1) below the floor
    fig = plotting.plot_attention_weights(weights, log_scale=True)
    image = fig.axes[0].images[0]
    drawn = image.to_rgba(image.get_array())  # (Tq, Tk, 4): the colours on the figure
    assert tuple(drawn[0, 1]) == to_rgba(plotting.MASKED_GREY)
    assert tuple(drawn[1, 1]) == to_rgba("black") != tuple(drawn[0, 1])
    assert "grey: masked" in fig.axes[-1].get_ylabel()


def test_sweep_chart_guides_start_at_the_data():
    """The O(T) and O(T²) guides of a memory chart never reach below the lowest measured value (a guide
    drawn from the shortest T pulled the axis down to 0.03 MiB on the tiled page)."""
    import pathlib

    from attention import report

    run = report.load_result(pathlib.Path(__file__).resolve().parents[1] / "docs" / "results" / "long"
                             / "cpu-intel-xeon-2c-float32-long.json")
    fig = report.sequence.plot_memory_vs_seq_len(run, "forward")
    ax = fig.axes[0]
    data = [y for line in ax.lines if not line.get_label().startswith("O(") for y in line.get_ydata()]
    guides = [line for line in ax.lines if line.get_label().startswith("O(")]
    assert len(guides) == 2
    assert all(min(line.get_ydata()) >= min(data) * 0.999 for line in guides)


def test_flash_tiles_name_what_each_program_loads_masks_and_skips():
    """Over 200 queries and keys in tiles of 64: not causal, only the last row and column of tiles hold pairs past the
    length; causal, the tiles above the diagonal are never loaded, those on it are masked inside."""
    from attention.plotting import flash_tiles, plot_flash_tiles

    full = flash_tiles(200, 200, 64, 64, causal=False)
    assert len(full) == 16 and {key for key, kind in full.items() if kind == "masked"} == {
        (i, j) for i in range(4) for j in range(4) if 3 in (i, j)}
    causal = flash_tiles(200, 200, 64, 64, causal=True)
    assert {key for key, kind in causal.items() if kind == "skipped"} == {(i, j) for i in range(4) for j in range(4) if j > i}
    assert {key for key, kind in causal.items() if kind == "full"} == {(i, j) for i in range(3) for j in range(i)}
    assert flash_tiles(100, 40, 16, 32, causal=False)[6, 1] == "masked"  # keys 32..63 run past T_k = 40
    fig = plot_flash_tiles(200, 200, 64, 64)
    assert [ax.get_title() for ax in fig.axes] == ["not causal", "causal"]
    assert sum(len(ax.patches) for ax in fig.axes) == 32 and "T_q = 200" in fig.get_suptitle()


def test_attention_weights_colour_bar_names_other_values_when_told():
    """A linear attention's decay mask is drawn with the weights' function, under its own colour-bar label."""
    fig = plotting.plot_attention_weights(torch.rand(1, 3, 3).tril(), value_label="decay from key j to query i")
    assert "decay from key j to query i" in [ax.get_ylabel() for ax in fig.axes]
