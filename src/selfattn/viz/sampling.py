"""Figure for chapter 11's sampling section: which next tokens greedy, top-k and top-p keep.

:func:`next_token_figure` draws a model's next-token probabilities, most probable first, as bars; a
button per rule (greedy, top-k, top-p, all) colours the tokens the rule keeps and shows their
renormalised probabilities, so a reader of the book compares the rules with no kernel. What each
rule keeps comes from :func:`selfattn.sampling.filter_logits`, the function ``GPT.generate`` uses.

Source: chapter 11.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import torch

from ..sampling import filter_logits
from . import describe

__all__ = ["next_token_figure", "kept_tokens"]

_KEPT, _DROPPED = "#0072B2", "#BBBBBB"


def kept_tokens(logits: torch.Tensor, rule: dict) -> np.ndarray:
    """Boolean (V,): the tokens ``rule`` keeps for one row of ``logits`` (V,).

    ``rule`` is ``{"greedy": True}``, ``{"top_k": k}``, ``{"top_p": p}`` or ``{}`` (all tokens).

    Raises:
        TypeError / ValueError: ``logits`` not a 1-D floating tensor; a bad ``top_k`` / ``top_p`` (as
        :func:`selfattn.sampling.filter_logits`); an unknown key in ``rule``.
    """
    if not isinstance(logits, torch.Tensor) or logits.ndim != 1:
        raise TypeError(f"logits must be a 1-D tensor (V,); got {getattr(logits, 'shape', type(logits).__name__)}")
    unknown = set(rule) - {"greedy", "top_k", "top_p"}
    if unknown:
        raise ValueError(f"rule keys must be greedy, top_k or top_p; got {sorted(unknown)}")
    if rule.get("greedy"):
        return (logits == logits.max()).numpy()
    filtered = filter_logits(logits[None], top_k=rule.get("top_k"), top_p=rule.get("top_p"))[0]
    return torch.isfinite(filtered).numpy()


def next_token_figure(logits: torch.Tensor, labels: Sequence[str], *, top_k: int = 5, top_p: float = 0.9,
                      n_shown: int = 20, context: str = "") -> go.Figure:
    """Bars of the ``n_shown`` most probable next tokens, with a button per sampling rule.

    Args:
        logits: (V,) the last position's logits (any float dtype). labels: V strings, the tokens.
        top_k, top_p: the settings the buttons show. n_shown: bars drawn (the rest are summed in the
            title). context: the prompt, for the title.

    Returns:
        A figure whose bars (trace 0) hold ``softmax(logits)`` sorted, most probable first; each button
        recolours the bars and sets their text to the kept tokens' renormalised probabilities.

    Raises:
        TypeError / ValueError: bad ``logits`` or rule settings (see :func:`kept_tokens`), or
        ``labels`` not V strings.
    """
    if not isinstance(logits, torch.Tensor) or logits.ndim != 1 or not logits.dtype.is_floating_point:
        raise TypeError(f"logits must be a 1-D floating tensor (V,); got {getattr(logits, 'shape', type(logits).__name__)}")
    if len(labels) != logits.shape[0] or not all(isinstance(s, str) for s in labels):
        raise ValueError(f"labels must be {logits.shape[0]} strings (one per token); got {len(labels)}")
    logits = logits.detach().double().cpu()
    probs = torch.softmax(logits, dim=-1).numpy()  # (V,)
    order = np.argsort(-probs, kind="stable")[:n_shown]
    shown = [repr(labels[i])[1:-1].replace(" ", "␣") for i in order]
    rules = {"all tokens (temperature 1)": {}, "greedy": {"greedy": True}, f"top-k, k = {top_k}": {"top_k": top_k},
             f"top-p, p = {top_p}": {"top_p": top_p}}
    views = {}
    for name, rule in rules.items():
        keep = kept_tokens(logits, rule)
        renorm = np.where(keep, probs, 0.0) / probs[keep].sum()
        views[name] = ([_KEPT if keep[i] else _DROPPED for i in order],
                       [f"{renorm[i]:.2f}" if keep[i] else "" for i in order], int(keep.sum()), float(probs[keep].sum()))
    first = next(iter(views.values()))
    fig = go.Figure(go.Bar(x=shown, y=probs[order], marker_color=first[0], text=first[1], textposition="outside",
                           hovertemplate="token %{x}<br>probability %{y:.3f}<extra></extra>"))

    def title(name: str) -> str:
        _, _, n_kept, mass = views[name]
        return f"{name}: {n_kept} token(s) kept, holding {mass:.1%} of the probability" + (f" after {context!r}" if context else "")

    buttons = [{"label": name, "method": "update",
                "args": [{"marker.color": [views[name][0]], "text": [views[name][1]]}, {"title.text": title(name)}]}
               for name in views]
    fig.update_layout(title=title(next(iter(views))), xaxis_title="next token (most probable first; ␣ is a space)",
                      yaxis_title="probability under softmax(logits)", height=420, margin={"t": 110},
                      updatemenus=[{"type": "buttons", "direction": "right", "buttons": buttons, "x": 0, "y": 1.18,
                                    "xanchor": "left", "showactive": True}])
    top = ", ".join(f"{s} {probs[i]:.2f}" for s, i in zip(shown[:5], order[:5], strict=True))
    return describe(fig, f"Bar chart of the {len(order)} most probable next tokens (most probable first: {top}); "
                    "buttons colour the tokens kept by greedy decoding, top-k and top-p, and label them with "
                    "their renormalised probabilities.")
