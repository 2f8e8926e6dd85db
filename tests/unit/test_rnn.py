"""The explicit-loop Elman RNN equals PyTorch's nn.RNN, and its steps depend on their order."""

import pytest
import torch

from selfattn.models.rnn import ElmanRNN


def test_elman_rnn_equals_torch_rnn_with_the_same_weights():
    torch.manual_seed(0)
    rnn = ElmanRNN(5, 7)
    oracle = torch.nn.RNN(5, 7, nonlinearity="tanh", batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(oracle, f"{name}_l0").copy_(getattr(rnn.cell, name))
        x = torch.randn(3, 11, 5, dtype=torch.float64)
        got, (want, _) = rnn(x), oracle(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_elman_rnn_by_hand_for_two_steps():
    rnn = ElmanRNN(1, 1)
    with torch.no_grad():
        rnn.cell.weight_ih.fill_(1.0)
        rnn.cell.weight_hh.fill_(2.0)
        rnn.cell.bias_ih.zero_()
        rnn.cell.bias_hh.zero_()
        out = rnn(torch.tensor([[[0.5], [0.25]]], dtype=torch.float64))
    h0 = torch.tanh(torch.tensor(0.5, dtype=torch.float64))
    h1 = torch.tanh(0.25 + 2 * h0)  # h_1 = tanh(x_1 + 2 h_0)
    torch.testing.assert_close(out[0, :, 0], torch.stack([h0, h1]), atol=1e-15, rtol=0)
    with torch.no_grad():  # the reversed order: position 1 first (from h = 0), then position 0 from it
        reversed_out = rnn(torch.tensor([[[0.5], [0.25]]], dtype=torch.float64), order=[1, 0])
    r1 = torch.tanh(torch.tensor(0.25, dtype=torch.float64))
    torch.testing.assert_close(reversed_out[0, :, 0], torch.stack([torch.tanh(0.5 + 2 * r1), r1]), atol=1e-15, rtol=0)


def test_elman_rnn_errors():
    rnn = ElmanRNN(4, 3)
    with pytest.raises(ValueError, match="x must be"):
        rnn(torch.randn(1, 5, 4))  # float32 against float64 parameters
    with pytest.raises(ValueError, match="x must be"):
        rnn(torch.randn(1, 5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="order must be a permutation of range"):
        rnn(torch.randn(1, 3, 4, dtype=torch.float64), order=[0, 0, 1])
    with pytest.raises(ValueError, match="d_hidden"):
        ElmanRNN(4, 0)
