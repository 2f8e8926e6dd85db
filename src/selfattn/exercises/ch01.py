"""Checks for the exercises of chapter 01 (tokens and embeddings)."""

from __future__ import annotations

import numpy as np
import torch

from . import call_learner, checker, failed, not_attempted, passed, to_numpy

__all__ = ["check_one_hot_lookup", "check_cosine_similarity", "check_nearest_tokens"]

_LOOKUP = "1.1 embedding lookup as one-hot @ table"


def _lookup_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """A small table (V, D) = (7, 3) and ids that repeat one id and leave out the last row, so that a
    one-hot built without ``num_classes`` is too narrow."""
    gen = torch.Generator().manual_seed(1)
    table = torch.randn(7, 3, generator=gen)  # float32, like a real embedding table
    ids = torch.tensor([2, 0, 5, 2, 4])
    return ids, table


def _explain_lookup_error(err: Exception, V: int) -> str:
    """Words for the errors that the usual mistakes of exercise 1.1 raise in PyTorch."""
    text = str(err)
    if isinstance(err, IndexError) and "indices must be" in text:
        return (
            "You used the ids as floats: an id names a row, so it must stay an integer (int64). "
            f"(PyTorch said: {text})"
        )
    if "dtype" in text or "scalar type" in text or "Long" in text:
        return (
            "Your matrix product mixed integers and floats: torch.nn.functional.one_hot returns an int64 "
            f"matrix. Convert it to the table's dtype first, e.g. .to(table.dtype). (PyTorch said: {text})"
        )
    if "cannot be multiplied" in text:
        return (
            "The one-hot matrix and the table do not fit: one_hot(ids) without num_classes has only "
            f"max(ids) + 1 columns. Pass num_classes=V = table.shape[0] (here {V}), so that "
            f"(T, V) @ (V, D) works. (PyTorch said: {text})"
        )
    return f"Your function raised {type(err).__name__}: {text}"


@checker(_LOOKUP)
def check_one_hot_lookup(fn):
    """``fn(ids, table)`` must return ``one_hot(ids) @ table``: (T,) int64 and (V, D) -> (T, D).

    Catches: the one-hot left as integers (a dtype error), the ids used as floats, a one-hot
    without ``num_classes``, the result transposed (D, T), the one-hot returned without the table,
    and rows shifted by one id.
    """
    ids, table = _lookup_inputs()
    if not callable(fn):
        return failed(_LOOKUP, f"Pass your function itself, not {type(fn).__name__}.")
    try:
        got = fn(ids.clone(), table.clone())
    except NotImplementedError:
        return not_attempted(_LOOKUP)
    except Exception as err:  # the learner's bug is explained, not raised
        return failed(_LOOKUP, _explain_lookup_error(err, table.shape[0]))
    if got is None:
        return failed(_LOOKUP, "Your function returned None: did you forget `return`?")
    arr = to_numpy(got)
    if arr is None:
        return failed(_LOOKUP, f"Return a tensor of shape (T, D); got {type(got).__name__}.")
    T, (V, D) = len(ids), table.shape
    E = table.double().numpy()
    expected = E[ids.numpy()]  # (T, D): row t is table[ids[t]]
    if arr.shape == (T, V):
        return failed(
            _LOOKUP,
            f"You returned a (T, V) = {(T, V)} matrix: that is the one-hot matrix itself. "
            "Multiply it by the table, (T, V) @ (V, D) -> (T, D).",
        )
    if arr.shape == (D, T):
        return failed(
            _LOOKUP,
            f"Your result has shape (D, T) = {(D, T)}: the axes are swapped. Each token is a "
            "ROW, so put the one-hot on the left: one_hot (T, V) @ table (V, D) -> (T, D).",
        )
    if arr.shape != (T, D):
        return failed(
            _LOOKUP,
            f"For T = {T} ids and a (V, D) = {(V, D)} table the result has shape (T, D) = {(T, D)}; "
            f"got {arr.shape}.",
        )
    if not np.isfinite(arr).all():
        return failed(_LOOKUP, "Your result contains NaN or inf.")
    for shift in (-1, 1):
        if np.allclose(arr, E[(ids.numpy() + shift) % V]):
            return failed(
                _LOOKUP,
                f"Off by one: each row is the table row of id {'+' if shift > 0 else '-'}1. "
                "Ids count from 0, and row i of the table belongs to id i.",
            )
    if not np.allclose(arr, expected, atol=1e-6, rtol=0):
        return failed(
            _LOOKUP,
            "The shape is right but row t is not table[ids[t]]: check that the one-hot has a 1 "
            "at column ids[t] of row t (torch.nn.functional.one_hot(ids, V)).",
        )
    return passed(
        _LOOKUP,
        "one_hot(ids) @ table picks row ids[t] for every t: the same as table[ids], which "
        "is what embedding layers actually compute.",
    )


_COSINE = "1.2 cosine similarity"


@checker(_COSINE)
def check_cosine_similarity(fn):
    """``fn(a, b)`` must return the number a . b / (|a| |b|) for two 1-D tensors.

    Catches: the plain dot product, a division by one length only, by the squared lengths, and
    the angle (arccos) returned instead of its cosine.
    """
    gen = torch.Generator().manual_seed(2)
    for n in (2, 5, 384):
        a = 3.0 * torch.randn(n, generator=gen, dtype=torch.float64)
        b = 0.5 * torch.randn(n, generator=gen, dtype=torch.float64)
        got = call_learner(_COSINE, fn, a.clone(), b.clone())
        arr = to_numpy(got)
        if arr is None or arr.size != 1:
            shape = None if arr is None else arr.shape
            return failed(
                _COSINE,
                f"Return a single number; for vectors of length {n} you returned shape {shape}.",
            )
        value = float(arr.reshape(()))
        if not np.isfinite(value):
            return failed(_COSINE, "Your result is NaN or inf.")
        A, B = a.numpy(), b.numpy()
        dot, la, lb = float(A @ B), float(np.linalg.norm(A)), float(np.linalg.norm(B))
        cosine = dot / (la * lb)
        if np.isclose(value, cosine, atol=1e-9):
            continue
        if np.isclose(value, dot, rtol=1e-9):
            return failed(
                _COSINE,
                "You computed the dot product, not the cosine: divide by the lengths of both "
                "vectors, a . b / (|a| |b|).",
            )
        if np.isclose(value, dot / la, rtol=1e-9) or np.isclose(value, dot / lb, rtol=1e-9):
            return failed(
                _COSINE, "You divided by the length of one vector only; divide by |a| and by |b|."
            )
        if np.isclose(value, dot / (la**2 * lb**2), rtol=1e-9):
            return failed(
                _COSINE,
                "You divided by the squared lengths: the length is the square root of the sum "
                "of squares, |a| = sqrt(a . a).",
            )
        if np.isclose(value, np.arccos(np.clip(cosine, -1, 1)), atol=1e-9):
            return failed(
                _COSINE, "You returned the angle (in radians); the exercise asks for its cosine."
            )
        return failed(
            _COSINE,
            f"For vectors of length {n} the cosine is {cosine:.4f}; you returned {value:.4f}.",
        )
    return passed(
        _COSINE,
        "cos(a, b) = a . b / (|a| |b|): the dot product of the two unit vectors, "
        "independent of their lengths.",
    )


_NEAREST = "1.3 nearest tokens"


@checker(_NEAREST)
def check_nearest_tokens(fn):
    """``fn(table, i, k)`` must return the ``k`` ids j != i whose rows have the highest cosine with
    row i, best first.

    Catches: ranking by the dot product (long rows win), keeping the token itself, and the wrong
    order.
    """
    gen = torch.Generator().manual_seed(3)
    directions = torch.nn.functional.normalize(
        torch.randn(12, 4, generator=gen, dtype=torch.float64), dim=-1
    )
    lengths = torch.linspace(0.2, 5.0, 12, dtype=torch.float64)[torch.randperm(12, generator=gen)]
    # (V, D): the directions decide the cosine; the lengths only mislead a dot-product ranking
    table = directions * lengths[:, None]
    i, k = 3, 4
    got = call_learner(_NEAREST, fn, table.clone(), i, k)
    arr = to_numpy(got)
    if arr is None or arr.ndim != 1 or len(arr) != k:
        shape = None if arr is None else arr.shape
        return failed(_NEAREST, f"Return {k} ids (a list or a 1-D tensor); got shape {shape}.")
    if not np.isfinite(arr).all() or not np.array_equal(arr, np.round(arr)):
        return failed(_NEAREST, f"Return {k} token ids, whole numbers from 0 to {table.shape[0] - 1}; got "
                                f"{[float(x) for x in arr]}.")
    ids = [int(x) for x in arr]
    unit = directions.numpy()
    cos = unit @ unit[i]  # (V, D) @ (D,) -> (V,)
    # plain ints: they are printed in the feedback
    order = [int(j) for j in np.argsort(-cos, kind="stable") if j != i]
    dots = table.numpy() @ table.numpy()[i]
    if ids == order[:k]:
        return passed(
            _NEAREST,
            "Normalise the rows, take the cosines with row i, drop i itself and keep the top k.",
        )
    if i in ids:
        return failed(
            _NEAREST,
            f"Your list contains the token itself (id {i}): its cosine with itself is 1. "
            "Leave it out.",
        )
    if ids == [j for j in np.argsort(-dots, kind="stable") if j != i][:k]:
        return failed(
            _NEAREST,
            "You ranked by the dot product, so long rows win. Normalise the rows first to rank "
            "by the cosine.",
        )
    if sorted(ids) == sorted(order[:k]):
        return failed(
            _NEAREST, "You found the right tokens in the wrong order: put the highest cosine first."
        )
    return failed(_NEAREST, f"The {k} nearest ids to {i} are {order[:k]}; you returned {ids}.")
