"""selfattn.viz.views_figure: several figures behind buttons (the new chapters' explorers)."""

import plotly.graph_objects as go
import pytest

from selfattn.viz import figure_description, views_figure


def _bar(title, ys, **layout):
    fig = go.Figure(go.Bar(y=ys))
    fig.update_layout(title=title, **layout)
    return fig


def test_each_button_shows_only_its_views_traces_and_titles():
    a = _bar("A", [1, 2], yaxis_title="count")
    b = go.Figure([go.Bar(y=[3, 4]), go.Bar(y=[5, 6])])
    b.update_layout(title="B", yaxis_type="log")
    fig = views_figure({"first": a, "second": b}, label="run")
    assert [t.visible for t in fig.data] == [True, False, False]
    assert [list(t.y) for t in fig.data] == [[1, 2], [3, 4], [5, 6]]
    first, second = fig.layout.updatemenus[0].buttons
    assert first.args[0]["visible"] == [True, False, False] and second.args[0]["visible"] == [False, True, True]
    assert second.args[1]["title"]["text"] == "B" and second.args[1]["yaxis.type"] == "log"
    assert first.args[1]["yaxis.title"]["text"] == "count"
    assert fig.layout.title.text == "A"
    assert figure_description(fig).startswith("Buttons (run: first, second) switch between views.")


def test_bad_views_are_refused_by_name():
    with pytest.raises(ValueError, match="at least two figures; got 1"):
        views_figure({"a": _bar("A", [1])})
    with pytest.raises(TypeError, match=r"views\['b'\] must be a plotly Figure; got dict"):
        views_figure({"a": _bar("A", [1]), "b": {}})
    with pytest.raises(ValueError, match=r"views\['b'\] has no traces"):
        views_figure({"a": _bar("A", [1]), "b": go.Figure()})
