"""Exercise checks of chapter 10: the reference solutions pass, typical mistakes get the right words."""

import numpy as np

from selfattn.exercises import ch10


def solution_merge(out_a, lse_a, out_b, lse_b):
    lse = np.logaddexp(lse_a, lse_b)  # (T,)
    shift = np.where(np.isfinite(lse), lse, 0.0)  # a row that saw no key: no -inf - -inf
    return np.exp(lse_a - shift)[:, None] * out_a + np.exp(lse_b - shift)[:, None] * out_b, lse


def test_merge_solution_passes():
    feedback = ch10.check_merge_states(solution_merge)
    assert feedback, feedback.message


def test_merge_mistakes_are_named():
    def naive_exp(out_a, lse_a, out_b, lse_b):  # exp(lse) overflows at lse ~ 800
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            ea, eb = np.exp(lse_a), np.exp(lse_b)
            return (ea[:, None] * out_a + eb[:, None] * out_b) / (ea + eb)[:, None], np.log(ea + eb)

    def no_guard(out_a, lse_a, out_b, lse_b):
        lse = np.logaddexp(lse_a, lse_b)
        with np.errstate(invalid="ignore"):
            return np.exp(lse_a - lse)[:, None] * out_a + np.exp(lse_b - lse)[:, None] * out_b, lse

    def max_lse(out_a, lse_a, out_b, lse_b):
        return solution_merge(out_a, lse_a, out_b, lse_b)[0], np.maximum(lse_a, lse_b)

    def sum_lse(out_a, lse_a, out_b, lse_b):
        return solution_merge(out_a, lse_a, out_b, lse_b)[0], lse_a + lse_b

    def added(out_a, lse_a, out_b, lse_b):
        return out_a + out_b, np.logaddexp(lse_a, lse_b)

    def average(out_a, lse_a, out_b, lse_b):
        return (out_a + out_b) / 2, np.logaddexp(lse_a, lse_b)

    def unnormalised(out_a, lse_a, out_b, lse_b):
        m = np.maximum(lse_a, lse_b)
        m = np.where(np.isfinite(m), m, 0.0)
        return np.exp(lse_a - m)[:, None] * out_a + np.exp(lse_b - m)[:, None] * out_b, np.logaddexp(lse_a, lse_b)

    cases = ((naive_exp, "overflows"), (no_guard, "Row 5 sees no key"), (max_lse, "larger of the two"),
             (sum_lse, "added the two lse"), (added, "You added the two outputs, out_a + out_b"), (average, "averaged the two outputs"), (unnormalised, "do not sum to 1"),
             (lambda *a: solution_merge(*a)[0], "pair"), (lambda *a: (solution_merge(*a)[0].T, solution_merge(*a)[1]), "shape"),
             (lambda *a: (solution_merge(*a)[0] * 1.01, solution_merge(*a)[1]), "wrong values"))
    for fn, words in cases:
        feedback = ch10.check_merge_states(fn)
        assert not feedback and words in feedback.message, (fn, feedback.message)


def solution_forward(q, k, v, block_q, block_k):
    T, Dh = q.shape
    out, lse = np.zeros((T, v.shape[1])), np.zeros(T)
    for r in range(0, T, block_q):
        qi = q[r:r + block_q]
        m, l, acc = np.full(len(qi), -np.inf), np.zeros(len(qi)), np.zeros((len(qi), v.shape[1]))
        for s0 in range(0, k.shape[0], block_k):
            s = qi @ k[s0:s0 + block_k].T / np.sqrt(Dh)
            m_new = np.maximum(m, s.max(-1))
            p, corr = np.exp(s - m_new[:, None]), np.exp(m - m_new)
            l = l * corr + p.sum(-1)
            acc = acc * corr[:, None] + p @ v[s0:s0 + block_k]
            m = m_new
        out[r:r + block_q], lse[r:r + block_q] = acc / l[:, None], m + np.log(l)
    return out, lse


def forward_with(**mistake):
    def fn(q, k, v, block_q, block_k):
        T, Dh = q.shape
        c = 1.0 if mistake.get("noscale") else 1 / np.sqrt(Dh)
        out, lse = np.zeros((T, v.shape[1])), np.zeros(T)
        stop = (T // block_q) * block_q if mistake.get("drop_last_q") else T
        for r in range(0, stop, block_q):
            qi = q[r:r + block_q]
            m, l, acc = np.full(len(qi), -np.inf), np.zeros(len(qi)), np.zeros((len(qi), v.shape[1]))
            for s0 in range(0, k.shape[0], block_k):
                s = qi @ k[s0:s0 + block_k].T * c
                m_new = np.maximum(m, s.max(-1))
                p = np.exp(s - m_new[:, None])
                with np.errstate(over="ignore", invalid="ignore"):
                    corr = np.exp(m_new - m) if mistake.get("upside_down") else np.exp(m - m_new)
                    l = (l if mistake.get("no_l") or mistake.get("none") else l * corr) + p.sum(-1)
                    acc = (acc if mistake.get("no_acc") or mistake.get("none") else acc * corr[:, None]) + p @ v[s0:s0 + block_k]
                m = m_new
            out[r:r + block_q] = acc / l[:, None]
            lse[r:r + block_q] = {"nomax": np.log(l), "max": m, "nolog": m + l}.get(mistake.get("lse"), m + np.log(l))
        return out, lse

    return fn


def test_forward_solution_passes():
    feedback = ch10.check_flash_forward(solution_forward)
    assert feedback, feedback.message


def test_forward_mistakes_are_named():
    cases = (
        (dict(none=True), "did not rescale"),
        (dict(no_acc=True), "but not the accumulator"),
        (dict(no_l=True), "but not the running sum"),
        (dict(noscale=True), "1 / sqrt(Dh)"),
        (dict(drop_last_q=True), "last, partial query tile"),
        (dict(lse="nomax"), "without the maximum"),
        (dict(lse="max"), "running maximum alone"),
        (dict(lse="nolog"), "logarithm of the sum"),
        (dict(upside_down=True), "NaN or inf"),
    )
    for mistake, words in cases:
        feedback = ch10.check_flash_forward(forward_with(**mistake))
        assert not feedback and words in feedback.message, (mistake, feedback.message)


def test_forward_bad_returns_get_messages_not_tracebacks():
    def q_rows_short(q, k, v, bq, bk):
        out, lse = solution_forward(q, k, v, bq, bk)
        return out[:-1], lse

    cases = (
        (lambda q, k, v, bq, bk: solution_forward(q, k, v, bq, bk)[0], "2-tuple"),
        (lambda q, k, v, bq, bk: (solution_forward(q, k, v, bq, bk)[0], "x"), "lse should be an array"),
        (lambda q, k, v, bq, bk: (solution_forward(q, k, v, bq, bk)[0], np.zeros((7, 1))), "lse should have shape"),
        (q_rows_short, "has 6 rows"),
        (lambda q, k, v, bq, bk: (np.full((7, 3), np.nan), np.zeros(7)), "NaN or inf"),
    )
    for fn, words in cases:
        feedback = ch10.check_flash_forward(fn)
        assert not feedback and words in feedback.message, feedback.message


def test_forward_that_builds_all_the_scores_is_refused():
    def full(q, k, v, block_q, block_k):
        s = q @ k.T / np.sqrt(q.shape[1])
        m = s.max(1, keepdims=True)
        e = np.exp(s - m)
        return e / e.sum(1, keepdims=True) @ v, m[:, 0] + np.log(e.sum(1))

    feedback = ch10.check_flash_forward(full)
    assert not feedback and "not tiled" in feedback.message and "MiB" in feedback.message


def solution_backward(q, k, v, out, lse, d_out, block_q, block_k, *, mistake=None):
    c = 1 / np.sqrt(q.shape[1])
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    D = (d_out * out).sum(-1)  # (T,)
    for r in range(0, q.shape[0], block_q):
        for s0 in range(0, k.shape[0], block_k):
            qi, kj, vj, doi = q[r:r + block_q], k[s0:s0 + block_k], v[s0:s0 + block_k], d_out[r:r + block_q]
            s = qi @ kj.T * (1.0 if mistake in ("no_scale_anywhere", "no_scale_in_P") else c)
            if mistake == "tile_softmax":
                e = np.exp(s - s.max(-1, keepdims=True))
                p = e / e.sum(-1, keepdims=True)
            else:
                p = np.exp(s - lse[r:r + block_q, None])
            dv[s0:s0 + block_k] += p.T @ doi
            dp = doi @ vj.T
            d = {"no_D": 0.0, "D_tile": (p * dp).sum(-1, keepdims=True)}.get(mistake, D[r:r + block_q, None])
            ds = p * (dp - d)
            g = 1.0 if mistake in ("no_scale", "no_scale_anywhere") else c
            dq[r:r + block_q] += ds @ kj * g
            dk[s0:s0 + block_k] += ds.T @ qi * g
    return dq, dk, dv


def test_backward_solution_passes_against_autograd():
    feedback = ch10.check_flash_backward(solution_backward)
    assert feedback, feedback.message


def test_backward_mistakes_are_named():
    cases = (("no_D", "left out D"), ("D_tile", "over one tile"), ("no_scale", "miss the 1 / sqrt(Dh)"),
             ("tile_softmax", "each tile's own softmax"), ("no_scale_anywhere", "left out the 1 / sqrt(Dh) everywhere"),
             ("no_scale_in_P", "rebuilt P from unscaled scores"))
    for mistake, words in cases:
        def fn(*args, mistake=mistake):
            return solution_backward(*args, mistake=mistake)

        feedback = ch10.check_flash_backward(fn)
        assert not feedback and words in feedback.message, (mistake, feedback.message)


def test_backward_bad_returns_get_messages():
    cases = (
        (lambda *a: solution_backward(*a)[:2], "3-tuple"),
        (lambda *a: (solution_backward(*a)[0], solution_backward(*a)[1].T, solution_backward(*a)[2]), "dk should have shape"),
        (lambda *a: (solution_backward(*a)[0] * np.inf, *solution_backward(*a)[1:]), "NaN or inf"),
        (lambda *a: (solution_backward(*a)[0] * 2, *solution_backward(*a)[1:]), "dq differ"),
    )
    for fn, words in cases:
        feedback = ch10.check_flash_backward(fn)
        assert not feedback and words in feedback.message, feedback.message


def solution_tiles(T, block_q, block_k):
    a = np.arange(-(-T // block_q))[:, None]
    b = np.arange(-(-T // block_k))[None, :]
    return b * block_k <= np.minimum((a + 1) * block_q, T) - 1


def test_causal_tiles_solution_passes_and_mistakes_are_named():
    assert ch10.check_causal_tiles(solution_tiles)

    def by_index(T, bq, bk):
        return np.arange(-(-T // bq))[:, None] >= np.arange(-(-T // bk))[None, :]

    def full_only(T, bq, bk):
        a, b = np.arange(-(-T // bq))[:, None], np.arange(-(-T // bk))[None, :]
        return np.minimum((b + 1) * bk, T) - 1 <= a * bq

    def strict(T, bq, bk):
        a, b = np.arange(-(-T // bq))[:, None], np.arange(-(-T // bk))[None, :]
        return b * bk < np.minimum((a + 1) * bq, T) - 1

    def floor_tiles(T, bq, bk):
        return solution_tiles(T, bq, bk)[: T // bq, : T // bk]

    cases = (
        (lambda *a: ~solution_tiles(*a), "Reversed"),
        (by_index, "compared tile numbers"),
        (full_only, "only the tiles with no masked pair"),
        (strict, "Off by one"),
        (floor_tiles, "ceil(T / block)"),
        (lambda *a: solution_tiles(*a).astype(int), "True for a tile the pass computes"),
        (lambda *a: solution_tiles(*a).astype(int).tolist(), "convert with .astype(bool)"),  # a list of 0/1
        (lambda *a: 3, "2-D boolean array"),
    )
    for fn, words in cases:
        feedback = ch10.check_causal_tiles(fn)
        assert not feedback and words in feedback.message, feedback.message


def test_backward_that_builds_all_the_weights_is_refused():
    def full(q, k, v, out, lse, d_out, block_q, block_k):  # right gradients from the whole (T, S) matrix P
        return solution_backward(q, k, v, out, lse, d_out, q.shape[0], k.shape[0])

    feedback = ch10.check_flash_backward(full)
    assert not feedback and "not tiled" in feedback.message and "MiB" in feedback.message, feedback.message
