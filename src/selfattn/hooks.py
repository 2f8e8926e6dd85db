"""Named hook points: read and replace any activation of the course's models, by name.

A *hooked run* is the eval-mode forward of a model written once more with a named point at every
activation an interpretability method reads: the residual stream before and after each block, each
head's queries, keys, values, attention pattern and output, each branch's output, the final norm's
scale. The names follow TransformerLens (Nanda & Bloom 2022) so that a reader can move on to it:

=====================================  ==================  =====================================================
name                                   shape               what it is
=====================================  ==================  =====================================================
``hook_embed``                         (B, T, D)           what enters block 0 (token embedding, plus absolute
                                                           positions and, in the encoder, its layer norm)
``blocks.{l}.hook_resid_pre``          (B, T, D)           the residual stream entering block l
``blocks.{l}.attn.hook_q`` / ``_k``    (B, H, T, Dh)       queries / keys of every head (after RoPE)
``blocks.{l}.attn.hook_v``             (B, H, T, Dh)       values
``blocks.{l}.attn.hook_pattern``       (B, H, T, S)        attention weights (rows sum to 1)
``blocks.{l}.attn.hook_z``             (B, H, T, Dh)       each head's context ``pattern @ V``
``blocks.{l}.attn.hook_result``        (B, H, T, D)        each head's write ``z^h @ W_O^h`` (b_O not included)
``blocks.{l}.hook_attn_out``           (B, T, D)           the attention branch's output (heads summed + b_O)
``blocks.{l}.hook_resid_mid``          (B, T, D)           between attention and MLP (models with an MLP)
``blocks.{l}.hook_mlp_out``            (B, T, D)           the feed-forward branch's output
``blocks.{l}.hook_resid_post``         (B, T, D)           the residual stream leaving block l
``ln_final.hook_scale``                (B, T, 1)           the final layer norm's ``sqrt(var + eps)``
``ln_final.hook_normalized``           (B, T, D)           ``(x - mean) / scale``, before its weight and bias
=====================================  ==================  =====================================================

One difference from TransformerLens: per-head tensors keep the course's head-major order
(B, H, T, Dh), where TransformerLens stores (B, T, H, Dh). The encoder (post-norm, BERT) has no
``ln_final``; its ``hook_resid_mid`` and ``hook_resid_post`` are the outputs of the block's two
layer norms.

A hook is a callable ``hook(activation, name)`` that returns None (read only) or a tensor of the
same shape that replaces the activation for everything downstream (a patch).
:func:`run_with_cache` records activations, :func:`run_with_hooks` applies hooks. Both are separate
code: :class:`~selfattn.models.gpt.GPT`'s own forward and its decode path are untouched, so the
hooks cost nothing when unused; a hooked run with no hooks gives the model's own output (tested to
1e-6 in float32).

Supported: :class:`~selfattn.models.gpt.GPT` (causal, full sequence, no cache),
:class:`~selfattn.experiments.induction.AttentionOnly` and :class:`~selfattn.encoder.Encoder`
(e.g. ``selfattn.pretrained.MiniLM().encoder``). The output is the logits (B, T, V) for the two
language models and the last hidden state (B, T, D) for the encoder.

Source: chapter 15; names after TransformerLens's ``HookPoint`` (Nanda & Bloom 2022) and ARENA 1.2.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ._validate import require_rank, require_tensor, shape_of
from .attention import scaled_dot_product_attention
from .masks import causal_mask, from_hf_attention_mask

__all__ = ["hook_names", "run_with_cache", "run_with_hooks", "model_kind"]

_ATTN = ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z", "hook_result")


def model_kind(model) -> str:
    """``"gpt"``, ``"attn_only"`` or ``"encoder"``; TypeError for any other model."""
    from .encoder import Encoder
    from .experiments.induction import AttentionOnly
    from .models.gpt import GPT

    if isinstance(model, GPT):
        return "gpt"
    if isinstance(model, AttentionOnly):
        return "attn_only"
    if isinstance(model, Encoder):
        return "encoder"
    raise TypeError(f"model must be a GPT, an AttentionOnly or an Encoder; got {type(model).__name__}")


def hook_names(model) -> list[str]:
    """Every hook point of ``model``, in the order the forward reaches them.

    Raises:
        TypeError: an unsupported model.
    """
    kind = model_kind(model)
    names = ["hook_embed"]
    for layer in range(model.config.n_layers):
        b = f"blocks.{layer}."
        names.append(b + "hook_resid_pre")
        names += [b + "attn." + n for n in _ATTN]
        names.append(b + "hook_attn_out")
        if kind != "attn_only":
            names += [b + "hook_resid_mid", b + "hook_mlp_out"]
        names.append(b + "hook_resid_post")
    if kind == "gpt" or (kind == "attn_only" and isinstance(model.ln_f, nn.LayerNorm)):
        names += ["ln_final.hook_scale", "ln_final.hook_normalized"]
    return names


class _Points:
    """Applies the hooks and fills the cache at each named point."""

    def __init__(self, model, hooks: dict, cache: dict | None, names):
        known = set(hook_names(model))
        if not isinstance(hooks, dict):
            raise TypeError(f"hooks must be a dict {{name: callable}}; got {type(hooks).__name__}")
        for name, fn in hooks.items():
            if name not in known:
                raise ValueError(f"unknown hook point {name!r}; the points are selfattn.hooks.hook_names(model)")
            if not callable(fn):
                raise TypeError(f"hooks[{name!r}] must be a callable(activation, name); got {type(fn).__name__}")
        if names is not None:
            names = set(names)
            bad = sorted(names - known)
            if bad:
                raise ValueError(f"unknown hook points in names: {bad}")
        self.hooks, self.cache, self.names = hooks, cache, names

    def wants(self, name: str) -> bool:
        return name in self.hooks or (self.cache is not None and (self.names is None or name in self.names))

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:
        fn = self.hooks.get(name)
        if fn is not None:
            y = fn(x, name)
            if y is not None:
                if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(x.shape):
                    raise ValueError(f"the hook at {name!r} must return None or a tensor of shape {shape_of(x)}; "
                                     f"got {shape_of(y) if isinstance(y, torch.Tensor) else type(y).__name__}")
                x = y.to(x.dtype)
        if self.cache is not None and (self.names is None or name in self.names):
            self.cache[name] = x.detach()
        return x


def _attention(p: _Points, layer: int, attn, h, keep, bias, rotate):
    """One attention branch with its hook points: input h (B, T, D) -> (B, T, D)."""
    B, T, D = h.shape
    H = attn.config.n_heads
    Dh = D // H
    a = f"blocks.{layer}.attn."
    Q = (h @ attn.W_Q + attn.b_Q).view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh)
    K = (h @ attn.W_K + attn.b_K).view(B, T, H, Dh).transpose(1, 2)
    V = (h @ attn.W_V + attn.b_V).view(B, T, H, Dh).transpose(1, 2)
    if rotate is not None:  # RoPE at positions 0 .. T-1
        Q, K = rotate(Q, 0), rotate(K, 0)
    Q, K, V = p(a + "hook_q", Q), p(a + "hook_k", K), p(a + "hook_v", V)
    _, weights = scaled_dot_product_attention(Q, K, V, keep, bias=bias, return_weights=True)  # (B, H, T, S)
    weights = p(a + "hook_pattern", weights)
    z = p(a + "hook_z", weights @ V)  # (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh)
    out = z.transpose(1, 2).reshape(B, T, D) @ attn.W_O + attn.b_O  # (B, T, D)
    if p.wants(a + "hook_result"):  # computed only when asked for; recorded or hooked
        result = torch.einsum("bhtd,hde->bhte", z, attn.W_O.view(H, Dh, D))  # (B, H, T, D)
        if a + "hook_result" in p.hooks:  # a replacement: the branch's output is rebuilt from it
            out = p(a + "hook_result", result).sum(dim=1) + attn.b_O
        else:  # recorded only: the output keeps the one product above, bit for bit the unhooked run's
            p(a + "hook_result", result)
    return p(f"blocks.{layer}.hook_attn_out", out)


def _final_norm(p: _Points, ln: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """``ln(x)`` written out, with its scale and normalized stream as hook points."""
    centred = x - x.mean(dim=-1, keepdim=True)  # (B, T, D)
    scale = p("ln_final.hook_scale", (centred.pow(2).mean(dim=-1, keepdim=True) + ln.eps).sqrt())  # (B, T, 1)
    normalized = p("ln_final.hook_normalized", centred / scale)
    return normalized * ln.weight + ln.bias


def _forward(model, input_ids, p: _Points, attention_mask=None, token_type_ids=None):
    kind = model_kind(model)
    if model.training:
        raise ValueError("a hooked run is the eval-mode forward (no dropout); call model.eval() first")
    require_tensor("input_ids", input_ids)
    require_rank("input_ids", input_ids, 2, "(B, T)")
    if kind == "encoder":
        if attention_mask is not None:
            # the encoder's own checks (shape, 0/1), then the keys-only mask it builds
            require_tensor("attention_mask", attention_mask)
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"attention_mask must have the shape of input_ids {shape_of(input_ids)}; "
                                 f"got {shape_of(attention_mask)}")
            keep = from_hf_attention_mask(attention_mask)  # (B, 1, 1, T)
        else:
            keep = None
        x = p("hook_embed", model.embeddings(input_ids, token_type_ids))  # (B, T, D)
        for layer, block in enumerate(model.blocks):
            b = f"blocks.{layer}."
            x = p(b + "hook_resid_pre", x)
            attn_out = _attention(p, layer, block.attn, x, keep, None, None)
            x = p(b + "hook_resid_mid", block.ln1(x + attn_out))
            mlp_out = p(b + "hook_mlp_out", block.ffn(x))
            x = p(b + "hook_resid_post", block.ln2(x + mlp_out))
        return x  # (B, T, D): the last hidden state
    if attention_mask is not None or token_type_ids is not None:
        raise ValueError("attention_mask and token_type_ids are for the encoder; a hooked GPT or AttentionOnly "
                         "run takes one unpadded batch")
    T = input_ids.shape[1]
    keep = causal_mask(T, device=input_ids.device)  # (T, T)
    if kind == "gpt":
        model._check_shape(input_ids)
        model._check_ids(input_ids, 0)
        scheme = model.positions
        x = scheme.add_absolute(model.token_embedding(input_ids), 0)  # (B, T, D)
        bias = scheme.score_bias(T, T, 0, dtype=x.dtype, device=x.device)  # (H, T, T) or None
        x = p("hook_embed", x)
        for layer, block in enumerate(model.blocks):
            b = f"blocks.{layer}."
            x = p(b + "hook_resid_pre", x)
            x = p(b + "hook_resid_mid", x + _attention(p, layer, block.attn, block.ln1(x), keep, bias, scheme.rotate))
            x = p(b + "hook_resid_post", x + p(b + "hook_mlp_out", block.ffn(block.ln2(x))))
        return model.lm_head(_final_norm(p, model.ln_f, x))  # (B, T, V)
    # AttentionOnly: no MLP, no norm inside the blocks; RoPE in the first rope_layers layers
    x = p("hook_embed", model.embed(input_ids))
    for layer, attn in enumerate(model.layers):
        b = f"blocks.{layer}."
        x = p(b + "hook_resid_pre", x)
        rotate = model.rope.rotate if layer < model.config.rope_layers else None
        x = p(b + "hook_resid_post", x + _attention(p, layer, attn, x, keep, None, rotate))
    if isinstance(model.ln_f, nn.LayerNorm):
        x = _final_norm(p, model.ln_f, x)
    return model.unembed(x)  # (B, T, V)


@torch.no_grad()
def run_with_cache(model, input_ids: torch.Tensor, *, names=None, hooks: dict | None = None,
                   attention_mask=None, token_type_ids=None):
    """Run ``model`` (in eval mode) and record the activations at its hook points.

    Args:
        model: a GPT, an AttentionOnly or an Encoder. input_ids: (B, T) int64.
        names: the points to record (default: all of :func:`hook_names`).
        hooks: optional ``{name: hook}`` applied during the same run (a patched run's cache).
        attention_mask, token_type_ids: the encoder's (B, T) inputs (Hugging Face convention).

    Returns:
        (output, cache): logits (B, T, V), or the encoder's last hidden state (B, T, D); and a dict
        ``{name: tensor}`` with the shapes of the table in the module's docstring (detached).

    Raises:
        TypeError / ValueError: an unsupported model, a model in training mode, bad ids, an
        unknown name, a hook that returns a tensor of another shape.

    Source: chapter 15 (TransformerLens's ``run_with_cache``).
    """
    cache: dict[str, torch.Tensor] = {}
    p = _Points(model, {} if hooks is None else hooks, cache, names)
    out = _forward(model, input_ids, p, attention_mask, token_type_ids)
    return out, cache


@torch.no_grad()
def run_with_hooks(model, input_ids: torch.Tensor, hooks: dict[str, Callable], *, attention_mask=None,
                   token_type_ids=None) -> torch.Tensor:
    """Run ``model`` with ``hooks`` ``{name: hook(activation, name) -> None | tensor}`` applied.

    A hook that returns a tensor replaces the activation (same shape) for everything after it.

    Returns:
        logits (B, T, V), or the encoder's last hidden state (B, T, D).

    Raises:
        as :func:`run_with_cache`.

    Source: chapter 15 (TransformerLens's ``run_with_hooks``).
    """
    return _forward(model, input_ids, _Points(model, hooks, None, None), attention_mask, token_type_ids)
