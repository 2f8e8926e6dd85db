"""Fixtures shared by the parity tests: offline mode for Hugging Face libraries, and conversion
of a torch block's parameters into the dict that ``selfattn.ref.block`` reads."""

import os

# Before transformers / sentence-transformers are imported anywhere in this session: never reach
# for a model hub; the real model is read from the installed package's directory only.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def block_params(block) -> dict[str, np.ndarray]:
    """A torch Transformer block's parameters as float64 NumPy arrays in the maths' layout."""

    def a(t):
        return t.detach().cpu().double().numpy()

    attn, ffn = block.attn, block.ffn
    return {
        "W_Q": a(attn.W_Q), "W_K": a(attn.W_K), "W_V": a(attn.W_V), "W_O": a(attn.W_O),
        "b_Q": a(attn.b_Q), "b_K": a(attn.b_K), "b_V": a(attn.b_V), "b_O": a(attn.b_O),
        "ln1_gamma": a(block.ln1.weight), "ln1_beta": a(block.ln1.bias),
        "ln2_gamma": a(block.ln2.weight), "ln2_beta": a(block.ln2.bias),
        "W_1": a(ffn.linear1.weight.T), "b_1": a(ffn.linear1.bias),
        "W_2": a(ffn.linear2.weight.T), "b_2": a(ffn.linear2.bias),
    }  # fmt: skip


@pytest.fixture
def to_ref_params():
    return block_params
