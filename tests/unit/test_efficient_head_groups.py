"""The tiled loop split over head groups, one CPU thread each (selfattn.efficient.head_groups).

The suite runs with OMP_NUM_THREADS=1, where the split never applies; these tests set 2 torch threads
themselves, check the split is taken, and compare it with the one-thread loop (which the rest of the
suite tests against the reference) and with the reference itself. Speed: bench/attention_bench.py."""

import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import selfattn
from selfattn.efficient import head_groups, sliding_window_tiled_attention, tiled_attention
from selfattn.efficient import tiled as tiled_module


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def count_groups(monkeypatch):
    """Records the n_groups of every split call (so a test knows the split path ran)."""
    calls = []
    real = head_groups.head_groups_apply

    def spy(fn, n_groups, tensors):
        calls.append(n_groups)
        return real(fn, n_groups, tensors)

    monkeypatch.setattr(head_groups, "head_groups_apply", spy)
    return calls


def _qkv(shape_q, S, Dv, *, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    *lead, T, Dh = shape_q
    q = torch.randn(*lead, T, Dh, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(*lead, S, Dh, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(*lead, S, Dv, generator=g, dtype=torch.float64).to(dtype)
    return [x.requires_grad_() for x in (q, k, v)]


def _run(fn, inputs):
    out = fn(*inputs)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    return (out, *torch.autograd.grad(out, inputs, d_out))


def _one_thread(fn, inputs):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(fn, inputs)
    finally:
        torch.set_num_threads(before)


CASES = [
    # (q shape, S, Dv, kwargs): 3 heads over 2 groups (unequal), batch and heads, T != S, a 3-d input
    ((1, 3, 70, 8), 70, 8, {"causal": True}),
    ((2, 3, 50, 16), 50, 4, {}),
    ((2, 2, 30, 8), 45, 8, {"causal": True, "alignment": "bottom_right"}),
    ((5, 40, 8), 40, 8, {"causal": True}),
]


@pytest.mark.parametrize("shape_q,S,Dv,kwargs", CASES)
def test_head_groups_give_the_one_thread_loops_numbers(two_threads, count_groups, shape_q, S, Dv,
                                                                    kwargs):
    inputs = _qkv(shape_q, S, Dv)
    fn = lambda q, k, v: tiled_attention(q, k, v, block_q=16, block_k=24, **kwargs)  # noqa: E731
    split = _run(fn, inputs)
    assert count_groups == [2, 2], "the forward and the backward ran in 2 head groups"
    for got, want in zip(split, _one_thread(fn, inputs), strict=True):
        assert torch.isfinite(got).all()
        # the same operations per head; MKL may choose another kernel for a group's smaller batch,
        # so the last bits may differ (float64: 1e-16 relative), never more
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)


@pytest.mark.parametrize("shape_q,S,Dv,kwargs", CASES)
def test_head_groups_match_the_reference(two_threads, shape_q, S, Dv, kwargs):
    inputs = _qkv(shape_q, S, Dv)
    keep = None
    if kwargs.get("causal"):
        keep = selfattn.causal_mask(shape_q[-2], S, alignment=kwargs.get("alignment"))
    got = _run(lambda q, k, v: tiled_attention(q, k, v, block_q=16, block_k=24, **kwargs), inputs)
    want = _run(lambda q, k, v: selfattn.scaled_dot_product_attention(q, k, v, keep), inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_sliding_window_runs_in_head_groups(two_threads, count_groups):
    inputs = _qkv((1, 4, 90, 8), 90, 8)
    fn = lambda q, k, v: sliding_window_tiled_attention(q, k, v, window=7, block_q=16, block_k=40)  # noqa: E731
    split = _run(fn, inputs)
    assert count_groups == [2, 2]
    for got, want in zip(split, _one_thread(fn, inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)


def test_a_nan_in_one_head_stays_out_of_rows_that_cannot_see_it(two_threads, count_groups):
    q, k, v = _qkv((1, 4, 40, 8), 40, 8)
    with torch.no_grad():
        v[0, 3, 30] = float("nan")  # head 3 (the second group), key 30: hidden from queries 0..29
    out, dq, dk, dv = _run(lambda a, b, c: tiled_attention(a, b, c, causal=True, block_q=16, block_k=16), [q, k, v])
    assert count_groups == [2, 2]
    assert torch.isnan(out[0, 3, 30:]).all() and torch.isfinite(out[0, 3, :30]).all()
    assert torch.isfinite(out[0, :3]).all() and torch.isfinite(dq[0, :3]).all() and torch.isfinite(dk[0, :3]).all()
    assert torch.isfinite(dq[0, 3, :30]).all(), "rows that cannot see key 30 get finite gradients"


def test_half_precision_in_head_groups_is_as_accurate_as_one_thread(two_threads, count_groups):
    inputs = _qkv((1, 4, 64, 16), 64, 16, dtype=torch.bfloat16)
    fn = lambda q, k, v: tiled_attention(q, k, v, causal=True, block_q=16, block_k=32)  # noqa: E731
    split = _run(fn, inputs)
    assert count_groups == [2, 2] and split[0].dtype == torch.bfloat16
    exact = [x.detach().double().requires_grad_() for x in inputs]
    truth = _run(lambda q, k, v: selfattn.scaled_dot_product_attention(q, k, v, selfattn.causal_mask(64)), exact)
    for got, alone, want in zip(split, _one_thread(fn, inputs), truth, strict=True):
        err_split, err_alone = ((x.double() - want).abs().max().item() for x in (got, alone))
        assert err_split <= 1.5 * err_alone + 1e-6, (err_split, err_alone)  # bfloat16: 2^-8 relative rounding


def test_inference_mode_is_carried_into_the_workers(two_threads, count_groups):
    q, k, v = (x.detach() for x in _qkv((1, 2, 33, 8), 33, 8))
    with torch.inference_mode():
        out = tiled_attention(q, k, v, causal=True, block_q=8, block_k=8)
    assert count_groups == [2] and out.is_inference()
    want = selfattn.scaled_dot_product_attention(q, k, v, selfattn.causal_mask(33))
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


def test_workers_run_one_thread_each_and_the_callers_count_is_unchanged(two_threads):
    tiled_attention(*(x.detach() for x in _qkv((1, 2, 20, 8), 20, 8)))
    assert head_groups.worker_threads(2) == [1, 1]
    assert torch.get_num_threads() == 2
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))  # a thread started later
    t.start()
    t.join()
    assert seen == [2], "the process-wide default is the caller's count again"


def test_not_split_with_one_thread_one_head_a_mask_a_mask_mod_a_bias_or_unsplit(two_threads, count_groups):
    q, k, v = (x.detach() for x in _qkv((1, 2, 20, 8), 20, 8))
    tiled_attention(q[:, :1], k[:, :1], v[:, :1])  # one head: nothing to split
    tiled_attention(q, k, v, torch.ones(20, 20, dtype=torch.bool))  # a mask tensor: broadcast per call
    tiled_attention(q, k, v, bias=torch.zeros(20, 20, dtype=torch.float64))
    tiled_attention(q, k, v, mask_mod=lambda b, h, qi, kj: kj <= qi)  # its h indexes the whole call's heads
    assert count_groups == []
    with head_groups.unsplit():
        tiled_attention(q, k, v)
    assert count_groups == []
    tiled_attention(q, k, v)
    assert count_groups == [2], "split again after the unsplit() block"
    torch.set_num_threads(1)
    tiled_attention(q, k, v)
    assert count_groups == [2]


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def test_not_split_under_a_dispatch_mode_so_the_mode_sees_every_operation(two_threads, count_groups):
    """A dispatch mode is thread-local: operations in a worker thread would escape it (chapter 10's
    traffic counter is one)."""
    q, k, v = (x.detach() for x in _qkv((1, 2, 40, 8), 40, 8))
    with _Count() as mode:
        tiled_attention(q, k, v, causal=True, block_q=8, block_k=8)
    assert count_groups == []
    assert mode.n > 5 * 5, "the tile loop's operations (at least one per tile) were seen by the mode"


def test_an_error_in_a_group_is_raised_in_the_caller(two_threads, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("broken group")

    monkeypatch.setattr(tiled_module, "_tiled_forward_base2", broken)
    q, k, v = (x.detach() for x in _qkv((1, 2, 20, 8), 20, 8))
    with pytest.raises(RuntimeError, match="broken group"):
        tiled_attention(q, k, v)


def _child_runs_tiled(q, queue):
    queue.put(tuple(tiled_attention(q, q, q).shape))


def test_a_forked_child_runs_the_split_after_the_parent_did(two_threads):
    """A fork copies the parent's pool objects but not their threads: the child must make new ones
    (before the fix the child's call waited for ever)."""
    import multiprocessing

    q = torch.randn(1, 4, 32, 8)
    tiled_attention(q, q, q)  # the parent's pool now exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_runs_tiled, args=(q, queue))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive, "the forked child hung in tiled_attention"
    assert child.exitcode == 0 and queue.get(timeout=5) == (1, 4, 32, 8)
