"""``pick_device``: CUDA, then MPS, then CPU; an explicit or environment choice is honoured."""

from __future__ import annotations

import pytest
import torch

from selfattn.device import describe_device, pick_device

HAS_CUDA = torch.cuda.is_available()
HAS_MPS = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


@pytest.fixture(autouse=True)
def _no_env_choice(monkeypatch):
    monkeypatch.delenv("SELFATTN_DEVICE", raising=False)


def test_automatic_choice_follows_cuda_mps_cpu():
    expected = "cuda" if HAS_CUDA else ("mps" if HAS_MPS else "cpu")
    device = pick_device()
    assert isinstance(device, torch.device)
    assert device.type == expected


@pytest.mark.skipif(HAS_CUDA or HAS_MPS, reason="this machine has an accelerator")
def test_returns_cpu_without_accelerator():
    assert pick_device() == torch.device("cpu")


def test_prefer_cpu_always_works():
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA")
def test_prefer_cuda_without_cuda_raises():
    with pytest.raises(
        ValueError, match=r"prefer='cuda' but no cuda device is available on this machine"
    ):
        pick_device("cuda")


@pytest.mark.skipif(HAS_MPS, reason="this machine has MPS")
def test_prefer_mps_without_mps_raises():
    with pytest.raises(ValueError, match=r"prefer='mps' but no mps device is available"):
        pick_device("mps")


@pytest.mark.parametrize("name", ["gpu", "CUDA", "tpu", ""])
def test_unknown_name_raises(name):
    with pytest.raises(
        ValueError, match=rf"prefer must be one of \['cpu', 'cuda', 'mps'\] or None; got '{name}'"
    ):
        pick_device(name)


def test_environment_variable_is_respected(monkeypatch):
    monkeypatch.setenv("SELFATTN_DEVICE", "cpu")
    assert pick_device() == torch.device("cpu")
    monkeypatch.setenv("SELFATTN_DEVICE", "tpu")
    with pytest.raises(ValueError, match=r"got 'tpu'"):
        pick_device()


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA")
def test_environment_variable_asking_for_missing_cuda_raises(monkeypatch):
    monkeypatch.setenv("SELFATTN_DEVICE", "cuda")
    with pytest.raises(ValueError, match=r"no cuda device is available"):
        pick_device()


def test_explicit_argument_overrides_environment(monkeypatch):
    monkeypatch.setenv("SELFATTN_DEVICE", "tpu")
    assert pick_device("cpu") == torch.device("cpu")


def test_empty_environment_variable_means_automatic(monkeypatch):
    automatic = pick_device()
    monkeypatch.setenv("SELFATTN_DEVICE", "")
    assert pick_device() == automatic


def test_describe_device_cpu():
    before = torch.get_num_threads()
    try:
        for threads, expected in ((1, "cpu (1 thread)"), (2, "cpu (2 threads)")):  # "1 threads" before
            torch.set_num_threads(threads)
            assert describe_device(torch.device("cpu")) == describe_device("cpu") == expected
    finally:
        torch.set_num_threads(before)


def test_cpu_cache_sizes_reads_linux_sysfs(tmp_path):
    from selfattn.device import cpu_cache_sizes, parse_cache_size

    for i, (level, kind, size) in enumerate([("1", "Data", "32K"), ("1", "Instruction", "32K"),
                                             ("2", "Unified", "1024K"), ("3", "Unified", "32768K")]):
        folder = tmp_path / f"index{i}"
        folder.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size + "\n")):
            (folder / name).write_text(text)
    assert cpu_cache_sizes(str(tmp_path)) == {"L1d": 32 * 2**10, "L1i": 32 * 2**10, "L2": 2**20, "L3": 32 * 2**20}
    assert cpu_cache_sizes(str(tmp_path / "absent")) == {}
    assert parse_cache_size("2M") == 2 * 2**20 and parse_cache_size("512") == 512 and parse_cache_size("big") is None
