"""The attention-only transformer of chapters 14 and 15, under ``selfattn.models``.

:class:`~selfattn.experiments.induction.AttentionOnly` (token embedding, attention layers with RoPE,
no MLP, no norm inside the blocks, a linear read-out) lives with its task in
:mod:`selfattn.experiments.induction`; this module names it among the models. Chapter 15 uses it with
``InductionConfig(final_norm=True)``: a final layer norm before the read-out, as in the attention-only
models of Elhage et al. 2021 and TransformerLens, so that its logits can be split through that norm
(:func:`selfattn.circuits.logit_attribution`). Its hook points: :mod:`selfattn.hooks`.

Source: Elhage et al. 2021; chapters 14 and 15.
"""

from ..experiments.induction import AttentionOnly, InductionConfig, train_induction

__all__ = ["AttentionOnly", "InductionConfig", "train_induction"]
