"""Chapter 07's stream measures against values known from the maths, and its figures' controls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from selfattn import BlockConfig, PostNormTransformerBlock
from selfattn.viz import figure_description
from selfattn.viz.block import (
    BRANCH_MEASURES,
    branch_explorer_widget,
    branch_figure,
    branch_heatmap_figure,
    branch_measures,
    depth_statistics_figure,
    stream_through,
)


class _Scale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


def test_stream_through_records_every_depth(gen):
    x = torch.randn(2, 3, 4, generator=gen)
    streams = stream_through([_Scale(2.0), _Scale(3.0)], x)
    assert len(streams) == 3
    np.testing.assert_allclose(streams[2], x.double().numpy() * 6.0, atol=1e-6)


def test_depth_figure_rms_and_histograms(gen):
    x = torch.randn(4, 8, 16, generator=gen)
    streams = {
        "pre-norm": stream_through([_Scale(2.0)] * 3, x),
        "post-norm": stream_through([_Scale(1.0)] * 3, x),
    }
    fig = depth_statistics_figure(streams, bins=11, limit=3.0)
    rms0 = float(np.sqrt(np.mean(np.square(x.double().numpy()))))
    np.testing.assert_allclose(fig.data[0].y, [rms0 * 2**d for d in range(4)], rtol=1e-3)
    np.testing.assert_allclose(fig.data[1].y, [rms0] * 4, rtol=1e-3)
    assert [f.name for f in fig.frames] == ["0", "1", "2", "3"]
    assert [s.args[0][0] for s in fig.layout.sliders[0].steps] == ["0", "1", "2", "3"]
    for frame in fig.frames:  # every histogram counts all values (clipped into the outer bins)
        np.testing.assert_allclose([sum(frame.data[i].y) for i in (3, 4)], 1.0, atol=1e-4)
    assert "pre-norm" in figure_description(fig)
    with pytest.raises(ValueError, match="same number of depths"):
        depth_statistics_figure({"a": streams["pre-norm"], "b": streams["post-norm"][:2]})


def test_branch_measures_match_a_direct_computation(gen):
    torch.manual_seed(0)
    blocks = [PostNormTransformerBlock(BlockConfig(8, 2, 16)).eval() for _ in range(2)]
    x = torch.randn(1, 5, 8, generator=gen)
    hidden = [x]
    with torch.no_grad():
        for b in blocks:
            hidden.append(b(hidden[-1]))
    m = branch_measures(blocks, hidden)
    assert list(m) == list(BRANCH_MEASURES) and all(v.shape == (2, 5) for v in m.values())
    with torch.no_grad():
        a = blocks[1].attn(hidden[1])[0]
        expected = (a.norm(dim=-1) / hidden[1][0].norm(dim=-1)).numpy()
        cos = (hidden[1][0] * hidden[2][0]).sum(-1) / (
            hidden[1][0].norm(dim=-1) * hidden[2][0].norm(dim=-1)
        )
    np.testing.assert_allclose(m["attention / stream"][1], expected, rtol=1e-5)
    np.testing.assert_allclose(m["cos(input, output)"][1], cos.numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="len\\(blocks\\) \\+ 1"):
        branch_measures(blocks, hidden[:2])


def test_branch_figures_and_dropdown():
    tokens = ["[CLS]", "a", "[SEP]"]
    v1, v2 = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
    fig = branch_heatmap_figure(tokens, v1, "m1")
    np.testing.assert_allclose(np.array(fig.data[0].z), v1)
    with pytest.raises(ValueError, match="len\\(tokens\\)"):
        branch_heatmap_figure(tokens, v1[:, :2], "m1")
    fig = branch_figure(
        {
            "s1": (tokens, {"m1": v1, "m2": v2}),
            "s2": (tokens[:2], {"m1": v1[:, :2], "m2": v2[:, :2]}),
        }
    )
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["m1 — s1", "m2 — s1", "m1 — s2", "m2 — s2"]
    np.testing.assert_allclose(np.array(buttons[3].args[0]["z"][0]), v2[:, :2])
    assert list(buttons[3].args[0]["x"][0]) == ["0:[CLS]", "1:a"]


def test_branch_explorer_builds():
    calls = []

    def fn(sentence):
        calls.append(sentence)
        return ["[CLS]", "[SEP]"], {"m1": np.zeros((2, 2)), "m2": np.ones((2, 2))}

    box = branch_explorer_widget(fn, "hi")
    assert box.children[0].value == "hi" and list(box.children[1].options) == ["m1", "m2"]
    assert calls[0] == "hi"
