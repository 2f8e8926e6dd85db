"""selfattn.models.gpt: the model equals its written-out definition for every position scheme, is
causal by construction, the KV-cached path equals the full one and generation with and without the
cache gives the same tokens (every scheme, past block_size for the unbounded ones), learned positions
refuse to run past their table, the training loop and the baselines."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from selfattn import causal_mask
from selfattn.efficient import KVCache
from selfattn.models.gpt import GPT, GPTConfig, evaluate_loss, train_lm, unigram_cross_entropy
from selfattn.models.tiny_lm import TinyLM, TinyLMConfig
from selfattn.positions import POSITION_SCHEMES

UNBOUNDED = [s for s in POSITION_SCHEMES if s != "learned"]


def _model(seed=0, n_layers=2, block_size=16, positions="rope", n_heads=3, d_model=24):
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=13, block_size=block_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
        d_ff=48, positions=positions,
    )
    model = GPT(config).eval()
    # Trained-looking weights: larger than the init so that the logits are not all alike.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _ids(B, T, seed):
    return torch.randint(0, 13, (B, T), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------
# An independent, written-out reference: torch's own SDPA with an additive float mask, RoPE through
# complex multiplication, the sinusoids and ALiBi's slopes from the papers' formulas.
# ----------------------------------------------------------------------------------------------


def _rope_reference(x, base):
    """Half layout (pair i = features i, i + Dh/2), position m turns pair i by m * base^(-2i/Dh)."""
    T, Dh = x.shape[-2], x.shape[-1]
    theta = base ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)  # (Dh/2,)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta[None]  # (T, Dh/2)
    z = torch.complex(x[..., : Dh // 2].double(), x[..., Dh // 2 :].double())
    z = z * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def _reference_logits(model, ids):
    cfg = model.config
    B, T = ids.shape
    H, Dh, D = cfg.n_heads, cfg.d_head, cfg.d_model
    x = model.token_embedding.weight[ids]  # (B, T, D)
    if cfg.positions == "learned":
        x = x + model.positions.weight[:T]
    if cfg.positions == "sinusoidal":
        p = torch.arange(T, dtype=torch.float64)[:, None]
        w = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        pe = torch.zeros(T, D, dtype=torch.float64)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(p * w), torch.cos(p * w)
        x = x * D**0.5 + pe.float()  # Vaswani et al. section 3.4: embeddings times sqrt(d_model)
    offsets = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # (T, T): i - j
    additive = torch.zeros(H, T, T).masked_fill(offsets < 0, float("-inf"))
    if cfg.positions == "alibi":  # H a power of two: slopes 2^(-8 (h+1) / H)
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])
        additive = additive - slopes[:, None, None] * offsets.float()
    for block in model.blocks:
        a, h = block.attn, block.ln1(x)
        q, k, v = ((h @ W + b).view(B, T, H, Dh).transpose(1, 2)
                   for W, b in ((a.W_Q, a.b_Q), (a.W_K, a.b_K), (a.W_V, a.b_V)))
        if cfg.positions == "rope":
            q, k = _rope_reference(q, cfg.rope_base), _rope_reference(k, cfg.rope_base)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)  # (B, H, T, Dh)
        x = x + context.transpose(1, 2).reshape(B, T, D) @ a.W_O + a.b_O
        x = x + block.ffn(block.ln2(x))
    return model.lm_head(model.ln_f(x))


@pytest.mark.parametrize("positions", POSITION_SCHEMES)
def test_forward_equals_the_written_out_definition(positions):
    model = _model(positions=positions, n_heads=4, d_model=32, block_size=8)
    T = 8 if positions == "learned" else 13  # the unbounded schemes also past block_size
    ids = _ids(2, T, 1)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), _reference_logits(model, ids), rtol=0, atol=2e-5)


def test_learned_positions_equal_tiny_lm_with_the_causal_mask():
    # Adapted from the old test that moved a GPT state dict into a TinyLM as is: with positions
    # "learned" the GPT is chapter 04's TinyLM with the causal mask; the table is now the scheme's
    # ``positions.weight`` instead of TinyLM's ``position_embedding``, everything else keeps its name.
    model = _model(positions="learned")
    c = model.config
    tiny = TinyLM(TinyLMConfig(c.vocab_size, c.block_size, c.d_model, c.n_heads, c.n_layers, c.d_ff)).eval()
    state = dict(model.state_dict())
    state["position_embedding"] = state.pop("positions.weight")
    tiny.load_state_dict(state, strict=True)
    ids = _ids(2, 10, 1)
    torch.testing.assert_close(model(ids), tiny(ids, causal_mask(10)), rtol=0, atol=1e-6)
    # Without positions it is TinyLM with an all-zero table; RoPE's model has no position parameter.
    none = _model(positions="none")
    state = dict(none.state_dict(), position_embedding=torch.zeros(c.block_size, c.d_model))
    tiny.load_state_dict(state, strict=True)
    torch.testing.assert_close(none(ids), tiny(ids, causal_mask(10)), rtol=0, atol=1e-6)
    assert not any("position" in name for name in _model(positions="rope").state_dict())


def test_every_scheme_gets_the_same_initial_parameters_for_one_seed():
    # The scheme is built last, so comparisons of schemes start from the same weights.
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=13, block_size=8, d_model=24, n_heads=3, positions="none")).state_dict()
    for positions in POSITION_SCHEMES:
        torch.manual_seed(0)
        state = GPT(GPTConfig(vocab_size=13, block_size=8, d_model=24, n_heads=3, positions=positions)).state_dict()
        for name, t in base.items():
            assert torch.equal(state[name], t), (positions, name)


@pytest.mark.parametrize("positions", POSITION_SCHEMES)
def test_logits_at_t_ignore_later_tokens_and_weights_are_causal(positions):
    model = _model(positions=positions)
    T = 16 if positions == "learned" else 24  # past block_size=16 where the scheme can
    ids = _ids(2, T, 2)
    logits, weights = model(ids, return_weights=True)
    assert torch.isfinite(logits).all()
    for t in (0, 7, T - 2):
        changed = ids.clone()
        changed[:, t + 1 :] = (changed[:, t + 1 :] + 5) % 13
        torch.testing.assert_close(logits[:, : t + 1], model(changed)[:, : t + 1], rtol=0, atol=1e-5)
        assert (logits[:, t + 1 :] - model(changed)[:, t + 1 :]).abs().max() > 1e-3  # later ones do change
    assert len(weights) == 2 and weights[0].shape == (2, 3, T, T)
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for w in weights:
        assert torch.isfinite(w).all()
        assert w[..., upper].abs().max().item() == 0.0
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, T), rtol=0, atol=1e-5)


@pytest.mark.parametrize("positions", POSITION_SCHEMES)
def test_forward_cached_step_by_step_equals_full_forward(positions):
    model = _model(positions=positions)
    T = 16 if positions == "learned" else 30  # past block_size=16 where the scheme can
    ids = _ids(3, T, 3)
    full = model(ids)
    caches = [KVCache() for _ in model.blocks]
    chunks = [model.forward_cached(ids[:, :4], caches)]  # a 4-token prompt,
    chunks += [model.forward_cached(ids[:, 4:7], caches)]  # a chunk of 3, then one token at a time
    chunks += [model.forward_cached(ids[:, t : t + 1], caches) for t in range(7, T)]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-5, atol=1e-5)
    assert len(caches[0]) == T and len(caches[1]) == T


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("positions", POSITION_SCHEMES)
def test_generate_with_cache_equals_without_token_by_token(positions, greedy):
    model = _model(positions=positions)
    prompt = _ids(4, 3, 4)
    n_new = 13 if positions == "learned" else 37  # to 40 tokens, past block_size=16, where it can
    kw = dict(greedy=greedy, temperature=0.9)
    with_cache = model.generate(prompt, n_new, generator=torch.Generator().manual_seed(5), use_cache=True, **kw)
    without = model.generate(prompt, n_new, generator=torch.Generator().manual_seed(5), use_cache=False, **kw)
    assert with_cache.shape == (4, 3 + n_new)
    assert torch.equal(with_cache[:, :3], prompt)
    assert torch.equal(with_cache, without)


def test_greedy_generation_is_the_argmax_of_the_full_forward():
    model = _model()
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, 20, greedy=True)  # to 23 tokens, past block_size=16
    for t in range(3, 23):
        assert out[0, t].item() == model(out[:, :t])[0, -1].argmax().item()


def test_seeded_sampling_is_reproducible_and_temperature_matters():
    model = _model()
    prompt = torch.tensor([[0]])
    a = model.generate(prompt, 15, generator=torch.Generator().manual_seed(0))
    b = model.generate(prompt, 15, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b)
    cold = model.generate(prompt, 15, temperature=1e-4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cold, model.generate(prompt, 15, greedy=True))


def test_learned_positions_cannot_run_past_their_table():
    model = _model(positions="learned", block_size=8)
    table = r"exceeds? the learned position table of 8 rows \(block_size=8\)"
    with pytest.raises(ValueError, match=table + r".*input_ids of shape \(1, 9\)"):
        model(torch.zeros(1, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match=table):
        model.generate(torch.tensor([[1, 2]]), 7)
    caches = [KVCache() for _ in model.blocks]
    model.forward_cached(torch.zeros(1, 8, dtype=torch.int64), caches)  # fills the table exactly
    with pytest.raises(ValueError, match=r"positions 8\.\.8 " + table):
        model.forward_cached(torch.zeros(1, 1, dtype=torch.int64), caches)
    assert model.generate(torch.tensor([[1, 2]]), 6).shape == (1, 8)  # up to the table is fine
    # Every other scheme runs there.
    for positions in UNBOUNDED:
        logits = _model(positions=positions, block_size=8)(torch.zeros(1, 20, dtype=torch.int64))
        assert logits.shape == (1, 20, 13) and torch.isfinite(logits).all()


def test_config_is_validated_and_frozen():
    with pytest.raises(ValueError, match=r"positions must be one of \('learned'.*got 'absolute'"):
        GPTConfig(vocab_size=5, positions="absolute")
    for bad in (1.0, 0, math.inf, math.nan, True, "10000"):
        with pytest.raises(ValueError, match="rope_base must be a finite number > 1"):
            GPTConfig(vocab_size=5, rope_base=bad)
    with pytest.raises(ValueError, match=r"positions='rope' does not fit d_model=6, n_heads=2 \(d_head=3\)"):
        GPTConfig(vocab_size=5, d_model=6, n_heads=2, d_ff=8)
    GPTConfig(vocab_size=5, d_model=6, n_heads=2, d_ff=8, positions="alibi")  # odd d_head is fine there
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(vocab_size=5, d_model=10, n_heads=3)
    config = GPTConfig(vocab_size=5)
    assert (config.positions, config.rope_base, config.block_size) == ("rope", 10000.0, 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.positions = "learned"
    with pytest.raises(TypeError, match="config must be a GPTConfig; got TinyLMConfig"):
        GPT(TinyLMConfig(vocab_size=5))
    assert GPT(GPTConfig(vocab_size=5, rope_base=500000.0)).positions.base == 500000.0


def test_generate_rejects_bad_arguments():
    model = _model(block_size=8)
    prompt = torch.tensor([[1, 2]])
    with pytest.raises((TypeError, ValueError), match="max_new_tokens"):
        model.generate(prompt, 0)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 2, temperature=0.0)
    with pytest.raises(ValueError, match=r"caches must hold one KVCache per layer \(2\); got 1"):
        model.forward_cached(prompt, [KVCache()])
    uneven = [KVCache() for _ in model.blocks]
    model.forward_cached(prompt, uneven)
    uneven[1] = KVCache()  # one layer's cache lost its positions
    with pytest.raises(ValueError, match=r"same number of positions; got lengths \[2, 0\]"):
        model.forward_cached(prompt, uneven)


def test_unigram_cross_entropy_against_the_formula():
    train = torch.tensor([0, 0, 1, 2])
    val = torch.tensor([0, 2])
    # add-one counts over V = 4: [3, 2, 2, 1] / 8
    expected = -(math.log(3 / 8) + math.log(2 / 8)) / 2
    assert unigram_cross_entropy(train, val, 4) == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="val_ids"):
        unigram_cross_entropy(train, val[None], 4)


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_training_beats_the_uniform_baseline_and_logs_validation(positions):
    torch.manual_seed(0)
    # A periodic sequence: predictable from context, so training must drive the loss far below log V.
    ids = torch.arange(600) % 7
    model = GPT(GPTConfig(vocab_size=7, block_size=8, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                          positions=positions))
    log = train_lm(
        model,
        ids,
        ids,
        steps=60,
        batch_size=16,
        lr=1e-2,
        eval_every=20,
        eval_batches=2,
        progress=False,
    )
    assert len(log.train_loss) == 60 and log.val_steps == [20, 40, 60]
    assert all(math.isfinite(v) for v in log.train_loss + log.val_loss)
    assert log.val_loss[-1] < 0.2 * math.log(7), log.val_loss
    assert evaluate_loss(model, ids, batches=2, batch_size=16) == pytest.approx(
        log.val_loss[-1], abs=1e-6
    )
    assert not model.training


def test_empty_input_and_infinite_temperature_are_named_errors():
    # Regression: an empty input_ids failed with "T must be > 0" (from the causal mask, not naming
    # input_ids); temperature=inf was accepted although the rule is a finite number > 0.
    model = _model(block_size=8)
    empty = torch.zeros(1, 0, dtype=torch.int64)
    for call in (lambda: model(empty), lambda: model.generate(empty, 2)):
        with pytest.raises(ValueError, match=r"input_ids must hold at least one token \(T > 0\); got shape \(1, 0\)"):
            call()
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            model.generate(torch.tensor([[1, 2]]), 2, temperature=bad)
    with pytest.raises(TypeError, match="temperature must be a finite number > 0"):  # a bool, as in sample()
        model.generate(torch.tensor([[1, 2]]), 2, temperature=True)


# ----------------------------------------------------------------------------------------------
# The cache protocol (chapter 11): forward_cached asks each layer's cache for its plan
# ----------------------------------------------------------------------------------------------


class _RecordingCache:
    """A cache of the protocol written out here: it keeps everything, keys rotated when stored (what a
    KVCache does), and records the plans and rotations it was asked for."""

    def __init__(self):
        self.inner = KVCache()
        self.calls = []

    def plan(self, T, scheme, device):
        from selfattn.models.gpt import CachePlan

        n = len(self.inner)
        return CachePlan(n, n, n + T, causal_mask(T, n + T, alignment="bottom_right", device=device))

    def update(self, k_new, v_new, rotate):
        self.calls.append(len(self.inner))
        return self.inner.append(rotate(k_new, len(self.inner)), v_new)


@pytest.mark.parametrize("positions", POSITION_SCHEMES)
def test_any_cache_following_the_protocol_gives_the_kv_cache_path(positions):
    model = _model(positions=positions)
    ids = _ids(2, 16, 6)
    caches = [_RecordingCache() for _ in model.blocks]
    out = torch.cat([model.forward_cached(ids[:, :5], caches)]
                    + [model.forward_cached(ids[:, t : t + 1], caches) for t in range(5, 16)], dim=1)
    torch.testing.assert_close(out, model(ids), rtol=0, atol=1e-5)
    assert caches[0].calls == [0, *range(5, 16)]  # each step rotated its new keys at their first position


def test_generate_with_make_cache_kv_equals_the_default_and_bad_make_cache_is_refused():
    model = _model()
    prompt = _ids(2, 4, 7)
    assert torch.equal(model.generate(prompt, 12, greedy=True),
                       model.generate(prompt, 12, greedy=True, make_cache=KVCache))
    with pytest.raises(ValueError, match="make_cache must be a callable returning a fresh cache, with use_cache=True"):
        model.generate(prompt, 2, make_cache=KVCache, use_cache=False)
    with pytest.raises(ValueError, match="make_cache must be a callable"):
        model.generate(prompt, 2, make_cache="window")
    with pytest.raises(TypeError, match=r"caches\[0\] must be a KVCache or a cache with plan\(\) and update\(\)"):
        model.forward_cached(prompt, [None, KVCache()])


# --- generate's argument checks after the new-user probe (chapter 11) ---


def test_generate_accepts_numpy_temperatures_like_sample():
    """temperature=np.float32(0.7) was refused with 'must be a finite number > 0; got np.float32(0.7)'."""
    import numpy as np

    model, prompt = _model(), _ids(1, 4, 0)
    a = model.generate(prompt, 3, temperature=np.float32(0.7), generator=torch.Generator().manual_seed(0))
    b = model.generate(prompt, 3, temperature=float(np.float32(0.7)), generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b)


def test_generate_bad_temperature_type_and_generator_are_type_errors():
    model, prompt = _model(), _ids(1, 4, 0)
    with pytest.raises(TypeError, match=r"temperature must be a finite number > 0; got 'hot' \(str\)"):
        model.generate(prompt, 2, temperature="hot")
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None; got 42"):
        model.generate(prompt, 2, generator=42)


@pytest.mark.parametrize("greedy", [True, False])
def test_generate_with_nan_weights_raises_instead_of_returning_tokens(greedy):
    """Greedy decoding of a model with NaN weights returned tokens (argmax of NaN logits) silently."""
    model, prompt = _model(), _ids(1, 4, 0)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(ValueError, match="logits must not hold NaN"):
        model.generate(prompt, 2, greedy=greedy, generator=torch.Generator().manual_seed(0))


def test_generate_with_a_tiny_temperature_is_greedy():
    model, prompt = _model(), _ids(1, 4, 0)
    greedy = model.generate(prompt, 6, greedy=True)
    assert torch.equal(model.generate(prompt, 6, temperature=1e-39, generator=torch.Generator().manual_seed(1)), greedy)


def test_tied_embeddings_share_one_parameter_and_save_v_times_d():
    """Press & Wolf 2017: the read-out's weight IS the embedding table; V * D fewer parameters."""
    kw = dict(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=2, d_ff=32)
    torch.manual_seed(0)
    untied = GPT(GPTConfig(**kw))
    torch.manual_seed(0)
    tied = GPT(GPTConfig(**kw, tie_embeddings=True))
    assert tied.lm_head.weight is tied.token_embedding.weight
    assert untied.lm_head.weight is not untied.token_embedding.weight
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731  (parameters() lists a shared one once)
    assert n(untied) - n(tied) == 11 * 16
    # Every other parameter starts from the same numbers for one seed (the tie only drops a matrix).
    tied_state = tied.state_dict()
    for name, t in untied.state_dict().items():
        if name != "lm_head.weight":
            assert torch.equal(t, tied_state[name]), name
    # The logits are the final hidden states (captured after ln_f) times the embedding table, plus the bias.
    ids = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1))
    hidden = []
    hook = tied.ln_f.register_forward_hook(lambda module, args, out: hidden.append(out))
    with torch.no_grad():
        logits = tied(ids)
    hook.remove()
    expected = hidden[0] @ tied.token_embedding.weight.T + tied.lm_head.bias  # (2, 8, 16) @ (16, 11)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    # One gradient step keeps the two names on one tensor.
    tied(ids).sum().backward()
    torch.optim.SGD(tied.parameters(), lr=0.1).step()
    assert tied.lm_head.weight is tied.token_embedding.weight
    with pytest.raises(TypeError, match="tie_embeddings must be a bool"):
        GPTConfig(**kw, tie_embeddings=1)
    assert GPTConfig(vocab_size=11).tie_embeddings is False
