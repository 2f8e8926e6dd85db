"""From attention to causes: direct logit attribution, activation patching, circuits read from weights.

Three tools of mechanistic interpretability (Elhage et al. 2021; Olsson et al. 2022; Wang et al.
2022; ARENA 1.2), on the hook points of :mod:`selfattn.hooks`:

- :func:`logit_attribution`: a pre-norm model's logit of one token at one position split into the
  embeddings, every head, every attention output bias, every MLP and the constant biases, through
  the final layer norm with its scale *frozen* at the value of the run (as TransformerLens does):
  with the scale fixed, the norm is linear in the residual stream, so the parts sum to the logit.
- :func:`patch_residual`, :func:`patch_heads`: activation patching. Run a corrupted input with one
  activation taken from the clean run and report ``(m_patched - m_corrupt) / (m_clean - m_corrupt)``,
  the fraction of the clean metric restored: 1 when the patch carries everything that differs,
  0 when it carries nothing.
- :func:`path_ablation`: path patching of one edge kind. Mean-ablate earlier heads' outputs only in
  the stream that later heads read for their queries, keys *or* values, everything else as in the
  clean run: the test that tells Q-, K- and V-composition apart, which a corrupted token cannot.
- :func:`qk_circuit`, :func:`ov_circuit`, :func:`copying_score`, :func:`composition_scores`: a
  head's bilinear maps token -> token read from the weights alone, with no input run.

Conventions (the package's row vectors, ``x @ W``): ``W_E`` (V, D), head h's ``W_Q^h, W_K^h, W_V^h``
(D, Dh), ``W_O^h`` (Dh, D), ``W_U`` (D, V) = ``unembed.weight.T``. Source: chapter 15.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ._validate import require_tensor, shape_of
from .hooks import model_kind, run_with_cache, run_with_hooks

__all__ = [
    "Attribution",
    "logit_attribution",
    "restored_fraction",
    "patch_residual",
    "patch_heads",
    "path_ablation",
    "qk_circuit",
    "ov_circuit",
    "copying_score",
    "composition_scores",
]


@dataclass(frozen=True)
class Attribution:
    """A logit split into parts.

    Attributes:
        labels: the name of each part (``"embed"``, ``"L0H1"``, ``"L0 b_O"``, ``"L0 MLP"``,
            ``"biases"``: the final norm's bias and the read-out's bias).
        parts: (n,) float64, each part's contribution to the logit.
        logit: the model's logit (float64 of the run), which ``parts.sum()`` equals.
        heads: (L, H) float64, the heads' parts as a grid (for a figure per layer and head).
        scale: the final norm's scale ``sqrt(var + eps)`` at that position, frozen.
    """

    labels: tuple[str, ...]
    parts: torch.Tensor
    logit: float
    heads: torch.Tensor
    scale: float

    def part(self, label: str) -> float:
        return float(self.parts[self.labels.index(label)])


def _readout(model, kind):
    if kind == "gpt":
        return model.ln_f, model.lm_head
    if kind == "attn_only":
        return model.ln_f, model.unembed
    raise TypeError("logit attribution needs a language model with a read-out (a GPT or an AttentionOnly); "
                    "got an Encoder")


@torch.no_grad()
def logit_attribution(model, input_ids: torch.Tensor, token: int, *, position: int = -1, row: int = 0) -> Attribution:
    """Direct logit attribution of ``token``'s logit at ``position`` of sequence ``row``.

    The residual stream entering the final norm is a sum of what was written into it:
    ``x = embed + sum_l (sum_h result^{l,h} + b_O^l) + sum_l mlp^l``. The final layer norm
    ``LN(x) = (x - mean(x)) / scale * w + b`` is linear in ``x`` once ``scale`` is fixed at its value
    in this run (frozen, as TransformerLens's ``apply_ln_to_stack``); the logit
    ``LN(x) @ W_U[:, token] + b_U[token]`` then splits into one term per part,
    ``((c - mean(c)) / scale * w) @ W_U[:, token]``, plus the constant ``b @ W_U[:, token] + b_U[token]``
    ("biases"). The parts are exact: they sum to the logit (to float rounding). A part is *direct*:
    what it writes straight to the read-out; its effect through later heads is not in it.
    Without a final norm (an AttentionOnly with ``final_norm=False``) the scale is 1 and nothing is centred.

    Args:
        model: a GPT or an AttentionOnly, in eval mode. input_ids: (B, T) int64.
        token: the token id whose logit is split. position: the position (default the last).
        row: which sequence of the batch.

    Returns:
        An :class:`Attribution`.

    Raises:
        TypeError / ValueError: an Encoder or other model; ``token``, ``position`` or ``row`` out of
        range; and the errors of :func:`selfattn.hooks.run_with_cache`.

    Source: Elhage et al. 2021 (the residual stream as a sum; direct path); TransformerLens /
    ARENA 1.2 (direct logit attribution, frozen norm scale); chapter 15.
    """
    kind = model_kind(model)
    ln, unembed = _readout(model, kind)
    logits, cache = run_with_cache(model, input_ids)
    B, T, V = logits.shape
    for name, v, n in (("token", token, V), ("row", row, B)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            raise ValueError(f"{name} must be an int in [0, {n}); got {v!r}")
    if isinstance(position, bool) or not isinstance(position, int) or not -T <= position < T:
        raise ValueError(f"position must be an int in [-{T}, {T}); got {position!r}")
    L = model.config.n_layers
    H = model.config.n_heads
    f64 = torch.float64
    direction = unembed.weight[token].to(f64)  # (D,): the column W_U[:, token]
    has_norm = isinstance(ln, nn.LayerNorm)
    if has_norm:
        scale = cache["ln_final.hook_scale"][row, position, 0].to(f64)
        direction = direction * ln.weight.to(f64) / scale  # frozen scale: a fixed linear map
        const = float(ln.bias.to(f64) @ unembed.weight[token].to(f64) + unembed.bias[token].to(f64))
    else:
        scale = torch.tensor(1.0, dtype=f64)
        const = float(unembed.bias[token].to(f64))

    def through(c):  # (..., D) -> (...): centred (the norm's mean is linear too), then projected
        c = c.to(f64)
        if has_norm:
            c = c - c.mean(dim=-1, keepdim=True)
        return c @ direction

    labels, parts = ["embed"], [through(cache["hook_embed"][row, position])]
    heads = torch.zeros(L, H, dtype=f64)
    for layer in range(L):
        result = cache[f"blocks.{layer}.attn.hook_result"][row, :, position]  # (H, D)
        heads[layer] = through(result)
        labels += [f"L{layer}H{h}" for h in range(H)]
        parts += list(heads[layer])
        blk = model.blocks[layer] if kind == "gpt" else None
        b_O = (blk.attn.b_O if blk is not None else model.layers[layer].b_O)
        labels.append(f"L{layer} b_O")
        parts.append(through(b_O))
        if kind == "gpt":
            labels.append(f"L{layer} MLP")
            parts.append(through(cache[f"blocks.{layer}.hook_mlp_out"][row, position]))
    labels.append("biases")
    parts.append(torch.tensor(const, dtype=f64))
    return Attribution(tuple(labels), torch.stack([torch.as_tensor(p, dtype=f64) for p in parts]),
                       float(logits[row, position, token]), heads, float(scale))


def restored_fraction(patched: float, clean: float, corrupt: float) -> float:
    """``(patched - corrupt) / (clean - corrupt)``: 1 = the clean metric restored, 0 = nothing restored.

    Raises:
        ValueError: ``clean == corrupt`` (the inputs do not differ in the metric: nothing to restore),
        or a non-finite value.

    Source: activation patching (Meng et al. 2022; Wang et al. 2022); chapter 15.
    """
    vals = torch.tensor([patched, clean, corrupt], dtype=torch.float64)
    if not bool(torch.isfinite(vals).all()):
        raise ValueError(f"metric values must be finite; got patched={patched}, clean={clean}, corrupt={corrupt}")
    if clean == corrupt:
        raise ValueError(f"the clean and corrupted metrics are equal ({clean}); there is no difference to restore")
    return (patched - corrupt) / (clean - corrupt)


def _inputs(x, name):
    if isinstance(x, torch.Tensor):
        return {"input_ids": x}
    if isinstance(x, dict) and isinstance(x.get("input_ids"), torch.Tensor):
        return x
    raise TypeError(f"{name} must be an input_ids tensor (B, T) or a dict with 'input_ids' (and for the encoder "
                    f"'attention_mask', 'token_type_ids'); got {type(x).__name__}")


def _setup(model, clean, corrupt, metric):
    clean, corrupt = _inputs(clean, "clean"), _inputs(corrupt, "corrupt")
    if tuple(clean["input_ids"].shape) != tuple(corrupt["input_ids"].shape):
        raise ValueError(f"clean and corrupt inputs must have the same shape (B, T), so that positions line up; got "
                         f"{shape_of(clean['input_ids'])} and {shape_of(corrupt['input_ids'])}")
    if not callable(metric):
        raise TypeError(f"metric must be a callable(output) -> float; got {type(metric).__name__}")
    ids = clean["input_ids"]
    extra = {k: v for k, v in clean.items() if k != "input_ids"}
    _, cache = run_with_cache(model, ids, **extra)
    out_clean = run_with_hooks(model, ids, {}, **extra)  # the same code path as every patched run
    out_corrupt = run_with_hooks(model, corrupt["input_ids"], {},
                                 **{k: v for k, v in corrupt.items() if k != "input_ids"})
    m_clean, m_corrupt = float(metric(out_clean)), float(metric(out_corrupt))
    restored_fraction(m_clean, m_clean, m_corrupt)  # checks that there is a difference to restore

    def run(hooks):
        out = run_with_hooks(model, corrupt["input_ids"], hooks,
                             **{k: v for k, v in corrupt.items() if k != "input_ids"})
        return restored_fraction(float(metric(out)), m_clean, m_corrupt)

    return cache, run, m_clean, m_corrupt


@torch.no_grad()
def patch_residual(model, clean, corrupt, metric: Callable[[torch.Tensor], float], *, positions=None) -> torch.Tensor:
    """Restored fraction of the clean metric when the residual stream at (layer, position) is patched.

    Row ``l`` (0 .. L-1) patches ``blocks.{l}.hook_resid_pre`` at one position, row ``L`` the stream
    after the last block (``blocks.{L-1}.hook_resid_post``): the corrupted run continues from the
    clean vector there. ``positions=None`` patches one position per column; ``positions="all"``
    patches every position at once (one column): the whole clean stream, which restores exactly 1.

    Args:
        model: a GPT, an AttentionOnly or an Encoder (eval mode). clean, corrupt: input_ids (B, T),
            or dicts of the model's inputs (the encoder's ``attention_mask``...), of the same shape.
        metric: ``metric(output) -> float`` (e.g. a logit difference, a cosine similarity).

    Returns:
        (L + 1, T) float64, or (L + 1, 1) with ``positions="all"``.

    Raises:
        TypeError / ValueError: inputs of different shapes, a metric that is not callable or equal
        on both inputs, ``positions`` not None or "all".

    Source: Meng et al. 2022; Wang et al. 2022; ARENA 1.2 (activation patching); chapter 15.
    """
    if positions not in (None, "all"):
        raise ValueError(f"positions must be None (one at a time) or 'all'; got {positions!r}")
    cache, run, *_ = _setup(model, clean, corrupt, metric)
    L = model.config.n_layers
    T = _inputs(clean, "clean")["input_ids"].shape[1]
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    columns = [slice(None)] if positions == "all" else [slice(t, t + 1) for t in range(T)]
    out = torch.zeros(len(names), len(columns), dtype=torch.float64)
    for i, name in enumerate(names):
        for j, cols in enumerate(columns):
            def hook(x, n, cols=cols, name=name):
                x = x.clone()
                x[:, cols] = cache[name][:, cols]
                return x
            out[i, j] = run({name: hook})
    return out


@torch.no_grad()
def patch_heads(model, clean, corrupt, metric: Callable[[torch.Tensor], float], *, heads=None,
                positions=None) -> torch.Tensor:
    """Restored fraction when one head's output (``attn.hook_z``) is patched, at every position or some.

    ``heads=None``: each head alone -> (L, H). ``heads`` a list of (layer, head) pairs: all of them
    patched together -> a (1, 1) tensor (an empty list patches nothing: exactly 0).
    ``positions=None`` patches every position; a sequence of ints patches only those positions
    (e.g. every position but the changed token's, to see what a head moves to the others).

    Raises:
        as :func:`patch_residual`; ValueError for a (layer, head) out of range, or ``positions``
        not a non-empty sequence of distinct ints in [0, T).

    Source: Wang et al. 2022 (patching head outputs); ARENA 1.2; chapter 15.
    """
    cache, run, *_ = _setup(model, clean, corrupt, metric)
    L, H = model.config.n_layers, model.config.n_heads
    T = _inputs(clean, "clean")["input_ids"].shape[1]
    if positions is None:
        cols = slice(None)
    else:
        if isinstance(positions, (str, bytes)) or not hasattr(positions, "__len__") or len(positions) == 0:
            raise ValueError(f"positions must be None or a non-empty sequence of ints in [0, {T}); got {positions!r}")
        for t in positions:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < T:
                raise ValueError(f"positions must hold ints in [0, {T}); got {t!r}")
        if len(set(int(t) for t in positions)) != len(positions):
            raise ValueError(f"positions must not repeat a position; got {list(positions)}")
        cols = torch.tensor([int(t) for t in positions])

    def hooks_for(pairs):
        by_layer: dict[int, list[int]] = {}
        for layer, h in pairs:
            if not (0 <= layer < L and 0 <= h < H):
                raise ValueError(f"heads must be (layer, head) pairs in [0, {L}) x [0, {H}); got {(layer, h)}")
            by_layer.setdefault(layer, []).append(h)
        hooks = {}
        for layer, hs in by_layer.items():
            name = f"blocks.{layer}.attn.hook_z"

            def hook(x, n, hs=hs, name=name):
                x = x.clone()
                for h in hs:  # (B, T, Dh) of head h, at the patched positions
                    x[:, h, cols] = cache[name][:, h, cols]
                return x
            hooks[name] = hook
        return hooks

    if heads is not None:
        return torch.tensor([[run(hooks_for([(int(a), int(b)) for a, b in heads]))]], dtype=torch.float64)
    out = torch.zeros(L, H, dtype=torch.float64)
    for layer in range(L):
        for h in range(H):
            out[layer, h] = run(hooks_for([(layer, h)]))
    return out


INTO = {"queries": "hook_q", "keys": "hook_k", "values": "hook_v"}


@torch.no_grad()
def path_ablation(model, input_ids: torch.Tensor, metric: Callable[[torch.Tensor], float], *, senders, receivers,
                  into: str | None) -> float:
    """The metric when the senders' outputs are mean-ablated only where the receivers read them.

    Path patching (Wang et al. 2022, section 3; Goldowsky-Dill et al. 2023) of one kind of edge, on the
    clean ``input_ids`` alone. Each sender head's output (``blocks.{l}.attn.hook_z``) is replaced by its
    mean over the batch at each position (what the head writes on average, none of what it writes for
    this sequence). ``into="queries"``, ``"keys"`` or ``"values"``: the replacement reaches only that
    input of the receiver heads (their ``hook_q``, ``hook_k`` or ``hook_v``, taken from a run with the
    senders ablated); every other activation, the receivers' other two inputs and the senders' direct
    path to the logits included, is the clean run's. ``into=None`` ablates the senders everywhere (all
    paths at once), the reference for the three.

    So the three answer three different questions: does the receiver need what the senders wrote to
    form its queries (Q-composition), its keys (K-composition), or the values it reads (V-composition)?

    Args:
        model: an AttentionOnly or a GPT (eval mode). input_ids: (B, T) int64, B >= 2 (a mean over one
            sequence would be that sequence).
        metric: output (B, T, V) -> float.
        senders, receivers: non-empty lists of (layer, head); every sender's layer below every
            receiver's, all receivers in one layer. With layers between them, the receivers' inputs
            also carry what those layers computed from the ablated stream (then it is not one edge).
        into: ``"queries"``, ``"keys"``, ``"values"`` or ``None``.

    Returns: the metric (float) of the run so patched.

    Raises:
        ValueError: ``into`` not one of those; empty or out-of-range heads; receivers in several layers
        or not after every sender; B < 2. TypeError: as :func:`selfattn.hooks.run_with_hooks`.

    Source: Wang et al. 2022 (path patching); Elhage et al. 2021 (Q-, K-, V-composition); chapter 15.
    """
    if into is not None and into not in INTO:
        raise ValueError(f"into must be one of {sorted(INTO)} or None (every path); got {into!r}")
    require_tensor("input_ids", input_ids)
    if input_ids.dim() != 2 or input_ids.shape[0] < 2:
        raise ValueError(f"input_ids must be (B, T) with B >= 2 (the mean is over the batch); got {shape_of(input_ids)}")
    if not callable(metric):
        raise TypeError(f"metric must be a callable(output) -> float; got {type(metric).__name__}")
    L, H = model.config.n_layers, model.config.n_heads
    pairs = {}
    for role, heads in (("senders", senders), ("receivers", receivers)):
        heads = [(int(a), int(b)) for a, b in heads] if heads is not None else []
        if not heads:
            raise ValueError(f"{role} must be a non-empty list of (layer, head) pairs")
        for layer, h in heads:
            if not (0 <= layer < L and 0 <= h < H):
                raise ValueError(f"{role} must be (layer, head) pairs in [0, {L}) x [0, {H}); got {(layer, h)}")
        pairs[role] = heads
    r_layers = {layer for layer, _ in pairs["receivers"]}
    if len(r_layers) != 1:
        raise ValueError(f"receivers must all be in one layer; got layers {sorted(r_layers)}")
    r_layer = r_layers.pop()
    if max(layer for layer, _ in pairs["senders"]) >= r_layer:
        raise ValueError(f"every sender must be in a layer below the receivers' ({r_layer}); got {pairs['senders']}")

    _, cache = run_with_cache(model, input_ids, names=[f"blocks.{layer}.attn.hook_z" for layer, _ in pairs["senders"]])
    ablate = {}
    for layer in sorted({layer for layer, _ in pairs["senders"]}):
        name = f"blocks.{layer}.attn.hook_z"
        hs = [h for s_layer, h in pairs["senders"] if s_layer == layer]
        batch_mean = cache[name].mean(dim=0, keepdim=True)  # (1, H, T, Dh): what each head writes on average

        def hook(x, n, hs=hs, mean=batch_mean):
            x = x.clone()
            x[:, hs] = mean[:, hs].expand(x.shape[0], -1, -1, -1)
            return x
        ablate[name] = hook
    if into is None:
        return float(metric(run_with_hooks(model, input_ids, ablate)))
    point = f"blocks.{r_layer}.attn.{INTO[into]}"
    _, ablated = run_with_cache(model, input_ids, names=[point], hooks=ablate)  # the receivers' input, senders ablated
    r_heads = [h for _, h in pairs["receivers"]]

    def patch(x, n):
        x = x.clone()
        x[:, r_heads] = ablated[point][:, r_heads]
        return x
    return float(metric(run_with_hooks(model, input_ids, {point: patch})))


def _require_attn_only(model):
    from .experiments.induction import AttentionOnly

    if not isinstance(model, AttentionOnly):
        raise TypeError(f"model must be an AttentionOnly (the circuits are read from its weights); got "
                        f"{type(model).__name__}")


def _check_head(model, layer, head):
    L, H = model.config.n_layers, model.config.n_heads
    for name, v, n in (("layer", layer, L), ("head", head, H)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            raise ValueError(f"{name} must be an int in [0, {n}); got {v!r}")


@torch.no_grad()
def qk_circuit(model, layer: int, head: int, *, offset: int = 0) -> torch.Tensor:
    """The full QK circuit ``W_E W_Q^h R_offset W_K^h^T W_E^T`` (V, V) of head ``head`` of ``layer``.

    Entry [i, j] is the score (before the 1/sqrt(Dh) scale, biases left out) a query holding token
    i gives a key holding token j when both read the token embeddings directly, with the key
    ``offset`` positions behind the query (RoPE's rotation ``R_offset``; the identity in a layer
    without RoPE). Meaningful for layer 0, whose input is the embedding; a later head's keys read
    what earlier heads wrote (see :func:`composition_scores`).

    Raises:
        TypeError / ValueError: not an AttentionOnly; layer or head out of range.

    Source: Elhage et al. 2021 (QK circuit); chapter 15.
    """
    from .experiments.induction import _head_matrices

    _require_attn_only(model)
    _check_head(model, layer, head)
    W_E = model.token_embedding.weight  # (V, D)
    W_QK = _head_matrices(model, layer, offset)[0][head]  # (D, D)
    return (W_E @ W_QK @ W_E.T).double()  # (V, V)


@torch.no_grad()
def ov_circuit(model, layer: int, head: int) -> torch.Tensor:
    """The full OV circuit ``W_E W_V^h W_O^h P diag(w) W_U`` (V, V) of a head.

    Row i is what the head adds to the logits when it attends with weight 1 to a position holding
    token i and the stream there is that token's embedding (biases left out). ``P = I - 11^T / D``
    and ``diag(w)`` are the final layer norm's centring and weight, its scale taken as 1 (a common
    factor of a row: it changes no sign and no eigenvalue's sign); without a final norm both are
    the identity.

    Raises:
        TypeError / ValueError: not an AttentionOnly; layer or head out of range.

    Source: Elhage et al. 2021 (OV circuit); chapter 15.
    """
    from .experiments.induction import _head_matrices

    _require_attn_only(model)
    _check_head(model, layer, head)
    W_E = model.token_embedding.weight.double()  # (V, D)
    W_OV = _head_matrices(model, layer)[1][head].double()  # (D, D)
    W_U = model.unembed.weight.T.double()  # (D, V)
    if isinstance(model.ln_f, nn.LayerNorm):
        D = W_U.shape[0]
        P = torch.eye(D, dtype=torch.float64) - 1.0 / D
        W_U = P @ (model.ln_f.weight.double()[:, None] * W_U)
    return W_E @ W_OV @ W_U  # (V, V)


def copying_score(circuit: torch.Tensor) -> float:
    """Elhage et al. 2021's summary of an OV circuit's eigenvalues: ``sum(lambda) / sum(|lambda|)``.

    The paper's measure of "mostly positive eigenvalues" (their Figure on copying heads): the real
    part of the sum of the eigenvalues over the sum of their moduli, in [-1, 1]. It is 1 when every
    nonzero eigenvalue is positive real (the identity: a pure copier), -1 when every one is negative
    real, and near 0 for a rotation (eigenvalues in conjugate pairs on the imaginary axis). It is
    not the *count* of positive eigenvalues: large eigenvalues weigh more, and the zero eigenvalues
    of a low-rank circuit count for nothing.

    Args:
        circuit: (V, V) square float tensor, e.g. :func:`ov_circuit`.

    Returns:
        float in [-1, 1].

    Raises:
        TypeError / ValueError: not a square 2-D float tensor; non-finite entries; the zero matrix.

    Source: Elhage et al. 2021, "Copying" (detecting copying heads from OV eigenvalues); chapter 15.
    """
    require_tensor("circuit", circuit)
    if circuit.ndim != 2 or circuit.shape[0] != circuit.shape[1] or not circuit.dtype.is_floating_point:
        raise ValueError(f"circuit must be a square (V, V) float matrix; got shape {shape_of(circuit)}, "
                         f"dtype {circuit.dtype}")
    if not bool(torch.isfinite(circuit).all()):
        raise ValueError("circuit holds NaN or inf")
    lam = torch.linalg.eigvals(circuit.double())  # (V,) complex
    total = float(lam.abs().sum())
    if total == 0.0:
        raise ValueError("circuit is the zero matrix: its eigenvalues say nothing")
    return float(lam.sum().real) / total


@torch.no_grad()
def composition_scores(model, earlier: int = 0, later: int = 1) -> dict[str, torch.Tensor]:
    """Elhage et al. 2021's Frobenius-norm composition scores (K, Q, V) between two layers' heads.

    ``||W_QK^h2 (W_OV^h1)^T||_F / (||W_QK^h2||_F ||W_OV^h1||_F)`` for K-composition (and the Q and V
    analogues), averaged over RoPE offsets: :func:`selfattn.experiments.induction.composition_scores`.
    Compare with :func:`selfattn.experiments.induction.composition_baseline`.

    Returns:
        ``{"keys", "queries", "values"}``, each (H, H) indexed [h1, h2].

    Source: Elhage et al. 2021, "Composition scores"; chapter 15.
    """
    from .experiments.induction import composition_scores as scores

    _require_attn_only(model)
    return scores(model, earlier, later)
