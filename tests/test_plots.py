"""Figures of bands: panels wrap four to a row, every label in one legend, each curve told
apart from the others when the colours run out."""

from __future__ import annotations

import pytest

from attnlab.plots import bands_figure

BAND = ([8, 16, 32], [1.0, 0.5, 0.0], [0.9, 0.4, 0.0], [1.0, 0.6, 0.1])


@pytest.mark.parametrize(("panels", "rows", "columns"), [(2, 1, 2), (4, 1, 4), (7, 2, 4)])
def test_panels_wrap_four_to_a_row_and_the_spare_cells_stay_empty(panels, rows, columns):
    figure = bands_figure(
        {f"task{i}": {"pe=rope": BAND, f"pe={i}": BAND} for i in range(panels)},
        "length",
        "exact match",
        {},
        log_y=False,
    )
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert len(visible) == panels and len(figure.axes) == rows * columns
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in figure.axes} == {(rows, columns)}
    assert [ax.get_title() for ax in visible] == [f"task{i}" for i in range(panels)]
    (legend,) = [ax.get_legend() for ax in figure.axes if ax.get_legend() is not None]
    assert {text.get_text() for text in legend.get_texts()} == {
        "pe=rope",
        *(f"pe={i}" for i in range(panels)),
    }


def test_past_ten_curves_the_colours_repeat_with_another_line_style_and_marker():
    labels = [f"pe={i}" for i in range(11)]
    figure = bands_figure({"copy": dict.fromkeys(labels, BAND)}, "length", "exact match", {})
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    first, eleventh = lines["pe=0"], lines["pe=10"]
    assert first.get_color() == eleventh.get_color()  # matplotlib's 10 colours, then again
    assert (first.get_linestyle(), first.get_marker()) == ("-", "o")
    assert (eleventh.get_linestyle(), eleventh.get_marker()) == ("--", "s")
    styles = {
        (line.get_color(), line.get_linestyle(), line.get_marker()) for line in lines.values()
    }
    assert len(styles) == len(labels)
    (shaded, *_) = figure.axes[0].collections
    assert shaded.get_alpha() == pytest.approx(0.08)  # eleven ranges: drawn fainter
