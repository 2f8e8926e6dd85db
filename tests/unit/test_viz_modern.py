"""Figure builders of chapter 07's modern block: data, descriptions and argument checks."""

import numpy as np
import pytest

from selfattn.viz import figure_description
from selfattn.viz.modern import logit_growth_figure, stream_rms_figure

OKABE_ITO = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"}


def test_stream_rms_figure_has_both_lines_and_describes_them():
    fig = stream_rms_figure([1.0, 1.5, 2.25], [1.0, 1.0, 0.999999])
    assert [t.name for t in fig.data] == ["stream, no final norm", "after a final RMSNorm"]
    assert list(fig.data[0].x) == [0, 1, 2] and list(fig.data[0].y) == [1.0, 1.5, 2.25]
    assert {t.line.color for t in fig.data} <= OKABE_ITO
    text = figure_description(fig)
    assert "from 1.00 to 2.25" in text and "between 1.000 and 1.000" in text


@pytest.mark.parametrize(
    ("without", "with_", "match"),
    [([1, 2], [1, 1, 1], "same length"), ([], [], "non-empty"), ([1, np.nan], [1, 1], "finite")],
)
def test_stream_rms_figure_refuses_bad_curves(without, with_, match):
    with pytest.raises(ValueError, match=match):
        stream_rms_figure(without, with_)


def test_logit_growth_figure_draws_bounds_dotted_on_a_log_axis():
    fig = logit_growth_figure({"without": [5, 50, 300], "with": [3, 10, 11]}, {"with": [4, 15, 17]})
    assert [t.name for t in fig.data] == ["without", "with", "with: bound"]
    assert fig.data[2].line.dash == "dot" and fig.data[2].line.color == fig.data[1].line.color
    assert fig.layout.yaxis.type == "log" and {t.line.color for t in fig.data} <= OKABE_ITO
    assert "without: from 5.0 to 300.0" in figure_description(fig) and "bound ends at 17.0" in figure_description(fig)


def test_logit_growth_figure_refuses_bad_input():
    with pytest.raises(ValueError, match="at least one run"):
        logit_growth_figure({})
    with pytest.raises(ValueError, match="not in curves"):
        logit_growth_figure({"a": [1, 2]}, {"b": [1, 2]})
    with pytest.raises(ValueError, match="length of its curve"):
        logit_growth_figure({"a": [1, 2]}, {"a": [1, 2, 3]})
    with pytest.raises(ValueError, match="> 0"):
        logit_growth_figure({"a": [0, 2]})
