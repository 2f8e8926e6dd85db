"""Chapter 01's figure helpers and builders: the numbers they show, their controls and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from selfattn.viz import figure_description
from selfattn.viz.embeddings import (
    cosine_by_layer_figure,
    cosine_matrix,
    layer_cosine_matrix_figure,
    nearest_tokens,
    nearest_tokens_figure,
    word_positions,
    word_vectors_by_layer,
)


def test_word_positions_finds_the_first_occurrence():
    ids = torch.tensor([[101, 7, 9, 7, 102], [101, 5, 5, 7, 102]])
    assert word_positions(ids, 7) == [1, 3]


def test_word_positions_names_the_row_without_the_word():
    ids = torch.tensor([[101, 7, 102], [101, 8, 102]])
    with pytest.raises(ValueError, match="row 1 does not contain token_id 7"):
        word_positions(ids, 7)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        word_positions(ids[0], 7)


def test_word_vectors_by_layer_picks_one_row_per_sentence(gen):
    hidden = [torch.randn(3, 5, 4, generator=gen) for _ in range(3)]
    picked = word_vectors_by_layer(hidden, [0, 4, 2])
    assert picked.shape == (3, 3, 4)
    for layer in range(3):
        for b, t in enumerate([0, 4, 2]):
            torch.testing.assert_close(picked[layer, b], hidden[layer][b, t], rtol=0, atol=0)
    with pytest.raises(ValueError, match="B = 3 sentences; positions has 2"):
        word_vectors_by_layer(hidden, [0, 1])


def test_cosine_matrix_matches_torch(gen):
    x = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    expected = F.cosine_similarity(x[:, :, None, :], x[:, None, :, :], dim=-1)  # (2, 5, 5)
    np.testing.assert_allclose(cosine_matrix(x), expected.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.diagonal(cosine_matrix(x), axis1=-2, axis2=-1), 1.0, atol=1e-12)


def test_cosine_matrix_ignores_length():
    x = np.array([[1.0, 0.0], [5.0, 0.0], [0.0, 2.0]])
    np.testing.assert_allclose(cosine_matrix(x), [[1, 1, 0], [1, 1, 0], [0, 0, 1]], atol=1e-12)


def test_cosine_matrix_refuses_zero_rows_and_vectors():
    with pytest.raises(ValueError, match="length 0"):
        cosine_matrix(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"\(\.\.\., N, D\)"):
        cosine_matrix(np.ones(3))


def test_nearest_tokens_matches_brute_force(rng):
    table = rng.normal(size=(50, 6)) * rng.uniform(0.1, 3.0, size=(50, 1))
    query = 7
    ids, cosines = nearest_tokens(
        torch.from_numpy(table), torch.from_numpy(table[query]), k=5, exclude=[query]
    )
    cos = table @ table[query] / (np.linalg.norm(table, axis=1) * np.linalg.norm(table[query]))
    cos[query] = -np.inf
    expected = np.argsort(-cos)[:5]
    assert ids == expected.tolist()
    np.testing.assert_allclose(cosines, cos[expected], rtol=0, atol=1e-12)


def test_nearest_tokens_bad_inputs():
    table = torch.ones(4, 3)
    with pytest.raises(ValueError, match=r"vector must have shape \(3,\)"):
        nearest_tokens(table, torch.ones(4))
    with pytest.raises(ValueError, match=r"k must be in \[1, 4\]"):
        nearest_tokens(table, torch.ones(3), k=5)


def test_layer_cosine_matrix_figure_has_a_slider_step_per_layer(rng):
    cos = rng.uniform(0.5, 1.0, size=(7, 3, 3))
    fig = layer_cosine_matrix_figure(cos, ["a", "b", "c"])
    assert len(fig.frames) == 7
    steps = fig.layout.sliders[0].steps
    assert [s.args[0][0] for s in steps] == [f.name for f in fig.frames]
    np.testing.assert_allclose(np.asarray(fig.frames[4].data[0].z), cos[4], rtol=0, atol=0)
    np.testing.assert_allclose(np.asarray(fig.data[0].z), cos[0], rtol=0, atol=0)
    assert fig.data[0].zmax == 1.0 and fig.data[0].zmin <= cos.min()
    assert "slider over layers 0 to 6" in figure_description(fig)
    with pytest.raises(ValueError, match="N = len\\(labels\\) = 2"):
        layer_cosine_matrix_figure(cos, ["a", "b"])


def test_cosine_by_layer_figure_plots_the_values():
    curves = {"river vs money": [1.0, 0.9, 0.7], "money vs money": [1.0, 0.95, 0.85]}
    fig = cosine_by_layer_figure(curves)
    assert [t.name for t in fig.data] == list(curves)
    np.testing.assert_allclose(fig.data[0].y, curves["river vs money"], rtol=0, atol=0)
    assert list(fig.data[1].x) == [0, 1, 2]
    assert "0.70 at the last layer" in figure_description(fig)
    with pytest.raises(ValueError, match="one value per layer"):
        cosine_by_layer_figure({"a": [1.0], "b": [1.0, 0.5]})
    with pytest.raises(ValueError, match="at least one"):
        cosine_by_layer_figure({})


def test_nearest_tokens_figure_buttons_switch_words():
    neighbours = {
        "bank": (["banks", "banking"], [0.78, 0.66]),
        "river": (["rivers", "creek"], [0.74, 0.49]),
    }
    fig = nearest_tokens_figure(neighbours)
    assert len(fig.data) == 2 and fig.data[0].visible and not fig.data[1].visible
    assert list(fig.data[1].y) == ["creek", "rivers"]  # best at the top of a horizontal bar chart
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["bank", "river"]
    assert buttons[1].args[0]["visible"] == [False, True]
    single = nearest_tokens_figure({"bank": neighbours["bank"]})
    assert not single.layout.updatemenus and figure_description(single)
    with pytest.raises(ValueError, match="as many tokens as cosines"):
        nearest_tokens_figure({"bank": (["a"], [0.1, 0.2])})


def test_nearest_tokens_bars_are_coloured_by_colour_strings_not_numbers():
    """plotly.js picks the contrast of a bar's inside text from the bar's colour and logs
    "WARN: Invalid color specifier" for every bar coloured by a number (chapter 01's console)."""
    fig = nearest_tokens_figure({"bank": (["banks", "banking", "river"], [0.78, 0.66, 0.2])})
    colours = fig.data[0].marker.color
    assert len(colours) == 3 and all(isinstance(c, str) and c.startswith("rgb") for c in colours)
    assert colours[0] != colours[-1]  # still coloured by the cosine
