"""bench/decode_compare.py compares the course's GPT with a transformers Llama of the same size: SwiGLU
has three feed-forward matrices where the course's GELU has two, so Llama's intermediate_size is 2/3 of
the course's d_ff, and the two models' weight matrices then hold the same number of parameters (exactly at
GPT-2 small's d_ff 3072; d_model more per layer at the capstone's 256, where 2/3 of 256 rounds to 171).
The rest differs by what the architectures differ in, stated here: the course has Q/K/V/O and
feed-forward biases, LayerNorm biases and a read-out bias that Llama has not. The counts are read from
the built models (course GPT on the CPU, Llama on the meta device), not from the bench's own formula."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
decode_compare = pytest.importorskip("decode_compare")
transformers = pytest.importorskip("transformers")

from selfattn.models.gpt import GPT, GPTConfig  # noqa: E402


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _llama(size):
    with torch.device("meta"):  # shapes only: no memory, no init
        return transformers.LlamaForCausalLM(decode_compare._hf_config(size))


@pytest.mark.parametrize("name", ["capstone", "gpt2-small"])
def test_llama_matches_the_course_gpts_weight_matrices(name):
    size = decode_compare.SIZES[name]
    D, F, V, n = size["d_model"], size["d_ff"], size["vocab_size"], size["n_layers"]
    llama = _llama(size)
    course = GPT(GPTConfig(block_size=64, positions="rope", **size))
    # matrices only (2-D parameters): embedding, read-out, attention projections, feed-forward
    course_matrices = sum(p.numel() for p in course.parameters() if p.dim() == 2)
    llama_matrices = sum(p.numel() for p in llama.parameters() if p.dim() == 2)
    assert llama.config.intermediate_size == {"capstone": 171, "gpt2-small": 2048}[name]
    # 3 x d_model x 171 - 2 x d_model x 256 = d_model (64) per layer at the capstone size; 0 at GPT-2 small's
    assert llama_matrices - course_matrices == {"capstone": D * n, "gpt2-small": 0}[name]
    assert abs(llama_matrices - course_matrices) <= 0.005 * course_matrices
    # the rest: the course's biases (b_Q, b_K, b_V, b_O, the feed-forward's two, the read-out's) and its
    # LayerNorm biases; Llama's RMSNorm has a weight and no bias
    course_vectors = _count(course) - course_matrices
    llama_vectors = _count(llama) - llama_matrices
    assert llama_vectors == (2 * n + 1) * D  # two RMSNorms per layer and the final one
    assert course_vectors == n * (4 * D + F + D + 4 * D) + 2 * D + V
    counts = decode_compare.parameter_counts(size)
    assert (counts["course"], counts["hf"]) == (_count(course), _count(llama))


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "256"])
def test_intermediate_size_refuses_bad_d_ff(bad):
    with pytest.raises(ValueError, match="d_ff"):
        decode_compare.hf_intermediate_size(bad)
