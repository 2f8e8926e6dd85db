"""Chapter 11's exercise checks: the reference solutions pass, typical mistakes get the right words."""

import torch

from selfattn.exercises import ch11


def kv_cache_bytes(n_layers, n_heads, n_kv_heads, d_head, bytes_per_number, n_tokens):
    return 2 * n_layers * n_kv_heads * d_head * bytes_per_number * n_tokens


def merge(m_a, l_a, acc_a, m_b, l_b, acc_b, *, guard=True, direction=1):
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m)) if guard else m
    s_a, s_b = torch.exp(direction * (m_a - safe)), torch.exp(direction * (m_b - safe))
    return m, s_a * l_a + s_b * l_b, s_a[:, None] * acc_a + s_b[:, None] * acc_b


def top_p_keep(probs, p, *, include_crossing=True, all_at_one=True):
    if all_at_one and p >= 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, order = torch.sort(probs, descending=True)
    mass = torch.cumsum(sorted_probs, 0) - (sorted_probs if include_crossing else 0)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    keep[order[mass < p]] = True
    return keep


def test_solutions_pass():
    assert ch11.check_kv_cache_bytes(kv_cache_bytes)
    assert ch11.check_merge_partials(merge)
    assert ch11.check_top_p_keep(top_p_keep)
    assert ch11.check_merge_partials(lambda *a: list(merge(*a)))  # a list is a pair too


def test_stubs_are_not_attempted():
    def stub(*args):
        pass

    def raises(*args):
        raise NotImplementedError

    for check in (ch11.check_kv_cache_bytes, ch11.check_merge_partials, ch11.check_top_p_keep):
        for fn in (stub, raises):
            fb = check(fn)
            assert not fb.ok and not fb.attempted, fb.message


def test_cache_size_mistakes_are_named():
    cases = {
        "keys *and* values": lambda L, H, Hkv, Dh, b, n: L * Hkv * Dh * b * n,
        "counted every query head": lambda L, H, Hkv, Dh, b, n: 2 * L * H * Dh * b * n,
        "That is bits": lambda L, H, Hkv, Dh, b, n: 16 * L * Hkv * Dh * b * n,
        "size per token": lambda L, H, Hkv, Dh, b, n: 2 * L * Hkv * Dh * b,
        "you returned 7": lambda *a: 7,
        "one number of bytes": lambda *a: "1 GiB",
    }
    for words, fn in cases.items():
        fb = ch11.check_kv_cache_bytes(fn)
        assert not fb.ok and words in fb.message, (words, fb.message)


def test_merge_mistakes_are_named():
    cases = {
        "exp(-inf - (-inf)) is NaN": lambda *a: merge(*a, guard=False),
        "rescale each by exp(m_chunk - m_new)":
            lambda m_a, l_a, acc_a, m_b, l_b, acc_b: (torch.maximum(m_a, m_b), l_a + l_b, acc_a + acc_b),
        "goes the other way": lambda *a: merge(*a, direction=-1),
        "normalised context": lambda *a: (lambda m, l, acc: (m, l, acc / l[:, None]))(*merge(*a)),
        "Return the triple": lambda *a: merge(*a)[:2],
        "merged max": lambda m_a, l_a, acc_a, m_b, l_b, acc_b: (torch.minimum(m_a, m_b),) + merge(
            m_a, l_a, acc_a, m_b, l_b, acc_b)[1:],
    }
    for words, fn in cases.items():
        fb = ch11.check_merge_partials(fn)
        assert not fb.ok and words in fb.message, (words, fb.message)


def test_top_p_mistakes_are_named():
    cases = {
        "carries the sum past p": lambda probs, p: top_p_keep(probs, p, include_crossing=False),
        "vocabulary order": lambda probs, p: (torch.cumsum(probs, 0) - probs) < p,
        "Treat p >= 1 as keeping every token": lambda probs, p: top_p_keep(probs, p, all_at_one=False),
        "one boolean per token": lambda probs, p: torch.ones(3, dtype=torch.bool),
        "Return a boolean tensor": lambda probs, p: top_p_keep(probs, p).float(),
        "in sorted order": lambda probs, p: torch.arange(len(probs)) < int(top_p_keep(probs, p).sum()),
        "the top-p set is the tokens": lambda probs, p: probs > 0.2,
    }
    for words, fn in cases.items():
        fb = ch11.check_top_p_keep(fn)
        assert not fb.ok and words in fb.message, (words, fb.message)
