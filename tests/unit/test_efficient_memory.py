"""The two memory counters agree with sizes computed by hand."""

import pytest
import torch

from selfattn.efficient.memory import peak_rss_bytes, peak_tensor_bytes, rss_measurement_available


def test_peak_tensor_bytes_counts_live_tensors_only():
    x = torch.zeros(1000)  # input: not counted

    def fn(x):
        a = x + 1  # 4000 B
        b = a * 2  # 8000 B alive together
        del a
        c = b + 1  # a was freed: still 8000 B
        return c.sum()  # 4 B more while b, c alive -> 8004

    peak, result = peak_tensor_bytes(fn, x)
    assert peak == 8004
    assert result.item() == 3000.0


def test_peak_tensor_bytes_ignores_views_and_in_place():
    x = torch.zeros(256, 256)
    peak, _ = peak_tensor_bytes(lambda x: x[:128].transpose(0, 1).add_(1), x)
    assert peak == 0


@pytest.mark.skipif(not rss_measurement_available(), reason="needs Linux /proc/self/clear_refs")
def test_peak_rss_sees_a_large_allocation():
    peak, _ = peak_rss_bytes(lambda: torch.ones(64 * 2**20 // 4).sum())  # 64 MiB touched
    assert 60 * 2**20 < peak < 80 * 2**20, peak
