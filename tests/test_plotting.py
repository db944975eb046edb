"""Every plotting helper returns a Figure with the expected axes, titles, axis labels and colour bars."""

import io

import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from attention import plotting  # noqa: E402
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
    for ax in panels:
        assert ax.get_xlabel() and ax.get_ylabel()
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
