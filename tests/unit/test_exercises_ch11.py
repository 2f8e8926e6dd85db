"""Chapter 11's exercise checks: the reference solutions pass, typical mistakes get the right words."""

import io

import numpy as np
import torch

import selfattn.exercises as ex
from selfattn.exercises import ch11


def kv_cache_bytes(n_layers, n_heads, n_kv_heads, d_head, bytes_per_number, n_tokens):
    return 2 * n_layers * n_kv_heads * d_head * bytes_per_number * n_tokens


def sequences_that_fit(memory_bytes, n_weights, bytes_per_weight, cache_bytes_per_sequence):
    return max(0, int((memory_bytes - n_weights * bytes_per_weight) // cache_bytes_per_sequence))


def gqa(Q, K, V, *, tiled=False):
    n_rep = Q.shape[1] // K.shape[1]
    if tiled:
        K, V = K.repeat(1, n_rep, 1, 1), V.repeat(1, n_rep, 1, 1)
    else:
        K, V = K.repeat_interleave(n_rep, dim=1), V.repeat_interleave(n_rep, dim=1)  # repeat_kv
    return torch.softmax(Q @ K.transpose(-2, -1) / Q.shape[-1] ** 0.5, dim=-1) @ V


def gather(pool, block_table, n_tokens):
    bs = pool.shape[1]
    t = torch.arange(n_tokens)
    return pool[block_table[t // bs], t % bs]


def sample(probs, p, u, *, renormalise=True, crossing=True, vocab_order=False):
    keep = top_p_keep(probs, p, include_crossing=crossing)
    if vocab_order:
        kept = torch.where(keep, probs, torch.zeros_like(probs))
        order = torch.arange(len(probs))
    else:
        order = torch.sort(probs, descending=True).indices
        kept = torch.where(keep, probs, torch.zeros_like(probs))[order]
    cum = torch.cumsum(kept, 0) / (kept.sum() if renormalise else 1.0)
    index = min(int(torch.searchsorted(cum, torch.tensor(u, dtype=cum.dtype), right=True)), len(probs) - 1)
    return int(order[index])


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
    assert ch11.check_sequences_that_fit(sequences_that_fit)
    assert ch11.check_sequences_that_fit(lambda *a: float(sequences_that_fit(*a)))  # 64.0 is a whole number too
    assert ch11.check_gqa(gqa)
    assert ch11.check_top_p_keep(top_p_keep)
    assert ch11.check_block_table_gather(gather)
    assert ch11.check_top_p_sample(sample)


def test_stubs_are_not_attempted():
    def stub(*args):
        pass

    def raises(*args):
        raise NotImplementedError

    for check in (ch11.check_kv_cache_bytes, ch11.check_sequences_that_fit, ch11.check_gqa, ch11.check_top_p_keep, ch11.check_block_table_gather,
                  ch11.check_top_p_sample):
        for fn in (stub, raises):
            fb = check(fn)
            assert not fb.ok and not fb.attempted, fb.message


def test_cache_size_mistakes_are_named():
    cases = {
        "keys and values": lambda L, H, Hkv, Dh, b, n: L * Hkv * Dh * b * n,
        "counted every query head": lambda L, H, Hkv, Dh, b, n: 2 * L * H * Dh * b * n,
        "That is bits": lambda L, H, Hkv, Dh, b, n: 16 * L * Hkv * Dh * b * n,
        "size per token": lambda L, H, Hkv, Dh, b, n: 2 * L * Hkv * Dh * b,
        "you returned 7": lambda *a: 7,
        "one number of bytes": lambda *a: "1 GiB",
    }
    for words, fn in cases.items():
        fb = ch11.check_kv_cache_bytes(fn)
        assert not fb.ok and words in fb.message, (words, fb.message)


def test_sequences_that_fit_mistakes_are_named():
    """The follow-up of 11.1; expected: Llama 3.1 8B on an H100 80GB (81,559 MiB, nvidia-smi's total for the
    HBM3 card), (81,559 x 2**20 - 2 x 8.03e9) / 2**30 = 64.69 -> 64 sequences."""
    assert ch11.H100_MEMORY_BYTES == 85_520_809_984
    assert sequences_that_fit(85_520_809_984, 8.03e9, 2, kv_cache_bytes(32, 32, 8, 128, 2, 8192)) == 64
    import math

    cases = {
        "divided all the memory": lambda m, n, b, c: int(m // c),
        "one byte per weight": lambda m, n, b, c: int((m - n) // c),
        "rounded up": lambda m, n, b, c: max(0, math.ceil((m - n * b) / c)),
        "not a whole number": lambda m, n, b, c: (m - n * b) / c,
        "no sequence fits": lambda m, n, b, c: int((m - n * b) // c),
        "64 sequences fit; you returned 63": lambda m, n, b, c: max(0, int((m - n * b) // c) - 1),
        "return one number of sequences": lambda *a: [64],
        "finite whole number": lambda *a: float("nan"),
    }
    for words, fn in cases.items():
        fb = ch11.check_sequences_that_fit(fn)
        assert not fb.ok and fb.attempted and words in fb.message, (words, fb.message)


def test_gqa_mistakes_are_named():
    def softmax_over_queries(Q, K, V):
        K, V = (x.repeat_interleave(Q.shape[1] // K.shape[1], dim=1) for x in (K, V))
        return torch.softmax(Q @ K.transpose(-2, -1) / Q.shape[-1] ** 0.5, dim=-2) @ V

    def head_zero(Q, K, V):
        return gqa(Q, K[:, :1], V[:, :1])

    def unscaled(Q, K, V):
        return gqa(Q * Q.shape[-1] ** 0.5, K, V)

    cases = (
        (lambda *a: gqa(*a, tiled=True), "repeat_interleave"),
        (head_zero, "key/value head 0"),
        (unscaled, "sqrt(Dh)"),
        (softmax_over_queries, "over the queries"),
        (lambda Q, K, V: gqa(Q, K, V)[:, :, :1], "should have shape"),
        (lambda Q, K, V: gqa(Q, K, V) * torch.nan, "NaN"),
    )
    for fn, words in cases:
        fb = ch11.check_gqa(fn)
        assert not fb.ok and words in fb.message, (words, fb.message)


def test_block_table_mistakes_are_named():
    def pool_order(pool, table, n):
        return pool.reshape(-1, pool.shape[-1])[:n]

    def swapped(pool, table, n):
        t = torch.arange(n)
        return pool[table[t % pool.shape[1]], t // pool.shape[1]]

    def shifted(pool, table, n):
        t = torch.arange(1, n + 1)
        return pool[table[t // pool.shape[1]], t % pool.shape[1]]

    def backwards(pool, table, n):
        t = torch.arange(n)
        return pool[table[t // pool.shape[1]], pool.shape[1] - 1 - t % pool.shape[1]]

    def whole_blocks(pool, table, n):
        return pool[table].reshape(-1, pool.shape[-1])

    cases = ((pool_order, "in its own order"), (swapped, "swapped the division"), (shifted, "Off by one"),
             (backwards, "run backwards"), (whole_blocks, "every slot"), (lambda *a: gather(*a).T, "should have shape"))
    for fn, words in cases:
        fb = ch11.check_block_table_gather(fn)
        assert not fb.ok and words in fb.message, (words, fb.message)


def sorted_position(probs, p, u):  # the index into the sorted order, not mapped back to the token id
    token = sample(probs, p, u)
    return int((torch.sort(probs, descending=True).indices == token).nonzero()[0, 0])


def test_top_p_sampler_mistakes_are_named():
    cases = (
        (lambda *a: sample(*a, renormalise=False), "did not renormalise"),
        (lambda *a: sample(*a, crossing=False), "carries the mass past p"),
        (lambda *a: sample(*a, vocab_order=True), "vocabulary order"),
        (lambda probs, p, u: int(torch.argmax(probs)), "greedy"),
        (lambda probs, p, u: probs, "one token id"),
        (lambda probs, p, u: 1.0, "one token id"),
        (lambda *a: torch.tensor(sample(*a)), "return int(...)"),  # a 0-d tensor is not an int
        (lambda *a: np.int64(sample(*a)), "return int(...)"),
        (sorted_position, "position of the draw in the sorted order; map it back through the sort's indices"),
    )
    for fn, words in cases:
        fb = ch11.check_top_p_sample(fn)
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


def test_follow_up_success_says_part_1_still_fails(monkeypatch):
    """Part 1 failed and the follow-up passes in the same kernel (the same cell): the green box, shown last, must
    not read as the whole exercise passing."""
    entry = ex._REGISTRY[ch11.check_kv_cache_bytes.exercise]
    monkeypatch.setitem(ex._REGISTRY, ch11.check_kv_cache_bytes.exercise,
                        dict(entry, parts={p: {"name": None, "feedback": None, "started": False} for p in entry["parts"]}))

    answer = {"factor": 1}

    def kv_cache_bytes_learner(n_layers, n_heads, n_kv_heads, d_head, bytes_per_number, n_tokens):  # the 2 left out
        return answer["factor"] * n_layers * n_kv_heads * d_head * bytes_per_number * n_tokens

    fresh = ch11.check_sequences_that_fit(sequences_that_fit)
    assert fresh and "still fails" not in fresh.message, fresh.message
    assert not ch11.check_kv_cache_bytes(kv_cache_bytes_learner)
    follow_up = ch11.check_sequences_that_fit(sequences_that_fit)
    assert follow_up.ok and "part 1 (kv_cache_bytes) still fails" in follow_up.message, follow_up.message
    assert ex.progress(file=io.StringIO())[ch11.check_kv_cache_bytes.exercise] == "failed"
    answer["factor"] = 2  # the learner fixes part 1: the follow-up's message is the plain success again
    assert ch11.check_kv_cache_bytes(kv_cache_bytes_learner)
    again = ch11.check_sequences_that_fit(sequences_that_fit)
    assert again and "still fails" not in again.message, again.message
