"""The capstone decoder-only model: chapter 04's next-token model, causal by construction, with a
key/value cache for generation, a training loop with validation, and sampling.

:class:`GPT` has the parts of :class:`~selfattn.models.tiny_lm.TinyLM` (token embedding plus learned
position embedding, pre-norm :class:`~selfattn.block.TransformerBlock` layers, a final layer norm, a
linear read-out) and the same parameter names, so a state dict moves between them. What it adds:
the causal mask is applied inside :meth:`GPT.forward` (a decoder never reads the future), the
attention weights of every layer can be returned, and :meth:`GPT.generate` decodes with or without
a :class:`~selfattn.efficient.KVCache` per layer, giving the same tokens either way.

Introduced in chapter 12 (Radford et al. 2018's decoder-only layout, with pre-norm blocks).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .._validate import require_flag, require_positive_int, require_rank, require_tensor, shape_of
from ..attention import scaled_dot_product_attention
from ..block import TransformerBlock
from ..data import random_windows
from ..efficient import KVCache
from ..masks import causal_mask
from ..multihead import merge_heads, split_heads
from .tiny_lm import TinyLM, TinyLMConfig, next_token_loss

__all__ = [
    "GPTConfig",
    "GPT",
    "TrainingLog",
    "train_lm",
    "evaluate_loss",
    "unigram_cross_entropy",
]

#: The GPT's sizes are chapter 04's: vocabulary, block size (longest input), d_model, n_heads,
#: n_layers, d_ff. One config class for both models, so their checkpoints are interchangeable.
GPTConfig = TinyLMConfig


class GPT(TinyLM):
    """Decoder-only Transformer: ``logits = W_out(LN(blocks(E[ids] + P[start:start+T], causal)))``.

    Args:
        config: a :class:`GPTConfig` (= :class:`~selfattn.models.tiny_lm.TinyLMConfig`).

    Shapes:
        forward(input_ids (B, T) int64) -> logits (B, T, V) float; with ``return_weights=True``
        also a tuple of n_layers attention weights (B, H, T, T). ``logits[b, t]`` scores the token
        that follows ``input_ids[b, t]`` and depends only on ``input_ids[b, :t + 1]``.

    Raises:
        TypeError / ValueError: ``input_ids`` not a (B, T) integer tensor with ids in [0, V), or
        T > block_size.

    Source: Radford et al. 2018 (decoder-only); Vaswani et al. 2017 section 3.2.3 (causal mask);
    chapter 12.
    """

    def _embed(self, input_ids: torch.Tensor, start: int) -> torch.Tensor:
        require_tensor("input_ids", input_ids)
        require_rank("input_ids", input_ids, 2, "(B, T)")
        T = input_ids.shape[1]
        if T == 0:
            raise ValueError(f"input_ids must hold at least one token (T > 0); got shape {shape_of(input_ids)}")
        if start + T > self.config.block_size:
            raise ValueError(
                f"positions {start}..{start + T - 1} exceed block_size={self.config.block_size}; "
                f"got input_ids of shape {shape_of(input_ids)} at offset {start}"
            )
        positions = self.position_embedding[start : start + T]  # (T, D)
        return self.token_embedding(input_ids) + positions  # (B, T, D) + (T, D) -> (B, T, D)

    def forward(self, input_ids: torch.Tensor, *, return_weights: bool = False):
        return_weights = require_flag("return_weights", return_weights)
        x = self._embed(input_ids, 0)  # (B, T, D)
        mask = causal_mask(input_ids.shape[1], device=x.device)  # (T, T): row i sees keys <= i
        weights = []
        for block in self.blocks:
            x, w = block(x, mask, return_weights=True)  # (B, T, D), (B, H, T, T)
            weights.append(w)
        logits = self.lm_head(self.ln_f(x))  # (B, T, D) @ (D, V) -> (B, T, V)
        return (logits, tuple(weights)) if return_weights else logits

    def forward_cached(self, input_ids: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
        """Logits of the new positions ``input_ids`` (B, T_new), given ``caches`` of the earlier ones.

        Each block is the pre-norm block of chapter 07 with its attention split open: the new
        positions' keys and values are appended to the layer's :class:`KVCache`, and the new
        queries attend over all S cached positions with the bottom-right causal mask. Equal to the
        last T_new rows of :meth:`forward` on the whole sequence (tested).

        Args:
            input_ids: (B, T_new) int64. caches: one :class:`KVCache` per layer (modified in place;
                empty lists of a fresh start are ``[KVCache() for _ in range(n_layers)]``).

        Returns:
            logits (B, T_new, V).

        Raises:
            ValueError: the wrong number of caches, or the positions exceed block_size.

        Source: chapter 10 (the cache), chapter 12.
        """
        if len(caches) != len(self.blocks):
            raise ValueError(
                f"caches must hold one KVCache per layer ({len(self.blocks)}); got {len(caches)}"
            )
        x = self._embed(input_ids, len(caches[0]))  # (B, T_new, D), positions after the cached ones
        for block, cache in zip(self.blocks, caches, strict=True):
            x = x + _cached_attention_branch(block, block.ln1(x), cache)  # (B, T_new, D)
            x = x + block.ffn(block.ln2(x))  # (B, T_new, D)
        return self.lm_head(self.ln_f(x))  # (B, T_new, D) @ (D, V) -> (B, T_new, V)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` tokens to ``input_ids``, one at a time.

        Each step turns the last position's logits into probabilities ``softmax(logits /
        temperature)`` and takes the most probable token (``greedy``) or a sample drawn with
        ``generator`` (``torch.multinomial``). With ``use_cache`` only the new token passes through
        the model at each step (keys and values of earlier positions are read from the cache);
        without it the whole sequence is recomputed. Both give the same tokens (tested, greedy and
        seeded sampling).

        Args:
            input_ids: (B, T0) int64 prompt, T0 >= 1.
            max_new_tokens: number of tokens to add (> 0); T0 + max_new_tokens <= block_size.
            temperature: > 0; below 1 sharpens, above 1 flattens the distribution.
            greedy: argmax instead of sampling. generator: for reproducible samples.
            use_cache: decode with a :class:`KVCache` per layer.

        Returns:
            (B, T0 + max_new_tokens) int64, the prompt followed by the new tokens.

        Raises:
            TypeError / ValueError: bad ``input_ids``; ``max_new_tokens`` not a positive int;
            ``temperature`` <= 0; a result longer than block_size.

        Source: chapter 12.
        """
        greedy = require_flag("greedy", greedy)
        use_cache = require_flag("use_cache", use_cache)
        require_tensor("input_ids", input_ids)
        require_rank("input_ids", input_ids, 2, "(B, T0)")
        n_new = require_positive_int("max_new_tokens", max_new_tokens)
        if isinstance(temperature, bool) or not (isinstance(temperature, (int, float)) and 0 < temperature < math.inf):
            raise ValueError(f"temperature must be a finite number > 0; got {temperature!r}")
        total = input_ids.shape[1] + n_new
        if total > self.config.block_size:
            raise ValueError(
                f"prompt length {input_ids.shape[1]} + max_new_tokens {n_new} = {total} exceeds "
                f"block_size={self.config.block_size}"
            )
        was_training = self.training
        self.eval()
        ids = input_ids
        caches = [KVCache() for _ in self.blocks] if use_cache else None
        step_input = ids
        for _ in range(n_new):
            if use_cache:
                logits = self.forward_cached(step_input, caches)[:, -1]  # (B, V)
            else:
                logits = self(ids)[:, -1]  # (B, T, V) -> (B, V)
            next_id = _choose(logits, temperature, greedy, generator)  # (B, 1)
            ids = torch.cat([ids, next_id], dim=1)  # (B, T) -> (B, T + 1)
            step_input = next_id
        self.train(was_training)
        return ids


def _cached_attention_branch(
    block: TransformerBlock, h: torch.Tensor, cache: KVCache
) -> torch.Tensor:
    """The attention branch of a pre-norm block for new positions ``h`` (B, T_new, D) over the cache.

    The same parameters and steps as :class:`~selfattn.multihead.MultiHeadAttention`'s forward,
    except that keys and values of earlier positions come from ``cache``.
    """
    attn = block.attn
    H = attn.config.n_heads
    Q = split_heads(h @ attn.W_Q + attn.b_Q, H)  # (B, T_new, D) -> (B, H, T_new, Dh)
    K_new = split_heads(h @ attn.W_K + attn.b_K, H)  # (B, T_new, D) -> (B, H, T_new, Dh)
    V_new = split_heads(h @ attn.W_V + attn.b_V, H)  # (B, T_new, D) -> (B, H, T_new, Dh)
    K, V = cache.append(K_new, V_new)  # (B, H, S, Dh) each, S = cached + new positions
    # The new queries are the last T_new of S positions: bottom-right causal alignment.
    keep = causal_mask(Q.shape[-2], K.shape[-2], alignment="bottom_right", device=h.device)
    context = scaled_dot_product_attention(Q, K, V, keep)  # (B, H, T_new, Dh)
    return merge_heads(context) @ attn.W_O + attn.b_O  # (B, T_new, D) @ (D, D) -> (B, T_new, D)


def _choose(logits: torch.Tensor, temperature: float, greedy: bool, generator) -> torch.Tensor:
    """(B, V) logits -> (B, 1) next ids, the argmax or a sample from softmax(logits / temperature)."""
    if greedy:
        return logits.argmax(dim=-1, keepdim=True)  # (B, V) -> (B, 1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (B, V)
    if generator is not None and generator.device != probs.device:
        probs = probs.to(generator.device)  # sample where the generator lives: same stream anywhere
    return torch.multinomial(probs, 1, generator=generator).to(logits.device)  # (B, 1)


@dataclass
class TrainingLog:
    """What :func:`train_lm` measured.

    Attributes:
        train_loss: the training loss (nats per token) of every step.
        val_steps: the steps (counted from 1) after which the validation loss was measured.
        val_loss: the validation loss (nats per token) at those steps.
        seconds: wall-clock time of the whole run, evaluations included.
        device: where it ran.
    """

    train_loss: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0
    device: str = "cpu"


@torch.no_grad()
def evaluate_loss(
    model: TinyLM, ids: torch.Tensor, *, batches: int = 8, batch_size: int = 32, seed: int = 1234
) -> float:
    """Mean next-token loss (nats per token) of ``model`` on ``batches`` fixed random windows of ``ids``.

    The windows are drawn with a generator seeded by ``seed``, so every call sees the same ones;
    the model runs causally (:class:`GPT`'s forward).

    Raises:
        TypeError / ValueError: as :func:`selfattn.data.random_windows`.

    Source: chapter 12.
    """
    require_positive_int("batches", batches)
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = 0.0
    for _ in range(batches):
        inputs, targets = random_windows(ids, batch_size, model.config.block_size, generator)
        total += next_token_loss(model(inputs.to(device)), targets.to(device)).item()
    model.train(was_training)
    return total / batches


def train_lm(
    model: GPT,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    *,
    steps: int,
    batch_size: int = 32,
    lr: float = 3e-3,
    eval_every: int = 50,
    eval_batches: int = 8,
    seed: int = 0,
    progress: bool = True,
) -> TrainingLog:
    """Train ``model`` (in place, on the device its parameters are on) to predict the next token.

    AdamW (weight decay 0.01), gradient clipping at norm 1, a linear warm-up over the first 5 % of
    the steps and a cosine decay to 10 % of ``lr``. Each step samples ``batch_size`` random windows
    of ``block_size`` tokens from ``train_ids`` (seeded by ``seed``). Every ``eval_every`` steps and
    after the last one, :func:`evaluate_loss` measures the loss on ``val_ids``. A tqdm progress bar
    shows the latest losses when ``progress``.

    Args:
        model: a :class:`GPT`. train_ids, val_ids: 1-D int64 tensors of token ids.
        steps: number of optimizer steps (> 0). batch_size, eval_every, eval_batches: > 0.
        lr: peak learning rate. seed: seeds the batches (the model's initialization is the caller's).
        progress: show the progress bar.

    Returns:
        A :class:`TrainingLog`. The model is left in eval mode.

    Raises:
        TypeError / ValueError: sizes not positive ints; ids too short for one window.

    Source: chapter 12.
    """
    progress = require_flag("progress", progress)
    from tqdm.auto import tqdm

    steps = require_positive_int("steps", steps)
    eval_every = require_positive_int("eval_every", eval_every)
    device = next(model.parameters()).device
    T = model.config.block_size
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 20)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    log = TrainingLog(device=str(device))
    start = time.perf_counter()
    bar = tqdm(range(1, steps + 1), desc="training", disable=not progress)
    for step in bar:
        model.train()
        inputs, targets = random_windows(train_ids, batch_size, T, generator)
        loss = next_token_loss(model(inputs.to(device)), targets.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        log.train_loss.append(loss.item())
        if step % eval_every == 0 or step == steps:
            log.val_steps.append(step)
            log.val_loss.append(
                evaluate_loss(model, val_ids, batches=eval_batches, batch_size=batch_size)
            )
            bar.set_postfix(train=f"{log.train_loss[-1]:.3f}", val=f"{log.val_loss[-1]:.3f}")
    model.eval()
    log.seconds = time.perf_counter() - start
    return log


def unigram_cross_entropy(train_ids: torch.Tensor, val_ids: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats per token) on ``val_ids`` of the unigram model fitted on ``train_ids``.

    The baseline a next-token model must beat: it predicts every token from the training
    frequencies alone, ignoring context. Counts are add-one (Laplace) smoothed so that a token
    unseen in training has a finite loss. The uniform baseline is ``log(vocab_size)``.

    Raises:
        TypeError / ValueError: ids not 1-D integer tensors; ``vocab_size`` not a positive int.

    Source: chapter 12.
    """
    for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
        require_tensor(name, ids)
        require_rank(name, ids, 1, "(N,)")
    V = require_positive_int("vocab_size", vocab_size)
    counts = torch.bincount(train_ids, minlength=V).double() + 1.0  # (V,)
    log_p = torch.log(counts / counts.sum())  # (V,)
    return float(-log_p[val_ids].mean())
