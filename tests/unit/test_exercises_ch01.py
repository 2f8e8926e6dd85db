"""Chapter 01's checks accept the reference solutions and explain the typical mistakes in words."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from selfattn.exercises import ch01


def _stub(*args):
    raise NotImplementedError


# Exercise 1.1: the embedding lookup as one-hot @ table


@pytest.mark.parametrize(
    "solution",
    [
        lambda ids, table: F.one_hot(ids, table.shape[0]).to(table.dtype) @ table,
        lambda ids, table: F.one_hot(ids, table.shape[0]).float() @ table,
        lambda ids, table: table[ids],
    ],
    ids=["one_hot_to_dtype", "one_hot_float", "indexing"],
)
def test_lookup_accepts_reference_solutions(solution):
    fb = ch01.check_one_hot_lookup(solution)
    assert fb.ok and fb.attempted, fb.message


@pytest.mark.parametrize(
    ("wrong", "words"),
    [
        (lambda ids, table: F.one_hot(ids, table.shape[0]) @ table, "mixed integers and floats"),
        (lambda ids, table: F.one_hot(ids).float() @ table, "num_classes"),
        (lambda ids, table: table[ids.float()], "used the ids as floats"),
        (lambda ids, table: table.T @ F.one_hot(ids, table.shape[0]).float().T, "axes are swapped"),
        (lambda ids, table: F.one_hot(ids, table.shape[0]).float(), "one-hot matrix itself"),
        (lambda ids, table: table[ids - 1], "Off by one"),
        (lambda ids, table: F.one_hot(ids + 1, table.shape[0]).float() @ table, "Off by one"),
        (lambda ids, table: table[ids].flip(0), "row t is not table[ids[t]]"),
    ],
    ids=[
        "int_one_hot",
        "no_num_classes",
        "float_ids",
        "transposed",
        "one_hot_only",
        "minus_one",
        "plus_one",
        "rows_reordered",
    ],
)
def test_lookup_explains_typical_mistakes(wrong, words):
    fb = ch01.check_one_hot_lookup(wrong)
    assert not fb.ok and fb.attempted
    assert words in fb.message, fb.message


def test_lookup_not_attempted_and_not_callable():
    fb = ch01.check_one_hot_lookup(_stub)
    assert not fb.ok and not fb.attempted and "not attempted" in str(fb)
    fb = ch01.check_one_hot_lookup(42)
    assert not fb.ok and "function itself" in fb.message


# Exercise 1.2: cosine similarity


@pytest.mark.parametrize(
    "solution",
    [
        lambda a, b: a @ b / (a.norm() * b.norm()),
        lambda a, b: F.cosine_similarity(a, b, dim=0),
        lambda a, b: float((a / a.norm()) @ (b / b.norm())),
    ],
    ids=["formula", "torch", "unit_vectors"],
)
def test_cosine_accepts_reference_solutions(solution):
    fb = ch01.check_cosine_similarity(solution)
    assert fb.ok, fb.message


@pytest.mark.parametrize(
    ("wrong", "words"),
    [
        (lambda a, b: a @ b, "you computed the dot product, not the cosine"),
        (lambda a, b: a @ b / a.norm(), "length of one vector only"),
        (lambda a, b: a @ b / ((a @ a) * (b @ b)), "squared lengths"),
        (lambda a, b: torch.arccos(a @ b / (a.norm() * b.norm())), "the angle"),
        (lambda a, b: a * b / (a.norm() * b.norm()), "single number"),
        (lambda a, b: torch.nan * a.sum(), "NaN"),
    ],
    ids=["dot_product", "one_length", "squared_lengths", "angle", "elementwise", "nan"],
)
def test_cosine_explains_typical_mistakes(wrong, words):
    fb = ch01.check_cosine_similarity(wrong)
    assert not fb.ok
    assert words.lower() in fb.message.lower(), fb.message


def test_cosine_not_attempted():
    fb = ch01.check_cosine_similarity(_stub)
    assert not fb.attempted and not fb.ok


# Exercise 1.3: nearest tokens


def _nearest(table, i, k):
    unit = F.normalize(table, dim=-1)
    cos = unit @ unit[i]  # (V, D) @ (D,) -> (V,)
    cos[i] = -torch.inf
    return cos.topk(k).indices


def test_nearest_accepts_reference_solution():
    fb = ch01.check_nearest_tokens(_nearest)
    assert fb.ok, fb.message
    assert ch01.check_nearest_tokens(lambda t, i, k: _nearest(t, i, k).tolist())


def _by_dot_product(table, i, k):
    dots = table @ table[i]  # (V, D) @ (D,) -> (V,)
    dots[i] = -torch.inf
    return dots.topk(k).indices


def _with_itself(table, i, k):
    unit = F.normalize(table, dim=-1)
    return (unit @ unit[i]).topk(k).indices


@pytest.mark.parametrize(
    ("wrong", "words"),
    [
        (_by_dot_product, "ranked by the dot product"),
        (_with_itself, "contains the token itself"),
        (lambda t, i, k: _nearest(t, i, k).flip(0), "wrong order"),
        (lambda t, i, k: _nearest(t, i, k + 1), "Return 4 ids"),
    ],
    ids=["dot_product", "itself", "order", "too_many"],
)
def test_nearest_explains_typical_mistakes(wrong, words):
    fb = ch01.check_nearest_tokens(wrong)
    assert not fb.ok and words in fb.message, fb.message


def test_nearest_names_the_right_ids_as_plain_ints():
    # regression: the message printed "[np.int64(6), ...]" instead of "[6, ...]"
    fb = ch01.check_nearest_tokens(
        lambda t, i, k: torch.tensor([(i + 1 + j) % t.shape[0] for j in range(k)])
    )
    assert not fb.ok and "np.int64" not in fb.message, fb.message
    assert "nearest ids to 3 are [" in fb.message, fb.message
