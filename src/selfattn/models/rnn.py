"""A recurrent network beside attention: the Elman RNN, one step at a time (chapter 09, claim 15).

``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)``: step t needs the state left by step
t - 1, so T positions take T dependent steps. The engine is ``torch.nn.RNNCell``; the loop over
time is written out so that the order of the steps can be changed and the dependence seen.
"""

from __future__ import annotations

import torch
from torch import nn

from .._validate import require_positive_int, require_rank, require_tensor, shape_of

__all__ = ["ElmanRNN"]


class ElmanRNN(nn.Module):
    """Elman's simple recurrent network (Elman 1990), the loop over time explicit.

    Args:
        d_in: width of each input vector (> 0).
        d_hidden: width of the state h (> 0).
        dtype: the parameters' dtype (float64 by default, for exact comparisons).

    Shapes:
        forward(x: (B, T, d_in)) -> (B, T, d_hidden), the state after every step.

    Source: Elman 1990, "Finding structure in time"; chapter 09.
    """

    def __init__(self, d_in: int, d_hidden: int, *, dtype: torch.dtype = torch.float64):
        super().__init__()
        self.cell = nn.RNNCell(require_positive_int("d_in", d_in), require_positive_int("d_hidden", d_hidden),
                               nonlinearity="tanh", dtype=dtype)

    def forward(self, x: torch.Tensor, order=None) -> torch.Tensor:
        """Run the steps one after another; ``order`` (a permutation of range(T)) changes which
        position each step reads.

        Step n reads ``x[:, order[n]]`` and the state left by step n - 1 (zeros for the first) and
        writes its new state to position ``order[n]``. With ``order=None`` (0, 1, ..., T - 1) this
        is the RNN. Any other order gives other numbers, because each step needs its predecessor's
        result: the contrast with attention, whose rows can be computed in any order.

        Raises:
            TypeError / ValueError: ``x`` not a (B, T, d_in) tensor of the parameters' dtype;
            ``order`` not a permutation of range(T).
        """
        require_tensor("x", x)
        require_rank("x", x, 3, "(B, T, d_in)")
        if x.shape[-1] != self.cell.input_size or x.dtype != self.cell.weight_ih.dtype:
            raise ValueError(f"x must be (B, T, {self.cell.input_size}) of dtype {self.cell.weight_ih.dtype}; "
                             f"got shape {shape_of(x)}, dtype {x.dtype}")
        T = x.shape[1]
        order = list(range(T)) if order is None else [int(t) for t in order]
        if sorted(order) != list(range(T)):
            raise ValueError(f"order must be a permutation of range({T}); got {order[:8]}...")
        state = x.new_zeros(x.shape[0], self.cell.hidden_size)  # (B, d_hidden): h_{-1} = 0
        states = [None] * T
        for t in order:
            state = self.cell(x[:, t], state)  # (B, d_in), (B, d_hidden) -> (B, d_hidden): needs the last state
            states[t] = state
        return torch.stack(states, dim=1)  # T x (B, d_hidden) -> (B, T, d_hidden)
