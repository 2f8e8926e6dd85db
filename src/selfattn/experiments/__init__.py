"""Small, fast experiments that the chapters run and the chapter tests check.

``context`` (chapter 01: attention that reads only its own position removes context),
``scaling`` (chapter 02: why scores are divided by sqrt(d_head), in a simulation, a real layer at
initialisation, the trained MiniLM and a training run), ``tying`` (chapter 03: what tying
values to keys costs), ``two_lookups`` (chapter 06: two heads do two lookups one head of the same
size cannot), ``qk_norm`` (chapter 07: how large attention logits grow in training, with and
without QK-norm), ``positions`` (chapter 08: position schemes past the training length, and
RoPE's rescalings), ``retrieval`` (chapter 14: attention learns to address), ``induction``
(chapter 14: a previous-token head and induction heads in a two-layer attention-only model).
"""
