"""selfattn.viz.positions: every figure draws the numbers it claims, at every slider position.

Expected values are written out here with NumPy (rotation angles, RoPE scores, ALiBi biases,
sinusoids), independently of the figure code; the RoPE scores are also compared with the package's
own ``apply_rope``, as the chapter says they are.
"""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from selfattn import positions as P
from selfattn.viz import figure_description
from selfattn.viz import positions as vp

OKABE_ITO = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"}


def _qk(d_head=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(d_head, generator=g, dtype=torch.float64), torch.randn(d_head, generator=g, dtype=torch.float64)


def _numpy_rope(x: np.ndarray, m: float, base: float, layout: str) -> np.ndarray:
    """RoPE of one (Dh,) vector at position m, written out: pair i turned by m * base^(-2i/Dh)."""
    Dh = x.shape[0]
    out = x.copy()
    for i in range(Dh // 2):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + Dh // 2)
        t = m * base ** (-2.0 * i / Dh)
        out[a] = x[a] * math.cos(t) - x[b] * math.sin(t)
        out[b] = x[a] * math.sin(t) + x[b] * math.cos(t)
    return out


def _package_score(q, k, m, n, base, layout) -> float:
    qm = P.apply_rope(q[None], [m], base=base, layout=layout)[0]
    kn = P.apply_rope(k[None], [n], base=base, layout=layout)[0]
    return float(qm @ kn)


def _apply(state: dict, step: dict) -> None:
    """Do what plotly.js does for an ``update`` step: restyle the listed traces, relayout the rest.

    A value of None (JSON null) resets that attribute to its default; the figure uses it only for
    attributes the trace type does not have (asserted), so here it leaves the trace alone."""
    assert step["method"] == "update"
    data_update, layout_update, traces = step["args"]
    for key, values in data_update.items():
        for i, t in enumerate(traces):
            value = values[i % len(values)]
            trace = state["data"][t]
            if value is None:
                polar = trace["type"] == "scatterpolar"
                assert (key in ("x", "y")) == polar, f"null for {key} on a {trace['type']} trace"
                continue
            trace[key] = value
    for key, value in layout_update.items():
        if key.startswith("annotations["):
            index = int(key[len("annotations["):key.index("]")])
            state["layout"]["annotations"][index]["text"] = value
        else:
            node = state["layout"]
            *path, last = key.split(".")
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value


def _angle(x: np.ndarray, a: int, b: int) -> float:
    return math.degrees(math.atan2(x[b], x[a]))


def _same_angle(got: float, expected: float, tol: float = 1e-9) -> bool:
    diff = (got - expected + 180.0) % 360.0 - 180.0
    return abs(diff) <= tol


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rope_figure_every_combination_of_the_two_sliders_draws_the_right_arrows_and_score(layout):
    q, k = _qk()
    base = 10000.0
    shifts, offsets = range(0, 12), range(-2, 6)
    fig = vp.rope_score_figure(q, k, shifts=shifts, offsets=offsets, pairs=(0, 1, 2), base=base, layout=layout)
    spec = fig.to_dict()
    (slider,) = spec["layout"]["sliders"]  # one slider: the book's browser tests drive one per figure
    (menu,) = spec["layout"]["updatemenus"]
    assert len(slider["steps"]) == len(shifts) and [b["label"] for b in menu["buttons"]] == [str(d) for d in offsets]
    assert slider["currentvalue"]["prefix"].startswith("key position n")
    assert menu["name"] == "offset m − n" and menu["type"] == "buttons"
    qn, kn = q.numpy(), k.numpy()
    feats = [(2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + 4) for i in (0, 1, 2)]
    marker = spec["data"][-1]
    checked = 0
    for (sn, n), (so, d) in itertools.product(enumerate(shifts), enumerate(offsets)):
        # Either order of moving the sliders must give the same picture.
        for order in ((slider["steps"][sn], menu["buttons"][so]), (menu["buttons"][so], slider["steps"][sn])):
            state = copy.deepcopy(spec)
            for step in order:
                _apply(state, step)
            m = n + d
            q_m, k_n = _numpy_rope(qn, m, base, layout), _numpy_rope(kn, n, base, layout)
            for j, (a, b) in enumerate(feats):
                polar = state["layout"]["polar" if j == 0 else f"polar{j + 1}"]
                rotation = polar["angularaxis"]["rotation"]
                k_arrow, q_arrow = state["data"][2 * j], state["data"][2 * j + 1]
                assert _same_angle(rotation + k_arrow["theta"][1], _angle(k_n, a, b)), (n, d, j)
                assert _same_angle(rotation + q_arrow["theta"][1], _angle(q_m, a, b)), (n, d, j)
                assert math.isclose(q_arrow["r"][1], math.hypot(qn[a], qn[b]), rel_tol=1e-12)
            expected = float(q_m @ k_n)
            assert abs(expected - _package_score(q, k, m, n, base, layout)) <= 1e-12
            marker = state["data"][-1]
            assert list(marker["x"]) == [n]
            assert np.isfinite(marker["y"][0]) and abs(marker["y"][0] - expected) <= 1e-12, (n, d)
            line = state["data"][-2]
            want = [float(_numpy_rope(qn, s + d, base, layout) @ _numpy_rope(kn, s, base, layout)) for s in shifts]
            np.testing.assert_allclose(line["y"], want, rtol=0, atol=1e-12)
            assert f"m − n = {d}: score {expected:.4f}" in state["layout"]["annotations"][3]["text"]
            checked += 1
    assert checked == 2 * len(shifts) * len(offsets)


def test_rope_figure_initial_state_is_the_first_step_of_both_sliders():
    q, k = _qk()
    fig = vp.rope_score_figure(q, k, shifts=range(3, 9), offsets=range(1, 4))
    spec = fig.to_dict()
    state = copy.deepcopy(spec)
    _apply(state, spec["layout"]["sliders"][0]["steps"][0])
    _apply(state, spec["layout"]["updatemenus"][0]["buttons"][0])
    for before, after in zip(spec["data"], state["data"], strict=True):
        for key in ("x", "y", "theta", "r"):
            if key in before:
                np.testing.assert_allclose(np.asarray(after[key], float), np.asarray(before[key], float), atol=1e-12)
    assert state["layout"]["polar"]["angularaxis"]["rotation"] == pytest.approx(
        spec["layout"]["polar"]["angularaxis"]["rotation"], abs=1e-12)


def test_rope_score_is_flat_along_each_offset_and_described():
    q, k = _qk(d_head=16, seed=3)
    data = vp.rope_score_data(q, k, shifts=range(40), offsets=range(-3, 4), layout="half")
    assert data["scores"].shape == (7, 40)
    assert np.isfinite(data["scores"]).all()
    assert np.ptp(data["scores"], axis=1).max() < 1e-12  # claim 23: depends on m - n only
    for i, d in enumerate(range(-3, 4)):
        want = float(_numpy_rope(q.numpy(), 10 + d, 10000.0, "half") @ _numpy_rope(k.numpy(), 10, 10000.0, "half"))
        assert abs(data["scores"][i, 10] - want) <= 1e-12
    np.testing.assert_allclose(data["theta"], 10000.0 ** (-np.arange(0, 16, 2) / 16), rtol=1e-15)
    text = figure_description(vp.rope_score_figure(q, k))
    assert "buttons pick the offset" in text and "does not change" in text and "offset 0:" in text


def test_rope_view_matches_the_figure_at_the_same_positions():
    q, k = _qk()
    view = vp.rope_score_view(q, k, 7, 3)
    assert not view.layout.sliders and not view.layout.updatemenus and figure_description(view).startswith("Query at position 7, key at position 3.")
    state = copy.deepcopy(vp.rope_score_figure(q, k).to_dict())
    _apply(state, state["layout"]["sliders"][0]["steps"][3])
    _apply(state, state["layout"]["updatemenus"][0]["buttons"][4])
    spec = view.to_dict()
    for j in range(2):
        polar = "polar" if j == 0 else f"polar{j + 1}"
        assert spec["layout"][polar]["angularaxis"]["rotation"] == pytest.approx(
            state["layout"][polar]["angularaxis"]["rotation"], abs=1e-9)
        assert spec["data"][2 * j + 1]["theta"][1] == pytest.approx(state["data"][2 * j + 1]["theta"][1], abs=1e-9)
    expected = _package_score(q, k, 7, 3, 10000.0, "interleaved")
    assert list(spec["data"][-1]["x"]) == [3] and abs(spec["data"][-1]["y"][0] - expected) <= 1e-12
    # An offset outside the given range is added, a negative one too.
    far = vp.rope_score_view(q, k, 1, 20, offsets=range(3))
    assert abs(far.data[-1].y[0] - _package_score(q, k, 1, 20, 10000.0, "interleaved")) <= 1e-12


def test_rope_figures_have_no_fixed_width_no_legend_and_safe_colours():
    q, k = _qk()
    for fig in (vp.rope_score_figure(q, k), vp.rope_score_view(q, k, 2, 1)):
        assert fig.layout.width is None and fig.layout.autosize is True and fig.layout.height <= 1000
        assert fig.layout.showlegend is False  # nothing for a slider to cover
        colours = {t.line.color for t in fig.data if t.line.color} | {t.marker.color for t in fig.data if isinstance(t.marker.color, str)}
        assert colours <= OKABE_ITO | {"#BBBBBB"}, colours


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"q": np.ones(7), "k": np.ones(7)}, ValueError, r"q must have shape \(Dh,\) with Dh even"),
        ({"q": np.ones(8), "k": np.ones(6)}, ValueError, "same shape"),
        ({"q": np.ones((2, 4)), "k": np.ones(8)}, ValueError, r"got shape \(2, 4\)"),
        ({"q": np.array([1.0, np.nan]), "k": np.ones(2)}, ValueError, "q must be finite"),
        ({"q": np.ones(8, dtype=bool), "k": np.ones(8)}, TypeError, "real numbers"),
        ({"pairs": (4,)}, ValueError, r"pairs must be distinct pair indices in 0..3"),
        ({"layout": "rotate_half"}, ValueError, "layout must be one of"),
        ({"shifts": [3, 1]}, ValueError, "shifts must be increasing"),
        ({"offsets": [0.5]}, ValueError, "offsets must be a non-empty sequence of ints"),
        ({"base": 1.0}, ValueError, "base must be"),
    ],
)
def test_rope_figure_rejects_bad_input_naming_the_argument(kwargs, error, match):
    args = {"q": np.ones(8), "k": np.ones(8), **kwargs}
    with pytest.raises(error, match=match):
        vp.rope_score_figure(args.pop("q"), args.pop("k"), **args)


def test_rope_view_rejects_non_integer_positions():
    with pytest.raises(ValueError, match="m must be an int"):
        vp.rope_score_view(np.ones(4), np.ones(4), 1.5, 0)


def test_rope_explorer_widget_builds_with_two_sliders():
    q, k = _qk()
    box = vp.rope_explorer_widget(q, k, m=6, n=2, max_position=20)
    sliders = box.children[0].children
    assert [s.value for s in sliders] == [6, 2] and [s.max for s in sliders] == [20, 20]
    assert [s.description for s in sliders] == ["query m", "key n"]
    sliders[0].value = 9  # the callback re-draws without error
    with pytest.raises(ValueError, match="n must be an int in 0..max_position=20"):
        vp.rope_explorer_widget(q, k, n=21, max_position=20)


# --------------------------------------------------------------------------------------------------
# ALiBi
# --------------------------------------------------------------------------------------------------


def _paper_slopes(H: int) -> list[float]:
    """Press et al.'s recipe, written out for the test: geometric for powers of two, else the closest
    power of two below, then every other slope of twice that many heads."""
    if H & (H - 1) == 0:
        return [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)]
    n = 2 ** int(math.log2(H))
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)] + [2.0 ** (-8.0 * (h + 1) / (2 * n)) for h in range(0, 2 * n, 2)][: H - n]


@pytest.mark.parametrize("H", [8, 12])
def test_alibi_bias_figure_has_one_frame_per_head_with_its_bias_and_slope(H):
    T = 6
    fig = vp.alibi_bias_figure(H, T)
    assert len(fig.frames) == H and len(fig.layout.sliders[0].steps) == H
    slopes = _paper_slopes(H)
    for h, frame in enumerate(fig.frames):
        z = frame.data[0].z
        for i in range(T):
            for j in range(T):
                if j > i:
                    assert z[i][j] is None  # masked: blank, not a number
                else:
                    assert z[i][j] == pytest.approx(-slopes[h] * (i - j), abs=1e-6)
        assert f"{slopes[h]:.4g}" in frame.layout.title.text
    if H == 12:
        assert "head 8: slope m = 2^-0.5 = 0.7071" in fig.frames[8].layout.title.text
    assert fig.data[0].colorscale[0][1] == "#440154" and fig.data[0].zmax == 0.0  # Viridis
    assert "slider picks the head" in figure_description(fig)
    with pytest.raises(ValueError, match="n_heads must be an int >= 1"):
        vp.alibi_bias_figure(0)
    with pytest.raises(ValueError, match="T must be an int >= 2"):
        vp.alibi_bias_figure(4, 1)


def test_alibi_distance_figure_draws_a_line_per_head_at_its_slope():
    fig = vp.alibi_distance_figure(4, max_distance=10)
    assert len(fig.data) == 4
    slopes = _paper_slopes(4)
    for h, trace in enumerate(fig.data):
        np.testing.assert_allclose(trace.y, -slopes[h] * np.arange(11), rtol=0, atol=1e-12)
        assert trace.line.color in OKABE_ITO
    assert "distance 10" in figure_description(fig) and fig.layout.width is None


# --------------------------------------------------------------------------------------------------
# Extrapolation (claim 24)
# --------------------------------------------------------------------------------------------------


def _synthetic_losses():
    x = np.arange(256)
    return {
        "learned": np.full(64, 2.0),
        "sinusoidal": np.where(x < 64, 2.0, 3.0),
        "rope": np.where(x < 64, 2.0, 2.5),
        "alibi": np.full(256, 2.0),
        "none": np.where(x < 64, 2.25, 2.75),
    }


def test_extrapolation_figure_draws_every_curve_and_the_training_length():
    losses = _synthetic_losses()
    fig = vp.extrapolation_figure(losses, train_length=64, baselines={"uniform": 4.5, "unigram": 3.25})
    names = [t.name for t in fig.data]
    assert names[:5] == list(losses) and names[5:] == ["uniform = 4.50", "unigram = 3.25"]
    assert len(fig.data[0].x) == 64 and len(fig.data[1].x) == 256
    np.testing.assert_allclose(fig.data[2].y, losses["rope"], rtol=0, atol=0)
    np.testing.assert_allclose(fig.data[6].y, [3.25, 3.25])
    (line,) = fig.layout.shapes
    assert line.x0 == line.x1 == 63.5
    assert fig.data[2].line.color == vp.SCHEME_STYLES["rope"][0]
    text = figure_description(fig)
    assert "learned: 2.00 at positions 0-63, and nothing past position 63 (it cannot run there)" in text
    assert "sinusoidal: 2.00 at positions 0-63, 3.00 at positions 64-255" in text
    assert "uniform 4.50" in text
    colours = {t.line.color for t in fig.data}
    assert all(c in OKABE_ITO or len(set(c[1:][i:i + 2] for i in (0, 2, 4))) == 1 for c in colours), colours


@pytest.mark.parametrize(
    ("losses", "match"),
    [
        ({}, "at least one"),
        ({"rope": np.ones((2, 3))}, r"losses\['rope'\] must be a non-empty 1-D array"),
        ({"rope": np.array([1.0, np.nan])}, r"losses\['rope'\] must be finite"),
    ],
)
def test_extrapolation_figure_rejects_bad_curves(losses, match):
    with pytest.raises(ValueError, match=match):
        vp.extrapolation_figure(losses)


def test_extrapolation_figure_rejects_a_bad_training_length_and_baseline():
    with pytest.raises(ValueError, match="train_length must be an int >= 1"):
        vp.extrapolation_figure({"rope": np.ones(4)}, train_length=0)
    with pytest.raises(ValueError, match=r"baselines\['uniform'\] must be a finite number"):
        vp.extrapolation_figure({"rope": np.ones(4)}, baselines={"uniform": float("inf")})


def test_extrapolation_bars_mark_what_cannot_run_as_n_a_not_zero():
    table = {
        "learned": {64: 2.0, 128: None, 256: None},
        "rope": {64: 2.0, 128: 2.5, 256: 3.0},
        "alibi": {64: 2.0, 128: 2.0},  # 256 missing: also n/a
    }
    fig = vp.extrapolation_bars_figure(table, baselines={"unigram": 3.5})
    assert [t.name for t in fig.data] == ["learned", "rope", "alibi"]
    assert list(fig.data[0].x) == ["64", "128", "256"]
    assert list(fig.data[0].y) == [2.0, None, None]  # no bar, not a bar of 0
    assert list(fig.data[2].y) == [2.0, 2.0, None]
    assert list(fig.data[1].text) == ["2.00", "2.50", "3.00"]
    na = [a for a in fig.layout.annotations if a.text == "n/a"]
    # Three schemes share a group 0.8 wide: slot k of category c is centred at c - 0.4 + (k + 0.5) * 0.8 / 3.
    assert sorted(round(a.x, 9) for a in na) == sorted(round(c - 0.4 + (k + 0.5) * 0.8 / 3, 9)
                                                       for c, k in ((1, 0), (2, 0), (2, 2)))
    assert fig.layout.bargap == 0.2 and fig.layout.barmode == "group"
    text = figure_description(fig)
    assert "learned: 64 tokens 2.00, 128 tokens n/a, 256 tokens n/a" in text
    assert "Cannot run (n/a): learned at 128, learned at 256, alibi at 256." in text
    assert "unigram 3.50" in text


def test_extrapolation_bars_reject_bad_tables():
    with pytest.raises(ValueError, match="at least one"):
        vp.extrapolation_bars_figure({})
    with pytest.raises(ValueError, match=r"mean_losses\['rope'\]\[64\] must be a finite number or None"):
        vp.extrapolation_bars_figure({"rope": {64: float("nan")}})
    with pytest.raises(ValueError, match=r"lengths of mean_losses\['rope'\] must be an int >= 1"):
        vp.extrapolation_bars_figure({"rope": {0: 1.0}})
    with pytest.raises(ValueError, match=r"mean_losses\['rope'\] must be a mapping"):
        vp.extrapolation_bars_figure({"rope": [1.0]})


# --------------------------------------------------------------------------------------------------
# Sinusoids (claim 22)
# --------------------------------------------------------------------------------------------------


def test_sinusoidal_figure_draws_the_encodings():
    fig = vp.sinusoidal_figure(10, 6)
    z = np.asarray(fig.data[0].z)
    p = np.arange(10)[:, None]
    w = 10000.0 ** (-np.arange(0, 6, 2) / 6)
    expected = np.empty((10, 6))
    expected[:, 0::2], expected[:, 1::2] = np.sin(p * w), np.cos(p * w)
    np.testing.assert_allclose(z, expected, rtol=0, atol=5e-5)  # rounded to 4 decimals for the page
    assert fig.data[0].zmid == 0 and fig.data[0].colorscale[0][1] == "rgb(103,0,31)"  # RdBu centred on 0
    assert "Heatmap of the sinusoidal encodings" in figure_description(fig)


def test_sinusoidal_shift_figure_shows_one_matrix_per_shift_with_rounding_level_error():
    fig = vp.sinusoidal_shift_figure(8, offsets=[0, 3, 5], n_positions=20)
    assert [f.name for f in fig.frames] == ["0", "3", "5"]
    for frame, k in zip(fig.frames, [0, 3, 5], strict=True):
        M = np.asarray(frame.data[0].z)
        for i in range(4):
            a = k * 10000.0 ** (-2 * i / 8)
            block = [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]
            np.testing.assert_allclose(M[2 * i:2 * i + 2, 2 * i:2 * i + 2], block, atol=5e-5)
        off = M.copy()
        for i in range(4):
            off[2 * i:2 * i + 2, 2 * i:2 * i + 2] = 0
        assert np.abs(off).max() == 0
        err = np.asarray(frame.data[1].y)
        assert err.shape == (20,) and np.isfinite(err).all() and err.max() < 1e-12
    with pytest.raises(ValueError, match="offsets must be >= 0"):
        vp.sinusoidal_shift_figure(8, offsets=[-1, 0])


def test_every_figure_is_described_and_fills_the_column():
    q, k = _qk()
    figures = [
        vp.rope_score_figure(q, k), vp.rope_score_view(q, k, 1, 0), vp.alibi_bias_figure(4), vp.alibi_distance_figure(4),
        vp.extrapolation_figure(_synthetic_losses()), vp.extrapolation_bars_figure({"rope": {64: 1.0}}),
        vp.sinusoidal_figure(), vp.sinusoidal_shift_figure(),
    ]
    for fig in figures:
        assert isinstance(fig, go.Figure) and len(figure_description(fig)) > 80
        assert fig.layout.width is None and fig.layout.xaxis.title.text


def test_rope_figure_uses_a_drop_down_for_many_offsets():
    q, k = _qk()
    fig = vp.rope_score_figure(q, k, shifts=range(4), offsets=range(-8, 9))
    menu = fig.layout.updatemenus[0]
    assert menu.type == "dropdown" and len(menu.buttons) == 17
    state = copy.deepcopy(fig.to_dict())
    _apply(state, state["layout"]["updatemenus"][0]["buttons"][0])  # offset -8
    _apply(state, state["layout"]["sliders"][0]["steps"][3])  # n = 3, m = -5
    assert abs(state["data"][-1]["y"][0] - _package_score(q, k, -5, 3, 10000.0, "interleaved")) <= 1e-12


def test_extrapolation_figure_moving_average_window():
    rising = [2.0] * 8 + [3.0] * 8
    raw = vp.extrapolation_figure({"rope": rising}, train_length=8)
    np.testing.assert_allclose(raw.data[0].y, rising, atol=0)
    # a trailing average over 4 positions: a step from 2 to 3 after position 7 reaches 3 at position 11
    smooth = vp.extrapolation_figure({"rope": rising}, train_length=8, window=4, title="t")
    np.testing.assert_allclose(np.asarray(smooth.data[0].y)[[7, 9, 11]], [2.0, 2.5, 3.0], atol=1e-4)
    assert smooth.layout.title.text == "t" and "4-position average" in smooth.layout.yaxis.title.text
    assert "3.00 at positions 8-15" in figure_description(smooth)  # the description uses raw means
    with pytest.raises(ValueError, match="window"):
        vp.extrapolation_figure({"rope": rising}, train_length=8, window=0)
