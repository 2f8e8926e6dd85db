"""The checks of chapter 11c's exercises: right answers pass, the usual mistakes are named."""

import numpy as np

from selfattn.exercises import ch11c


def _sink_softmax(scores, sink):
    m = np.maximum(scores.max(-1, keepdims=True), sink)
    e = np.exp(scores - m)
    return e / (e.sum(-1, keepdims=True) + np.exp(sink - m))


def _plain(scores, sink):
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_sink_softmax_check():
    assert ch11c.check_sink_softmax(_sink_softmax)
    wrong = ch11c.check_sink_softmax(_plain)
    assert not wrong and "denominator" in wrong.message
    with_column = ch11c.check_sink_softmax(lambda s, k: _plain(np.concatenate([s, np.full((s.shape[0], 1), k)], -1), k))
    assert not with_column and "column" in with_column.message

    def unstable(scores, sink):  # exp of scores near 800 overflows
        e = np.exp(scores)
        return e / (e.sum(-1, keepdims=True) + np.exp(sink))

    with np.errstate(over="ignore", invalid="ignore"):
        assert ch11c.check_sink_softmax(lambda s, k: _sink_softmax(s, k) if s.max() < 100 else unstable(s, k)).ok is False
        fb = ch11c.check_sink_softmax(unstable)
    assert not fb and "exp overflowed" in fb.message and "scores near 800" in fb.message, fb.message

    def sink_not_exponentiated(scores, sink):
        m = scores.max(-1, keepdims=True)
        e = np.exp(scores - m)
        return e / (e.sum(-1, keepdims=True) + sink * np.exp(-m))  # = exp(s) / (sum exp(s) + sink)

    fb = ch11c.check_sink_softmax(sink_not_exponentiated)
    assert not fb and "the sink itself" in fb.message, fb.message
    # the stable form that subtracts only the scores' maximum is right as well
    assert ch11c.check_sink_softmax(lambda s, k: (lambda m: np.exp(s - m) / (np.exp(s - m).sum(-1, keepdims=True)
                                                                         + np.exp(k - m)))(s.max(-1, keepdims=True)))


def test_kivi_bytes_check():
    assert ch11c.check_kivi_bytes(lambda Dh, b, G: 2 * Dh * b / 8 + Dh * 4 / G + Dh // G * 4)
    no_scales = ch11c.check_kivi_bytes(lambda Dh, b, G: 2 * Dh * b / 8)
    assert not no_scales and "scale" in no_scales.message
    bits = ch11c.check_kivi_bytes(lambda Dh, b, G: 2 * Dh * b + Dh * 4 / G + Dh // G * 4)
    assert not bits and "Bits" in bits.message
    keys_per_token = ch11c.check_kivi_bytes(lambda Dh, b, G: 2 * Dh * b / 8 + Dh * 4 + Dh // G * 4)
    assert not keys_per_token and "4 / G bytes per channel" in keys_per_token.message
