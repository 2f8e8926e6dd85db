"""The book renderer and the figure description helper of ``selfattn.viz``.

Plotly 6+ emits only its JSON mimetype inside a kernel and Jupyter Book 1 drops it, so the renderer
must also emit a ``text/html`` figure; these tests check that bundle.
"""

from __future__ import annotations

import json
import re
import sys

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from selfattn import viz

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _figure(
    title="Attention weights", description="A 2 by 2 heat map of attention weights.", **layout
):
    fig = go.Figure(
        go.Heatmap(z=[[0.1, 0.9], [0.5, 0.5]], colorscale=viz.COLORSCALE),
        layout={"title": title, **layout},
    )
    return viz.describe(fig, description) if description else fig


def _bundle(fig):
    return pio.renderers[viz.RENDERER_NAME].to_mimebundle(fig.to_dict())


def _spec_from_html(markup: str) -> dict:
    match = re.search(r"var spec = (\{.*?\});\n", markup, flags=re.S)
    assert match, "no figure spec in the html"
    return json.loads(match.group(1))


@pytest.fixture
def restore_renderer():
    default = pio.renderers.default
    yield
    pio.renderers.default = default


def test_importing_viz_makes_the_book_renderer_the_default(restore_renderer, monkeypatch):
    monkeypatch.delenv("SELFATTN_PLOTLY_RENDERER", raising=False)
    viz.use_book_renderer()
    assert viz.RENDERER_NAME in pio.renderers
    assert pio.renderers.default == viz.RENDERER_NAME


def test_environment_variable_picks_another_renderer(restore_renderer, monkeypatch):
    monkeypatch.setenv("SELFATTN_PLOTLY_RENDERER", "json")
    viz.use_book_renderer()
    assert pio.renderers.default == "json"


def test_colab_keeps_its_renderer(restore_renderer, monkeypatch):
    monkeypatch.delenv("SELFATTN_PLOTLY_RENDERER", raising=False)
    monkeypatch.setitem(sys.modules, "google.colab", object())
    viz.use_book_renderer()
    assert pio.renderers.default == "colab"


def test_bundle_has_json_and_html():
    bundle = _bundle(_figure())
    assert set(bundle) == {PLOTLY_MIME, "text/html"}
    fig_dict = _figure().to_dict()
    assert bundle[PLOTLY_MIME]["data"] == fig_dict["data"]
    assert bundle[PLOTLY_MIME]["layout"]["title"] == fig_dict["layout"]["title"]


def test_figure_repr_uses_the_book_renderer(restore_renderer, monkeypatch):
    monkeypatch.delenv("SELFATTN_PLOTLY_RENDERER", raising=False)
    viz.use_book_renderer()
    bundle = _figure()._repr_mimebundle_()
    assert PLOTLY_MIME in bundle and "text/html" in bundle
    assert bundle["text/html"].count("plotly-graph-div") == 1


def test_html_has_one_plotly_div_the_description_and_the_data():
    fig = _figure()
    markup = _bundle(fig)["text/html"]
    assert markup.count("plotly-graph-div") == 1
    assert markup.count("<script") == 1 and markup.count("</script>") == 1
    assert '<p class="selfattn-figure-text">A 2 by 2 heat map of attention weights.</p>' in markup
    assert 'aria-label="A 2 by 2 heat map of attention weights."' in markup
    spec = _spec_from_html(markup)
    assert spec["data"] == fig.to_dict()["data"]
    assert spec["layout"]["title"]["text"] == "Attention weights"
    div_id = re.search(r'<div id="([^"]+)" class="plotly-graph-div"', markup).group(1)
    assert markup.count(div_id) == 2  # the div and the script that draws into it


def test_html_div_ids_are_unique():
    fig = _figure()
    ids = {re.search(r'id="([^"]+)"', _bundle(fig)["text/html"]).group(1) for _ in range(5)}
    assert len(ids) == 5


def test_script_end_tag_in_figure_text_is_escaped():
    evil = "</script><script>alert(1)</script>"
    fig = _figure(title=evil, description=f"Description with {evil} & <b>")
    markup = _bundle(fig)["text/html"]
    assert markup.count("</script>") == 1  # only the renderer's own
    assert markup.rstrip().endswith("</script>\n</div>")
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;" in markup
    assert _spec_from_html(markup)["layout"]["title"]["text"] == evil  # the data survives intact


def test_frames_are_kept():
    fig = _figure()
    fig.frames = [go.Frame(data=[go.Heatmap(z=[[1, 0], [0, 1]])], name="f0")]
    markup = _bundle(fig)["text/html"]
    assert [f["name"] for f in _spec_from_html(markup)["frames"]] == ["f0"]
    assert "addFrames" in markup


def test_height_from_layout():
    assert "min-height:321px" in _bundle(_figure(height=321))["text/html"]
    assert "min-height:450px" in _bundle(_figure())["text/html"]


def test_undescribed_figure_still_renders_with_a_generic_label():
    markup = _bundle(_figure(description=None))["text/html"]
    assert 'aria-label="interactive figure"' in markup
    assert "selfattn-figure-text" not in markup


def test_describe_returns_the_figure_and_keeps_other_meta():
    fig = go.Figure(layout={"meta": {"source": "chapter 02"}})
    assert viz.describe(fig, "  Softmax of three scores.  ") is fig
    assert viz.figure_description(fig) == "Softmax of three scores."
    assert fig.layout.meta["source"] == "chapter 02"
    assert viz.figure_description(go.Figure()) == ""


@pytest.mark.parametrize("text", ["", "   ", None, 3])
def test_describe_refuses_empty_text(text):
    with pytest.raises(ValueError, match=r"description must be a non-empty string; got"):
        viz.describe(go.Figure(), text)


def test_colour_scales_are_the_accessible_ones():
    assert viz.COLORSCALE == "Viridis" and viz.DIVERGING == "RdBu"


def test_with_lab_notes_folds_the_notes_in_a_details_box():
    from selfattn.viz import with_lab_notes

    text = with_lab_notes("The loop took 1.5 times SDPA's time.", "The load average was 2.")
    assert text.startswith("The loop took 1.5 times SDPA's time.\n\n<details class=\"selfattn-labnotes\">")
    assert text.rstrip().endswith("</details>") and "<summary>Lab notes</summary>" in text
    assert text.index("The load average was 2.") > text.index("<summary>Lab notes</summary>")
    assert with_lab_notes("main", "  ") == "main"
    with pytest.raises(TypeError, match="notes must be a str"):
        with_lab_notes("main", None)


def test_colour_bar_titles_are_set_along_the_bar_unless_a_side_is_chosen():
    """Issue 31: above the bar (plotly's default side) a colour bar's title is drawn over its top tick label."""
    fig = go.Figure([go.Heatmap(z=[[0.0, 1.0]], colorbar={"title": "weight"}),
                     go.Heatmap(z=[[0.0, 1.0]], colorbar={"title": {"text": "M", "side": "top"}}),
                     go.Heatmap(z=[[0.0, 1.0]]), go.Scatter(x=[0, 1], y=[1, 2])])
    data = _bundle(fig)[PLOTLY_MIME]["data"]
    assert data[0]["colorbar"]["title"] == {"text": "weight", "side": "right"}
    assert data[1]["colorbar"]["title"] == {"text": "M", "side": "top"}
    assert "colorbar" not in data[2] and "colorbar" not in data[3]
    assert [d["z"] for d in data[:3]] == [[[0.0, 1.0]]] * 3  # the data are untouched
    assert _spec_from_html(_bundle(fig)["text/html"])["data"] == data


def test_the_figure_html_fits_the_figure_after_drawing_it():
    """The renderer's fit-to-width pass (issue 31) runs after plotly draws and only through Plotly.relayout/restyle."""
    markup = _bundle(_figure())["text/html"]
    assert "window._selfattnFit(el)" in markup and "plotly_afterplot" in markup
    assert "newPlot" not in viz._FIT_JS and "react(" not in viz._FIT_JS  # it never redraws the figure from scratch


def test_the_json_mimetype_is_plain_json_even_when_the_figure_dict_holds_numpy_arrays():
    # Regression (issue 31 item 8, reader trial): plotly 5 keeps NumPy arrays in a figure's dict, the
    # renderer passed them on in its JSON mimetype, and ipykernel < 6.29 failed with "Can't clean for JSON"
    # (chapters 07 and 11). json.dumps stands for the kernel's cleaning: it refuses a NumPy array too.
    import json

    import numpy as np

    from selfattn.viz import BookRenderer

    fig_dict = {"data": [{"type": "scatter", "x": np.arange(3), "y": np.array([0.5, 1.5, 2.5])}],
                "layout": {"title": {"text": "t"}}}
    bundle = BookRenderer().to_mimebundle(fig_dict)
    part = bundle["application/vnd.plotly.v1+json"]
    assert json.loads(json.dumps(part))["data"][0]["y"] == [0.5, 1.5, 2.5]
    assert "plotly-graph-div" in bundle["text/html"]
