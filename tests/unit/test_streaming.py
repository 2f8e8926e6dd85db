"""selfattn.inference.streaming: the sliding-window cache with attention sinks (chapter 11, claim 28).

A window that holds everything gives exactly the plain KVCache path and GPT.forward (float64,
1e-12); a small window gives, at every step, the logits of an independent direct computation with an
explicit keep mask and explicit positions over the whole history (float64, 1e-12); the ring buffer
holds exactly the sinks and the last W positions in fixed-shape buffers; errors name the problem;
streaming_losses has the structure it documents (tiny untrained model)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from selfattn import scaled_dot_product_attention
from selfattn.efficient import KVCache
from selfattn.experiments.positions import compare_position_schemes
from selfattn.inference.streaming import (
    CACHE_POSITIONS,
    SlidingWindowCache,
    StreamingResult,
    make_caches,
    streaming_experiment,
    streaming_losses,
)
from selfattn.models.gpt import GPT, GPTConfig

ATOL = 1e-12  # float64 throughout


def _model(positions="rope", seed=0, block_size=16, n_layers=2):
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=13, block_size=block_size, d_model=24, n_heads=3, n_layers=n_layers, d_ff=48,
                       positions=positions)
    model = GPT(config).double().eval()
    with torch.no_grad():  # trained-looking weights, so that the logits differ
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _ids(B, N, seed=1):
    return torch.randint(0, 13, (B, N), generator=torch.Generator().manual_seed(seed))


def _streamed(model, ids, caches):
    with torch.no_grad():
        return torch.cat([model.forward_cached(ids[:, t : t + 1], caches) for t in range(ids.shape[1])], dim=1)


def _close(a, b, atol=ATOL):
    assert torch.isfinite(a).all() and torch.isfinite(b).all()  # a NaN must fail, never pass
    err = (a - b).abs().max().item()
    assert err <= atol, err
    return err


# ----------------------------------------------------------------------------------------------
# A window that holds everything is the plain cache
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("positions,scheme", [("cache", "rope"), ("cache", "alibi"), ("cache", "none"),
                                              ("text", "rope"), ("text", "sinusoidal"), ("text", "none"),
                                              ("text", "learned")])
@pytest.mark.parametrize("n_sinks", [0, 3])
def test_a_window_holding_everything_equals_the_kv_cache_and_forward(positions, scheme, n_sinks):
    N = 16 if scheme == "learned" else 37  # past block_size=16 where the scheme can
    model = _model(scheme)
    ids = _ids(2, N)
    with torch.no_grad():
        full = model(ids)
    kv = _streamed(model, ids, [KVCache() for _ in model.blocks])
    window = _streamed(model, ids, make_caches(model, N - n_sinks, n_sinks, positions=positions))
    _close(window, full)
    _close(window, kv)
    # a prompt that fits in one step, then token by token
    caches = make_caches(model, N - n_sinks, n_sinks, positions=positions)
    with torch.no_grad():
        chunked = torch.cat([model.forward_cached(ids[:, :5], caches), _streamed(model, ids[:, 5:], caches)], dim=1)
    _close(chunked, full)


def test_generate_with_a_window_cache_holding_everything_gives_the_same_tokens():
    model = _model()
    prompt = _ids(3, 4, seed=2)
    plain = model.generate(prompt, 30, greedy=True)
    windowed = model.generate(prompt, 30, greedy=True, make_cache=lambda: SlidingWindowCache(30, n_sinks=4))
    assert torch.equal(plain, windowed)
    small = model.generate(prompt, 30, greedy=True, make_cache=lambda: SlidingWindowCache(5, n_sinks=1))
    assert small.shape == plain.shape and torch.equal(small[:, :4], prompt)


# ----------------------------------------------------------------------------------------------
# A small window: every step equals a direct computation with an explicit mask and positions
# ----------------------------------------------------------------------------------------------


def _rope(x, positions, base):
    """Half layout, written out: pair i = features (i, i + Dh/2), position p turns it by p * base^(-2i/Dh)."""
    Dh = x.shape[-1]
    theta = base ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)  # (Dh/2,)
    angle = positions.double()[:, None] * theta[None]  # (S, Dh/2)
    z = torch.complex(x[..., : Dh // 2], x[..., Dh // 2 :]) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag], dim=-1)


def _alibi(H, q_pos, k_pos):
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float64)  # H = 2^k only
    return -slopes[:, None, None] * (q_pos[:, None] - k_pos[None, :]).double()  # (H, 1, S)


def _direct_logits(model, ids, window, n_sinks, positions):
    """Token by token over the WHOLE history (no ring buffer): key j is visible to query p iff j < n_sinks or
    p - window < j <= p; positions: rank among the visible keys ("cache") or j itself ("text")."""
    cfg = model.config
    B, N = ids.shape
    H, Dh = cfg.n_heads, cfg.d_head
    keys = [[] for _ in model.blocks]  # unrotated (B, H, Dh) per token, every token kept
    values = [[] for _ in model.blocks]
    out = []
    for p in range(N):
        j = torch.arange(p + 1)
        keep = (j < n_sinks) | (j > p - window)  # (p + 1,)
        rank = torch.cumsum(keep.long(), 0) - 1  # place among the visible keys, oldest first
        k_pos = rank if positions == "cache" else j
        q_pos = k_pos[p : p + 1]
        x = model.token_embedding.weight[ids[:, p : p + 1]]  # (B, 1, D)
        if cfg.positions == "learned":
            x = x + model.positions.weight[p]
        for layer, block in enumerate(model.blocks):
            a, h = block.attn, block.ln1(x)
            q, k, v = ((h @ W + b).view(B, 1, H, Dh).transpose(1, 2) for W, b in
                       ((a.W_Q, a.b_Q), (a.W_K, a.b_K), (a.W_V, a.b_V)))  # (B, H, 1, Dh)
            keys[layer].append(k[:, :, 0])
            values[layer].append(v[:, :, 0])
            K = torch.stack(keys[layer], dim=2)  # (B, H, p + 1, Dh)
            V = torch.stack(values[layer], dim=2)
            bias = None
            if cfg.positions == "rope":
                q, K = _rope(q, q_pos, cfg.rope_base), _rope(K, k_pos, cfg.rope_base)
            if cfg.positions == "alibi":
                bias = _alibi(H, q_pos, k_pos)
            context = scaled_dot_product_attention(q, K, V, keep[None, :], bias=bias)  # (B, H, 1, Dh)
            x = x + context.transpose(1, 2).reshape(B, 1, -1) @ a.W_O + a.b_O
            x = x + block.ffn(block.ln2(x))
        out.append(model.lm_head(model.ln_f(x)))
    return torch.cat(out, dim=1)  # (B, N, V)


@pytest.mark.parametrize("positions,scheme", [("cache", "rope"), ("cache", "alibi"), ("cache", "none"),
                                              ("text", "rope"), ("text", "learned")])
@pytest.mark.parametrize("window,n_sinks", [(5, 0), (5, 1), (4, 3), (1, 0), (1, 2)])
def test_each_step_equals_a_direct_computation_with_explicit_mask_and_positions(positions, scheme, window, n_sinks):
    model = _model(scheme, n_layers=2, block_size=16)
    if scheme == "alibi":
        model = _alibi_model()
    N = 16 if scheme == "learned" else 29
    ids = _ids(2, N, seed=3)
    with torch.no_grad():
        expected = _direct_logits(model, ids, window, n_sinks, positions)
        got = _streamed(model, ids, make_caches(model, window, n_sinks, positions=positions))
        full = model(ids)
    _close(got, expected)
    assert (got - full)[:, window + n_sinks :].abs().max() > 1e-3  # evicting changes the result


def _alibi_model():
    torch.manual_seed(0)  # 4 heads: the slopes 2^(-8(h+1)/H) of the written-out reference
    model = GPT(GPTConfig(vocab_size=13, block_size=16, d_model=32, n_heads=4, n_layers=2, d_ff=48,
                          positions="alibi")).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def test_with_rope_and_no_sinks_cache_and_text_positions_agree():
    # RoPE sees offsets only, and without sinks the offsets inside the window are the same either way.
    model = _model()
    ids = _ids(2, 40, seed=4)
    a = _streamed(model, ids, make_caches(model, 7, 0, positions="cache"))
    b = _streamed(model, ids, make_caches(model, 7, 0, positions="text"))
    _close(a, b, atol=1e-11)  # angles of positions up to 40 in float64
    c = _streamed(model, ids, make_caches(model, 7, 2, positions="cache"))
    d = _streamed(model, ids, make_caches(model, 7, 2, positions="text"))
    assert (c - d)[:, 10:].abs().max() > 1e-3  # with sinks they differ: the sinks' offsets differ


# ----------------------------------------------------------------------------------------------
# Ring-buffer bookkeeping
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window,n_sinks", [(4, 0), (4, 2), (1, 1), (3, 5)])
def test_the_ring_buffer_holds_the_sinks_and_the_last_window_in_fixed_buffers(window, n_sinks):
    cache = SlidingWindowCache(window, n_sinks)
    C = n_sinks + window
    B, H, Dh = 2, 3, 4
    stored = []
    shapes, pointers = set(), set()
    for N in range(1, 40):
        k = torch.full((B, H, 1, Dh), float(N - 1), dtype=torch.float64)  # key of text position N-1 holds N-1
        v = -k
        K, V = cache.update(k, v)  # no rotation
        stored.append(N - 1)
        held = list(range(min(n_sinks, N))) + list(range(max(n_sinks, N - window), N))
        assert cache.held_positions() == held and len(cache) == len(held) == min(N, C)
        assert cache.n_seen == N
        assert K[0, 0, :, 0].tolist() == [float(p) for p in held]  # returned oldest first
        assert torch.equal(V, -K)
        for slot, p in enumerate(cache.slot_positions.tolist()):  # every slot holds what it says
            if p >= 0:
                assert cache.k[0, 0, slot, 0].item() == p and cache.slot_of(p) == slot
            else:
                assert slot >= N
        assert sorted(p for p in cache.slot_positions.tolist() if p >= 0) == held
        shapes.add((tuple(cache.k.shape), tuple(cache.v.shape)))
        pointers.add((cache.k.data_ptr(), cache.v.data_ptr()))
    assert shapes == {((B, H, C, Dh), (B, H, C, Dh))}  # constant memory: never reallocated
    assert len(pointers) == 1


def test_model_caches_keep_constant_shapes_over_many_steps():
    model = _model()
    caches = make_caches(model, 6, 2)
    ids = _ids(1, 60, seed=5)
    with torch.no_grad():
        for t in range(60):
            model.forward_cached(ids[:, t : t + 1], caches)
            assert all(c.k.shape == (1, 3, 8, 8) and c.v.shape == (1, 3, 8, 8) for c in caches)
    assert caches[0].held_positions() == [0, 1, 54, 55, 56, 57, 58, 59]


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


def test_bad_settings_and_schemes_that_cannot_stream_are_named_errors():
    with pytest.raises(ValueError, match=r"window must be an int >= 1; got 0"):
        SlidingWindowCache(0)
    with pytest.raises(ValueError, match=r"n_sinks must be an int >= 0; got -1"):
        SlidingWindowCache(4, -1)
    for bad in (2.0, True, "4"):
        with pytest.raises(TypeError, match="window must be an int"):
            SlidingWindowCache(bad)
    with pytest.raises(TypeError, match="n_sinks must be an int"):
        SlidingWindowCache(4, 1.5)
    with pytest.raises(ValueError, match=r"positions must be one of \('cache', 'text'\); got 'absolute'"):
        SlidingWindowCache(4, positions="absolute")
    assert CACHE_POSITIONS == ("cache", "text")
    ids = _ids(1, 3)
    for scheme in ("learned", "sinusoidal"):
        with pytest.raises(ValueError, match=rf"positions='cache' renumbers .* the '{scheme}' scheme cannot"):
            _model(scheme).forward_cached(ids, make_caches(_model(scheme), 4))
    with pytest.raises(ValueError, match=r"positions='text' .* 'alibi' scheme's score bias"):
        _model("alibi").forward_cached(ids, make_caches(_model("alibi"), 4, positions="text"))
    learned = _model("learned", block_size=8)  # text positions: fine up to the table, refused past it
    caches = make_caches(learned, 3, 1, positions="text")
    _streamed(learned, _ids(1, 8), caches)
    with pytest.raises(ValueError, match=r"positions 8\.\.8 exceed the learned position table of 8 rows"):
        learned.forward_cached(_ids(1, 1), caches)


def test_several_tokens_at_once_only_while_they_fit():
    model = _model()
    caches = make_caches(model, 4, 2)
    model.forward_cached(_ids(1, 6), caches)  # exactly the capacity
    with pytest.raises(ValueError, match=r"several new tokens at once only while they fit .* seen 6 \+ new 2 <= "
                                         r"capacity n_sinks \+ window = 6\).*one token per step"):
        model.forward_cached(_ids(1, 2), caches)
    assert caches[0].n_seen == 6  # unchanged by the refusal
    cache = SlidingWindowCache(2)
    with pytest.raises(ValueError, match=r"seen 0 \+ new 3"):
        cache.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    assert cache.k is None and cache.n_seen == 0
    cache.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError, match=r"must match the buffers"):
        cache.update(torch.zeros(2, 1, 1, 2), torch.zeros(2, 1, 1, 2))
    with pytest.raises(TypeError, match="one dtype"):
        cache.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"k_new must have shape \(B, H, T_new, Dh\)"):
        cache.update(torch.zeros(1, 2), torch.zeros(1, 2))


def test_forward_cached_refuses_mixed_or_desynchronised_caches():
    model = _model()
    ids = _ids(1, 1)
    mixed = [KVCache(), SlidingWindowCache(4, 1)]
    model.forward_cached(_ids(1, 5), mixed)  # the same plan while nothing is evicted,
    with pytest.raises(ValueError, match="caches must all be of one kind"):  # not after
        model.forward_cached(ids, mixed)
    caches = make_caches(model, 3)
    model.forward_cached(_ids(1, 3), caches)
    caches[1] = SlidingWindowCache(3)
    with pytest.raises(ValueError, match=r"same number of positions; got lengths \[3, 0\]"):
        model.forward_cached(ids, caches)
    with pytest.raises(TypeError, match=r"caches\[1\] must be a KVCache or a cache with plan\(\) and update\(\)"):
        model.forward_cached(ids, [KVCache(), object()])


# ----------------------------------------------------------------------------------------------
# The measurement: structure only (tiny untrained model)
# ----------------------------------------------------------------------------------------------


def test_streaming_losses_structure_on_a_tiny_model():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=13, block_size=8, d_model=16, n_heads=2, n_layers=2, d_ff=32))
    ids = torch.randint(0, 13, (200,), generator=torch.Generator().manual_seed(0))
    result = streaming_losses(model, ids, window=6, n_sinks_list=(0, 2), n_streams=2, stream_length=40,
                              stretches=[(0, 8), (8, 40)], sink_far=4, reference_windows=3)
    assert isinstance(result, StreamingResult)
    assert result.labels == ("full cache", "window 6, 0 sinks", "window 6, 2 sinks", "recompute last 6")
    assert all(len(result.position_loss[k]) == 40 for k in result.labels)
    for k in result.labels:
        curve = torch.tensor(result.position_loss[k], dtype=torch.float64)
        assert torch.isfinite(curve).all()
        assert abs(result.stretch_loss[k][(8, 40)] - curve[8:].mean().item()) < 1e-12
        torch.testing.assert_close(curve[:6], torch.tensor(result.position_loss["full cache"][:6],
                                                           dtype=torch.float64), rtol=0, atol=1e-5)
    assert len(result.sink_weight) == 2 and len(result.sink_weight[0]) == 2
    assert all(0 <= w <= 1 for row in result.sink_weight for w in row) and 0 < result.sink_uniform < 1
    assert result.reference is not None and result.settings == {"n_streams": 2, "stream_length": 40}
    assert "recompute last 6" in result.table() and "8-39" in result.table()
    assert result.sink_far == 4
    # the same window settings at equal budget, and without the baselines
    lean = streaming_losses(model, ids, window=6, n_sinks_list=(0,), n_streams=2, stream_length=40,
                            extra_settings=[(4, 2)], baselines=False)
    assert lean.labels == ("window 6, 0 sinks", "window 4, 2 sinks") and lean.reference is None
    assert lean.sink_weight == () and math.isnan(lean.sink_uniform)
    assert lean.position_loss["window 6, 0 sinks"] == result.position_loss["window 6, 0 sinks"]
    with pytest.raises(ValueError, match="repeats the setting"):
        streaming_losses(model, ids, window=6, n_sinks_list=(2,), n_streams=2, stream_length=40,
                         extra_settings=[(6, 2)], baselines=False)
    with pytest.raises(ValueError, match="sink_far must be below"):
        streaming_losses(model, ids, window=6, n_sinks_list=(0,), n_streams=2, stream_length=40, sink_far=8)
    # a window as long as the streams: every setting is the full cache
    same = streaming_losses(model, ids, window=40, n_sinks_list=(0,), n_streams=2, stream_length=40,
                            reference_windows=0)
    for k in same.labels:
        torch.testing.assert_close(torch.tensor(same.position_loss[k]), torch.tensor(same.position_loss["full cache"]),
                                   rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="n_sinks_list must not repeat"):
        streaming_losses(model, ids, n_sinks_list=(1, 1), n_streams=2, stream_length=40)
    with pytest.raises(ValueError, match=r"at least n_streams \* stream_length \+ 1 = 401"):
        streaming_losses(model, ids, n_streams=4, stream_length=100)
    with pytest.raises(TypeError, match="model must be a selfattn.models.gpt.GPT"):
        streaming_losses(object(), ids)


def test_the_experiment_trains_chapter_08s_rope_model_and_measures_it():
    torch.manual_seed(0)
    text = torch.randint(0, 7, (3000,), generator=torch.Generator().manual_seed(1))
    small = dict(steps=3, batch_size=4, d_model=8, n_heads=2, n_layers=1, d_ff=16, eval_windows=2, train_length=16)
    result, model = streaming_experiment(text[:2000], text[2000:], 7, training=small, window=6,
                                         n_sinks_list=(0, 1), n_streams=2, stream_length=50, reference_windows=2)
    assert isinstance(model, GPT) and model.config.positions == "rope" and model.config.block_size == 16
    assert result.settings["steps"] == 3 and result.settings["train_length"] == 16
    assert result.settings["n_parameters"] == sum(p.numel() for p in model.parameters())
    assert result.labels[0] == "full cache" and len(result.position_loss["window 6, 1 sink"]) == 50
    again = compare_position_schemes(text[:2000], text[2000:], 7, schemes=("rope",), eval_lengths=(16,),
                                     progress=False, **small).models["rope"]
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)  # the very model of chapter 08's comparison
    with pytest.raises(ValueError, match="training must not set schemes"):
        streaming_experiment(text[:2000], text[2000:], 7, training=dict(schemes=("alibi",)))


# --- bad input found by the new-user probe (chapter 11) ---


def test_window_and_sinks_accept_numpy_ints():
    """SlidingWindowCache(np.int64(4)) was refused with "must be an int >= 1; got np.int64(4)"."""
    cache = SlidingWindowCache(np.int64(4), n_sinks=np.int32(1))
    assert (cache.window, cache.n_sinks, cache.capacity) == (4, 1, 5) and type(cache.window) is int
    with pytest.raises(TypeError, match="window must be an int >= 1; got 4.0"):
        SlidingWindowCache(4.0)
    with pytest.raises(TypeError, match="n_sinks must be an int >= 0; got True"):
        SlidingWindowCache(4, n_sinks=True)


def test_update_with_no_new_token_names_k_new_and_v_new():
    """T_new = 0 was reported as "T must be > 0"."""
    cache = SlidingWindowCache(4)
    with pytest.raises(ValueError, match=r"k_new and v_new must hold at least one new token .*k_new \(1, 2, 0, 3\)"):
        cache.update(torch.zeros(1, 2, 0, 3), torch.zeros(1, 2, 0, 3))


@pytest.mark.parametrize("positions", ["cache", "text"])
def test_a_rotate_of_the_wrong_shape_is_refused_and_the_cache_unchanged(positions):
    """A rotate that returned another shape gave K and V of different lengths, silently."""
    cache = SlidingWindowCache(4, positions=positions)
    k, v = torch.randn(1, 2, 1, 3), torch.randn(1, 2, 1, 3)
    K0, V0 = cache.update(k, v)
    with pytest.raises(ValueError, match=r"rotate\(x, start\) must return a tensor of the shape of x"):
        cache.update(k, v, rotate=lambda x, start: x[..., :1, :].repeat(1, 1, 4, 1)[..., :3, :])
    assert cache.n_seen == 1 and len(cache) == 1
    K1, V1 = cache.update(k, v)
    assert torch.equal(K1[:, :, :1], K0) and K1.shape[-2] == V1.shape[-2] == 2


def test_rotate_must_be_callable():
    with pytest.raises(TypeError, match="rotate must be a callable rotate"):
        SlidingWindowCache(4).update(torch.zeros(1, 2, 1, 3), torch.zeros(1, 2, 1, 3), rotate="x")


@pytest.mark.parametrize(("bad", "error"), [(-1, ValueError), (1.5, TypeError), ("a", TypeError), (True, TypeError)])
def test_slot_of_requires_an_int_position(bad, error):
    """slot_of(-1) returned -1 and slot_of(1.5) returned 1.5."""
    with pytest.raises(error, match="p must be an int >= 0"):
        SlidingWindowCache(4, n_sinks=2).slot_of(bad)
    assert SlidingWindowCache(4, n_sinks=2).slot_of(np.int64(7)) == 3
