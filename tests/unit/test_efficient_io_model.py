"""``count_traffic``: the bytes torch code moves between slow and fast memory (the IO model of chapter 10).

Each expected count is worked out by hand from the counting rules in the module docstring."""

from __future__ import annotations

import pytest
import torch

from selfattn.efficient.io_model import count_traffic, flash_block_sizes

BIG = 1024 * 4  # bytes of a (1024,) float32 tensor


def _vec(n=1024):
    return torch.arange(n, dtype=torch.float32)


def test_a_reduction_reads_its_input_once_and_writes_its_result():
    q = _vec()
    result, traffic = count_traffic(lambda: q.sum(), fast_memory=64, inputs={"Q": q})
    assert float(result) == pytest.approx(1023 * 1024 / 2, rel=0, abs=0)
    assert traffic.read == {"Q": BIG} and traffic.written == {"output": 4} and traffic.operations == 1


def test_views_move_nothing():
    q = _vec().reshape(32, 32)
    _, traffic = count_traffic(lambda: q[:8].T[:5].unsqueeze(0).reshape(5, 8), fast_memory=64, inputs={"Q": q})
    assert traffic.total == 0 and traffic.operations == 0


def test_a_reshape_that_must_copy_reads_and_writes_the_elements_once():
    q = _vec().reshape(32, 32)
    _, traffic = count_traffic(lambda: q[:8].T.reshape(-1), fast_memory=64, inputs={"Q": q})
    assert traffic.read == {"Q": 8 * 32 * 4} and traffic.written == {"output": 8 * 32 * 4}
    assert traffic.operations == 1  # the copy; the view that follows it is free


def test_only_the_viewed_elements_of_a_slice_are_read():
    q = _vec()
    _, traffic = count_traffic(lambda: q[100:200].sum(), fast_memory=64, inputs={"Q": q})
    assert traffic.read == {"Q": 100 * 4}


def test_in_place_reads_and_writes_copy_and_out_only_write():
    q, o = _vec(), torch.zeros(1024)
    _, in_place = count_traffic(lambda: q.mul_(2.0), fast_memory=64, inputs={"Q": q})
    assert in_place.read == {"Q": BIG} and in_place.written == {"Q": BIG}  # the result aliases Q: not written twice
    _, copy = count_traffic(lambda: o.copy_(q), fast_memory=64, inputs={"Q": q, "O": o})
    assert copy.read == {"Q": BIG} and copy.written == {"O": BIG}
    k = _vec()
    _, out = count_traffic(lambda: torch.add(q, k, out=o), fast_memory=64, inputs={"Q": q, "K": k, "O": o})
    assert out.read == {"Q": BIG, "K": BIG} and out.written == {"O": BIG}


def test_a_temporary_too_big_for_fast_memory_goes_to_slow_memory_each_time():
    q = _vec()

    def twice():
        return sum(float((q * 2).sum()) for _ in range(2))  # a new (1024,) temporary each time

    _, small_m = count_traffic(twice, fast_memory=BIG - 1, inputs={"Q": q})
    assert small_m.written == {"intermediate": 2 * BIG} and small_m.read == {"Q": 2 * BIG, "intermediate": 2 * BIG}
    _, large_m = count_traffic(twice, fast_memory=BIG, inputs={"Q": q})  # fits: moves inside fast memory are free
    assert "intermediate" not in large_m.written and large_m.read == {"Q": 2 * BIG}
    assert large_m.largest_fast == BIG


def test_out_aliasing_an_input_is_read_and_written():
    q, k = _vec(), torch.ones(1024)
    _, same = count_traffic(lambda: torch.exp2(q, out=q), fast_memory=64, inputs={"Q": q})
    assert same.read == {"Q": BIG} and same.written == {"Q": BIG}
    _, add = count_traffic(lambda: torch.add(q, k, out=q), fast_memory=64, inputs={"Q": q, "K": k})
    assert add.read == {"Q": BIG, "K": BIG} and add.written == {"Q": BIG}


def test_a_loop_that_keeps_more_than_fast_memory_alive_is_caught_by_its_working_set():
    """Copying K and V into many pieces, each small enough to count as fast, would make exact attention
    look as if it moved only 4 T d numbers, below the paper's lower bound: the working set shows that
    the pieces do not fit in the fast memory together."""
    T, d, M = 256, 16, 4 * 2**10
    q, k, v = (torch.randn(T, d) for _ in range(3))

    def cheat():
        ks, vs = [k[i:i + 16].clone() for i in range(0, T, 16)], [v[i:i + 16].clone() for i in range(0, T, 16)]
        return torch.cat([torch.softmax(torch.cat([q[i:i + 16] @ kj.T for kj in ks], dim=1), dim=1)
                          @ torch.cat(vs) for i in range(0, T, 16)])

    out, traffic = count_traffic(cheat, fast_memory=M, inputs={"Q": q, "K": k, "V": v})
    torch.testing.assert_close(out, torch.softmax(q @ k.T, dim=1) @ v, rtol=1e-5, atol=1e-5)
    assert traffic.peak_working_set > 4 * M  # all of K and V held at once: 32 KiB against 4 KiB
    from selfattn.efficient import tiled_attention
    from selfattn.efficient.io_model import flash_block_sizes

    bq, bk = flash_block_sizes(M, d)
    _, tiled = count_traffic(lambda: tiled_attention(q, k, v, scale=1.0, block_q=bq, block_k=bk),
                             fast_memory=M, inputs={"Q": q, "K": k, "V": v})
    # the loop's own working set: its tiles and the current block's running maxima and sums (the
    # statistics of all T rows are kept in slow memory, as a kernel keeps them)
    assert tiled.peak_working_set <= 1.5 * M, tiled.peak_working_set / M


def test_results_are_slow_memory_whatever_their_size():
    q = _vec(4)
    _, traffic = count_traffic(lambda: q + 1, fast_memory=2**20, inputs={"Q": q})
    assert traffic.read == {"Q": 16} and traffic.written == {"output": 16}


def test_allocation_moves_nothing_filling_writes():
    _, empty = count_traffic(lambda: torch.empty(1024), fast_memory=64, inputs={})
    assert empty.total == 0
    _, zeros = count_traffic(lambda: torch.zeros(1024), fast_memory=64, inputs={})
    assert zeros.written == {"output": BIG}


@pytest.mark.parametrize("bad", [0, -4, 1.5, True, "64"])
def test_fast_memory_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="fast_memory must be a positive number of bytes"):
        count_traffic(lambda: None, fast_memory=bad, inputs={})


def test_inputs_must_be_tensors():
    with pytest.raises(ValueError, match=r"inputs\['Q'\] must be a torch.Tensor, got list"):
        count_traffic(lambda: None, fast_memory=64, inputs={"Q": [1.0]})


def test_flash_block_sizes_follow_algorithm_1():
    assert flash_block_sizes(64 * 2**10, 64) == (64, 64)  # 16384 numbers / (4 x 64) = 64 rows
    assert flash_block_sizes(512 * 2**10, 64) == (512, 64)  # the second block stops at d
    assert flash_block_sizes(1000 * 4, 64) == (4, 4)  # ceil(1000 / 256)
    assert flash_block_sizes(64 * 2**10, 64, element_size=2) == (128, 64)
    with pytest.raises(ValueError, match="need at least 4 \\* d_head = 256"):
        flash_block_sizes(1000, 64)


def test_inputs_must_be_a_dict_of_separate_storages_with_free_names():
    qkv = torch.zeros(4, 6)
    q, k, _ = qkv.split(2, dim=-1)
    with pytest.raises(ValueError, match="inputs must be a dict"):
        count_traffic(lambda: None, fast_memory=64, inputs=[q])
    with pytest.raises(ValueError, match=r"inputs\['K'\] shares its storage with inputs\['Q'\]"):
        count_traffic(lambda: None, fast_memory=64, inputs={"Q": q, "K": k})
    with pytest.raises(ValueError, match="may not be named 'output'"):
        count_traffic(lambda: None, fast_memory=64, inputs={"output": q})


@pytest.mark.parametrize("kwargs", [{"d_head": -4}, {"d_head": 0}, {"element_size": 0}, {"element_size": -4},
                                    {"fast_memory": 65536.5}, {"fast_memory": True}])
def test_flash_block_sizes_refuses_bad_arguments(kwargs):
    args = {"fast_memory": 65536, "d_head": 64, **kwargs}
    with pytest.raises(ValueError, match="must be a positive int"):
        flash_block_sizes(**args)


def test_the_loops_per_row_statistics_are_slow_memory_so_its_working_set_does_not_grow_with_T():
    """The loop keeps a running maximum and sum for every query row and saves them (the log-sum-exp
    the backward needs): (T,) buffers that it fills one query block at a time, as a kernel writes them
    to slow memory. Counted as fast memory they made the working set grow with T: by 2 numbers of 4
    bytes a row, 2.02 M at T = 8192 and M = 64 KiB (16,384 numbers), inside the theorem's range
    d <= M <= T d (review 13, S4). So the peak is the same number of bytes at T = 1024 and 2048 (it
    would differ by 8 KiB), within 1.5 M: doubling T is the claim, and 16x fewer tile steps than 8192."""
    from selfattn.efficient import tiled_attention

    d, M = 64, 64 * 2**10
    bq, bk = flash_block_sizes(M, d)  # 64 x 64
    peaks = {}
    for T in (1024, 2048):
        g = torch.Generator().manual_seed(13)
        q, k, v = (torch.randn(T, d, generator=g) for _ in range(3))
        with torch.no_grad():
            out, traffic = count_traffic(lambda q=q, k=k, v=v: tiled_attention(q, k, v, scale=1.0, block_q=bq,
                                                                                block_k=bk),
                                         fast_memory=M, inputs={"Q": q, "K": k, "V": v})
        assert torch.isfinite(out).all()
        peaks[T] = traffic.peak_working_set
        # the statistics are charged as traffic: the maxima and the log2-sums written once per row (2T),
        # 4 bytes a number; nothing reads them again in a forward pass that returns no log-sum-exp
        assert traffic.written["kept"] == 4 * 2 * T and "kept" not in traffic.read, traffic
    assert peaks[1024] == peaks[2048] <= 1.5 * M, {T: p / M for T, p in peaks.items()}


def test_a_buffer_filled_piece_by_piece_is_slow_memory_and_a_reused_one_is_fast():
    """The rule behind the statistics: a buffer allocated empty and then filled in pieces, each byte
    written once, is kept in slow memory (as a loop's output rows are); a buffer that the code writes
    again (a tile reused by every step) is fast memory, and moves within it are free."""
    q = _vec()

    def fill_and_reuse():
        kept, tile = torch.empty(1024), torch.empty(256)
        for i in range(0, 1024, 256):
            torch.mul(q[i:i + 256], 2.0, out=tile)  # the reused tile: written at the same place each time
            kept[i:i + 256].copy_(tile)  # each piece of kept written once
        return kept.sum()

    _, traffic = count_traffic(fill_and_reuse, fast_memory=BIG, inputs={"Q": q})
    # Q read once (4 pieces); kept written once in 4 pieces and read once by the sum; the tile is free
    assert traffic.read == {"Q": BIG, "kept": BIG} and traffic.written == {"kept": BIG, "output": 4}
    assert traffic.largest_fast == 256 * 4  # the tile, not the kept buffer
    # working set at its peak, the sum: the tile, still alive and fast (1 KiB), plus the whole of kept
    # that the sum brings in (4 KiB, which fits); the sum's result is slow memory (an output)
    assert traffic.peak_working_set == BIG + 256 * 4
