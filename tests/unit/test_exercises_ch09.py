"""Exercise checks of chapter 09: the reference solutions pass, typical mistakes get the right words."""

import numpy as np
import torch

from selfattn.efficient import linear_attention, sliding_window_mask
from selfattn.exercises import ch09


def solution_recurrent(q, k, v):
    phi_q, phi_k = ch09.elu_plus_one(q), ch09.elu_plus_one(k)
    state, z, out = np.zeros((q.shape[1], v.shape[1])), np.zeros(q.shape[1]), []
    for i in range(q.shape[0]):
        state = state + np.outer(phi_k[i], v[i])
        z = z + phi_k[i]
        out.append(phi_q[i] @ state / (phi_q[i] @ z + 1e-6))
    return np.array(out)


def test_reference_recurrent_solution_passes_and_matches_the_package():
    assert ch09.check_linear_recurrent(solution_recurrent)
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(6, 3)), rng.normal(size=(6, 3)), rng.normal(size=(6, 2))
    expected = linear_attention(*(torch.from_numpy(x) for x in (q, k, v)), causal=True).numpy()
    np.testing.assert_allclose(solution_recurrent(q, k, v), expected, rtol=1e-10)


def test_recurrent_non_causal_is_caught():
    def non_causal(q, k, v):
        phi_q, phi_k = ch09.elu_plus_one(q), ch09.elu_plus_one(k)
        state, z = phi_k.T @ v, phi_k.sum(0)
        return np.array([phi_q[i] @ state / (phi_q[i] @ z + 1e-6) for i in range(q.shape[0])])

    feedback = ch09.check_linear_recurrent(non_causal)
    assert not feedback and "after i" in feedback.message


def test_recurrent_missing_normalizer_is_caught():
    def no_norm(q, k, v):
        phi_q, phi_k = ch09.elu_plus_one(q), ch09.elu_plus_one(k)
        state, out = np.zeros((q.shape[1], v.shape[1])), []
        for i in range(q.shape[0]):
            state = state + np.outer(phi_k[i], v[i])
            out.append(phi_q[i] @ state)
        return np.array(out)

    feedback = ch09.check_linear_recurrent(no_norm)
    assert not feedback and "normalizer" in feedback.message


def test_recurrent_without_feature_map_is_caught():
    def raw(q, k, v):
        state, z, out = np.zeros((q.shape[1], v.shape[1])), np.zeros(q.shape[1]), []
        for i in range(q.shape[0]):
            state, z = state + np.outer(k[i], v[i]), z + k[i]
            out.append(q[i] @ state / (q[i] @ z + 1e-6))
        return np.array(out)

    feedback = ch09.check_linear_recurrent(raw)
    assert not feedback and "feature map" in feedback.message


def test_recurrent_not_attempted_and_crash():
    def stub(q, k, v):
        raise NotImplementedError

    assert not ch09.check_linear_recurrent(stub).attempted
    feedback = ch09.check_linear_recurrent(lambda q, k, v: q @ v)
    assert not feedback and "raised" in feedback.message


def test_window_solution_passes_and_equals_the_package():
    def solution(T, window):
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        return (j <= i) & (j > i - window)

    assert ch09.check_sliding_window_mask(solution)
    assert torch.equal(solution(9, 3), sliding_window_mask(9, 3))


def test_window_off_by_one_two_sided_polarity_and_dtype_are_caught():
    def off_by_one(T, w):
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        return (j <= i) & (j >= i - w)

    def two_sided(T, w):
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        return (i - j).abs() < w

    def reversed_polarity(T, w):
        return ~sliding_window_mask(T, w)

    def as_float(T, w):
        return sliding_window_mask(T, w).float()

    for fn, words in ((off_by_one, "Off by one"), (two_sided, "two-sided"), (reversed_polarity, "polarity"),
                      (as_float, "boolean")):
        feedback = ch09.check_sliding_window_mask(fn)
        assert not feedback and words in feedback.message, (fn.__name__, feedback.message)


def test_sliding_window_mask_follows_the_one_mask_dtype_rule():
    # Regression: 8.2 had its own dtype rule and accepted a list of 0/1 ints that 4.1 and 5.1 refuse.
    def as_int_list(T, window):
        return [[int(i - window < j <= i) for j in range(T)] for i in range(T)]

    fb = ch09.check_sliding_window_mask(as_int_list)
    assert not fb.ok and "Return a boolean tensor" in fb.message
    assert ch09.check_sliding_window_mask(
        lambda T, w: [[i - w < j <= i for j in range(T)] for i in range(T)]
    ).ok


def flops_solution(B, T, D, H):
    return 4 * 2 * B * T * D * D + 2 * 2 * B * T * T * D  # Q, K, V, W_O; scores and weights @ V


def test_flops_solution_passes_and_equals_flop_counter_mode():
    assert ch09.check_attention_flops(flops_solution)
    assert ch09._counted_flops(2, 24, 16, 4) == 8 * 2 * 24 * 16**2 + 4 * 2 * 24**2 * 16  # 106496


def test_flops_mistakes_are_named():
    cases = (
        (lambda B, T, D, H: flops_solution(B, T, D, H) // 2, "multiply-add is 2"),
        (lambda B, T, D, H: 6 * B * T * D * D + 4 * B * T * T * D, "output projection W_O"),
        (lambda B, T, D, H: 8 * B * T * D * D + 2 * B * T * T * D, "Only one of the two"),
        (lambda B, T, D, H: 8 * B * T * D * D + 4 * H * B * T * T * D, "instead of d_head"),
        (lambda B, T, D, H: 4 * B * T * T * D, "only the attention products"),
    )
    for fn, words in cases:
        feedback = ch09.check_attention_flops(fn)
        assert not feedback and words in feedback.message, feedback.message
    for bad, words in ((lambda *a: "many", "one number"), (lambda *a: float("nan"), "finite"), (lambda *a: 7, "FlopCounterMode counts")):
        feedback = ch09.check_attention_flops(bad)
        assert not feedback and words in feedback.message, feedback.message


def bytes_solution(B, T, D, H, element_size):
    return (4 * B * T * D + 4 * B * H * T * T) * element_size


def test_bytes_solution_passes_and_mistakes_are_named():
    assert ch09.check_attention_bytes(bytes_solution)
    cases = (
        (lambda B, T, D, H, e: (4 * B * T * D + 2 * B * H * T * T) * e, "softmax's own traffic"),
        (lambda B, T, D, H, e: (4 * B * T * D + 4 * B * T * T) * e, "every head has its own"),
        (lambda B, T, D, H, e: 4 * B * T * D + 4 * B * H * T * T, "numbers, not bytes"),
        (lambda B, T, D, H, e: bytes_solution(B, T, D, H, e) * 8, "bits"),
        (lambda B, T, D, H, e: 4 * B * H * T * T * e, "left out Q, K, V"),
    )
    for fn, words in cases:
        feedback = ch09.check_attention_bytes(fn)
        assert not feedback and words in feedback.message, feedback.message
    feedback = ch09.check_attention_bytes(lambda *a: float("inf"))
    assert not feedback and "finite" in feedback.message


def test_window_that_reads_one_future_key_is_caught():
    def one_future_key(T, w):
        mask = sliding_window_mask(T, w).clone()
        mask[0, 1] = True
        return mask

    feedback = ch09.check_sliding_window_mask(one_future_key)
    assert not feedback and "keys after it" in feedback.message, feedback.message
