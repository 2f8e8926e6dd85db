"""Regression: a check must reject an answer with the right shape and wrong values.

``compare_arrays`` returns a failure ``Feedback``, which is falsy, so ``if bad: return bad`` never
returned it and a wrong answer was reported as correct (found in chapters 02, 06 and 07).
"""

from __future__ import annotations

import numpy as np
import torch

from selfattn import ref
from selfattn.exercises import ch06, ch07


def test_layer_norm_check_rejects_shifted_values():
    def off_by_half(x, gamma, beta, eps):
        out = ref.layer_norm(x.numpy(), gamma.numpy(), beta.numpy(), eps=eps) + 0.5
        return torch.from_numpy(out)

    fb = ch07.check_layer_norm(off_by_half)
    assert not fb.ok and "wrong values" in fb.message


def test_multi_head_check_rejects_shifted_output():
    def off_by_half(X, W_Q, W_K, W_V, W_O, n_heads):
        Xn = X.numpy()
        out, weights = ref.multi_head_attention(Xn, Xn, W_Q.numpy(), W_K.numpy(), W_V.numpy(), W_O.numpy(),
                                                n_heads, return_weights=True)
        return torch.from_numpy(out + 0.5), torch.from_numpy(np.asarray(weights))

    fb = ch06.check_multi_head_attention(off_by_half)
    assert not fb.ok and "wrong values" in fb.message
