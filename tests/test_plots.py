"""Figures a paper could use: panels wrap four to a row, at most 8 curves to a panel each in a
style of its own (coinciding curves both show), colour-blind-safe colours, accuracy on
[0, 1], short labels, and legends no wider than the figure."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from attnlab.plot_labels import MOST, families, layer_name, short_labels
from attnlab.plots import attention_figure, bands_figure, curves_figure, heatmap_figure

BAND = ([8, 16, 32], [1.0, 0.5, 0.0], [0.9, 0.4, 0.0], [1.0, 0.6, 0.1])
CURVE = ([100, 200, 300], [0.2, 0.5, 0.7])
TWELVE = [f"pe={pe},norm={norm}" for norm in ("softmax", "l2") for pe in "abcdef"]


def curves_of(figure: Figure) -> list[list[Line2D]]:
    """Each visible panel's curves (not the dotted marks or the reference)."""
    panels = [ax for ax in figure.axes if ax.get_visible()]  # the subfigures' too
    return [[line for line in ax.get_lines() if line.get_marker() != "None"] for ax in panels]


def legends_of(figure: Figure) -> list:
    parts = [figure, *figure.subfigs]
    found = [legend for part in parts for legend in part.legends]
    return found + [ax.get_legend() for ax in figure.axes if ax.get_legend()]


@pytest.mark.parametrize(("panels", "rows", "columns"), [(2, 1, 2), (4, 1, 4), (7, 2, 4)])
def test_panels_wrap_four_to_a_row_and_the_spare_cells_stay_empty(panels, rows, columns):
    figure = bands_figure(
        {f"task{i}": {"pe=rope": BAND, f"pe={i}": BAND} for i in range(panels)},
        "length",
        "exact match",
        {},
        log_y=False,
    )
    (part,) = figure.subfigs
    visible = [ax for ax in part.axes if ax.get_visible()]
    assert len(visible) == panels and len(part.axes) == rows * columns
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in part.axes} == {(rows, columns)}
    assert [ax.get_title() for ax in visible] == [f"task{i}" for i in range(panels)]
    (legend,) = legends_of(figure)
    assert legend.get_title().get_text() == "pe"  # the one key swept, said once
    assert {text.get_text() for text in legend.get_texts()} == {
        "rope",
        *(str(i) for i in range(panels)),
    }


def test_twelve_configurations_are_split_into_panels_of_at_most_eight_by_family():
    figure = curves_figure(dict.fromkeys(TWELVE, CURVE), "val/loss")
    panels = curves_of(figure)
    assert len(panels) == 2 and all(len(lines) <= MOST for lines in panels)
    titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
    assert titles == ["norm: softmax", "norm: l2"]
    assert [line.get_label() for line in panels[0]] == list("abcdef")  # norm said in the title

    bands = bands_figure({"copy": dict.fromkeys(TWELVE, BAND)}, "length", "exact match", {})
    assert [len(lines) for lines in curves_of(bands)] == [6, 6]
    assert [part._suptitle.get_text() for part in bands.subfigs] == titles


def test_labels_without_a_grouping_key_are_chunked_evenly_in_their_order():
    names = [f"run{i}" for i in range(11)]
    assert families(names) == [
        ("configurations 1–6 of 11", names[:6]),
        ("configurations 7–11 of 11", names[6:]),
    ]


@pytest.mark.parametrize("figure", ["curves", "bands"])
def test_two_identical_curves_both_show(figure):
    same = {"pe=rope": CURVE, "pe=alibi": CURVE}
    if figure == "curves":
        drawn = curves_figure(same, "val/loss")
    else:
        drawn = bands_figure({"copy": {k: (*v, *v[1:], v[1]) for k, v in same.items()}},
                             "length", "loss", {}, log_y=False)  # fmt: skip
    ((first, second),) = curves_of(drawn)
    assert (first.get_linestyle(), first.get_marker()) != (
        second.get_linestyle(),
        second.get_marker(),
    )
    assert second.get_zorder() > first.get_zorder()  # drawn on top ...
    assert second.get_linewidth() < first.get_linewidth()  # ... and thinner, the first shows
    assert second.get_markersize() < first.get_markersize()
    assert first.get_color() != second.get_color()


def test_eight_curves_each_have_a_colour_a_line_style_and_a_marker_of_their_own():
    labels = [f"pe={i}" for i in range(8)]
    (lines,) = curves_of(bands_figure({"copy": dict.fromkeys(labels, BAND)}, "n", "loss", {}))
    assert len({line.get_color() for line in lines}) == 8
    assert len({line.get_marker() for line in lines}) == 8
    assert len({line.get_linestyle() for line in lines}) == 4  # and the markers tell apart


@pytest.mark.parametrize(
    ("metric", "fixed"), [("val/acc", True), ("val/seq_acc", True), ("val/loss", False)]
)
def test_an_accuracy_axis_spans_zero_to_one(metric, fixed):
    curves = {"pe=rope": ([1, 2], [0.104, 0.118]), "pe=alibi": ([1, 2], [0.11, 0.112])}
    (ax,) = curves_figure(curves, metric).axes
    low, high = ax.get_ylim()
    assert (low == pytest.approx(0, abs=0.05) and high == pytest.approx(1, abs=0.05)) == fixed


def test_an_exact_match_axis_of_bands_spans_zero_to_one():
    figure = bands_figure({"copy": {"pe=rope": ([8, 16], [0.1, 0.11], [0.1, 0.1], [0.11, 0.12])}},
                          "length", "test exact match", {}, log_y=False)  # fmt: skip
    low, high = figure.subfigs[0].axes[0].get_ylim()
    assert low == pytest.approx(0, abs=0.05) and high == pytest.approx(1, abs=0.05)


RED_GREEN = {"RdYlGn", "RdYlGn_r", "RdGy", "PiYG", "PRGn", "brg", "jet", "hsv", "rainbow"}


def test_a_heat_map_of_accuracy_is_viridis_from_zero_to_one():
    matrix = np.array([[0.1, 0.12], [0.11, np.nan]])
    figure = heatmap_figure(
        matrix, ["pe=rope", "pe=alibi"], ["1", "2"], "t", ("position", "configuration"), "accuracy"
    )
    (image,) = figure.axes[0].get_images()
    assert image.get_cmap().name not in RED_GREEN and image.get_cmap().name in {
        "viridis",
        "cividis",
    }
    assert image.get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == ["rope", "alibi"]
    assert figure.axes[0].get_ylabel() == "configuration (pe)"


LONG = [
    f"pe=rope,norm=softmax,model.schedule.pattern=[{{pe:pe,window:{i}}},{{pe:nope}}],model.qk_norm={i}"
    for i in range(8)
]


@pytest.mark.parametrize("figure", ["curves", "bands"])
def test_a_legend_of_eight_long_labels_is_no_wider_than_the_figure(figure):
    if figure == "curves":
        drawn = curves_figure(dict.fromkeys(LONG, CURVE), "val/loss")
    else:
        drawn = bands_figure({"copy": dict.fromkeys(LONG, BAND)}, "length", "loss", {})
    drawn.canvas.draw()
    renderer = drawn.canvas.get_renderer()
    (legend,) = legends_of(drawn)
    assert len(legend.get_texts()) == 8
    assert legend.get_window_extent(renderer).width <= drawn.bbox.width
    for ax in drawn.axes:
        if ax.get_legend():  # below its own panel: no wider than it
            assert legend.get_window_extent(renderer).width <= ax.get_window_extent(renderer).width


def test_labels_keep_only_the_keys_that_vary_and_notes_every_label_has_move_out():
    key, notes, named = short_labels(["pe=rope,norm=l2 (3 seeds)", "pe=alibi,norm=l2 (3 seeds)"])
    assert (key, notes) == ("pe", "(3 seeds)")
    assert named == {"pe=rope,norm=l2 (3 seeds)": "rope", "pe=alibi,norm=l2 (3 seeds)": "alibi"}
    _, _, named = short_labels(["pe=rope,norm=l2", "pe=alibi,norm=softmax"])
    assert list(named.values()) == ["pe=rope, norm=l2", "pe=alibi, norm=softmax"]


def test_attention_layers_are_named_layer_n_not_by_their_module_path():
    assert layer_name("stack.blocks.0.self_attn") == "layer 1"
    assert layer_name("decoder.blocks.1.cross.attn") == "decoder layer 2 (cross)"
    assert layer_name("encoder.blocks.0.self_attn") == "encoder layer 1"
    figure = attention_figure({"stack.blocks.0.self_attn": np.full((2, 3, 3), 1 / 3)}, "t")
    assert figure.axes[0].get_ylabel() == "layer 1\nquery position"
