"""Chapter 11's next-token figure: the bars hold softmax(logits) sorted, each button keeps what the rule keeps."""

import numpy as np
import pytest
import torch

from selfattn.viz import figure_description
from selfattn.viz.sampling import kept_tokens, next_token_figure

LOGITS = torch.tensor([2.0, 0.5, 3.0, -1.0, 1.0, 0.0, 2.5, -2.0], dtype=torch.float64)
LABELS = ["a", "b", "c", "d", " ", "f", "g", "h"]


def test_bars_are_the_probabilities_most_probable_first():
    fig = next_token_figure(LOGITS, LABELS, top_k=3, top_p=0.8, n_shown=8)
    probs = np.exp(LOGITS.numpy()) / np.exp(LOGITS.numpy()).sum()
    order = np.argsort(-probs)
    np.testing.assert_allclose(np.asarray(fig.data[0].y), probs[order], atol=1e-15, rtol=0)
    assert list(fig.data[0].x) == [LABELS[i].replace(" ", "␣") for i in order]
    assert "most probable" in figure_description(fig)


def test_each_button_colours_the_kept_tokens_and_renormalises_them():
    fig = next_token_figure(LOGITS, LABELS, top_k=3, top_p=0.8, n_shown=8)
    probs = np.exp(LOGITS.numpy()) / np.exp(LOGITS.numpy()).sum()
    order = np.argsort(-probs)
    sorted_p = probs[order]
    # kept, computed here: greedy the argmax; top-3 the three largest; top-0.8 while the mass before < 0.8
    n_top_p = int((np.cumsum(sorted_p) - sorted_p < 0.8).sum())
    expected = {"greedy": 1, "top-k, k = 3": 3, "top-p, p = 0.8": n_top_p, "all tokens (temperature 1)": 8}
    buttons = {b.label: b for b in fig.layout.updatemenus[0].buttons}
    assert set(buttons) == set(expected)
    for label, n in expected.items():
        colours = buttons[label].args[0]["marker.color"][0]
        texts = buttons[label].args[0]["text"][0]
        assert colours[:n] == ["#0072B2"] * n and colours[n:] == ["#BBBBBB"] * (8 - n), label
        kept_mass = sorted_p[:n].sum()
        np.testing.assert_allclose([float(t) for t in texts[:n]], sorted_p[:n] / kept_mass, atol=5e-3)
        assert all(t == "" for t in texts[n:])
        assert f"{n} token(s) kept" in buttons[label].args[1]["title.text"]


def test_kept_tokens_follows_the_rules():
    assert kept_tokens(LOGITS, {"greedy": True}).tolist() == [False, False, True] + [False] * 5
    assert kept_tokens(LOGITS, {}).all()
    assert kept_tokens(LOGITS, {"top_k": 2}).nonzero()[0].tolist() == [2, 6]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"logits": torch.zeros(2, 8)}, TypeError, "1-D"),
    ({"labels": ["a"]}, ValueError, "8 strings"),
    ({"top_k": 0}, ValueError, "top_k"),
    ({"top_p": 1.5}, ValueError, "top_p"),
])
def test_bad_input_is_refused_naming_the_argument(kwargs, error, match):
    args = {"logits": LOGITS, "labels": LABELS} | kwargs
    with pytest.raises(error, match=match):
        next_token_figure(args.pop("logits"), args.pop("labels"), **args)


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="rule keys"):
        kept_tokens(LOGITS, {"top_q": 3})
