"""dependency_depth counts the longest chain of dependent operations, checked on hand-made graphs."""

import torch

import selfattn
from selfattn.efficient.depth import dependency_depth


def test_a_chain_of_three_operations_has_depth_three():
    x = torch.randn(4, 4)
    count, out = dependency_depth(lambda a: ((a + 1) * 2).exp(), x)
    assert (count.depth, count.operations, count.matmuls) == (3, 3, 0)
    torch.testing.assert_close(out, ((x + 1) * 2).exp())


def test_independent_operations_add_work_not_depth():
    x = torch.randn(4, 4)

    def fan_out(a):  # four products of the input, then one sum of them: depth 2, work 4 + 3
        parts = [a @ a, a @ a.T, a.T @ a, a.T @ a.T]
        return parts[0] + parts[1] + parts[2] + parts[3]

    count, _ = dependency_depth(fan_out, x)
    assert count.matmuls == 4 and count.matmul_depth == 1
    assert count.depth == 4  # a product, then three additions one after another
    assert count.operations == 7


def test_views_add_no_depth_and_a_loop_adds_depth_per_step():
    x = torch.randn(3, 3)
    count, _ = dependency_depth(lambda a: a.reshape(9).view(3, 3).T @ a, x)  # views of a contiguous tensor
    assert count.depth == 1 and count.matmul_depth == 1
    count, _ = dependency_depth(lambda a: a.T.reshape(9), x)  # a transposed tensor must be copied to flatten
    assert count.depth == 1 and count.operations == 1

    def loop(a, steps):
        h = a
        for _ in range(steps):
            h = torch.tanh(h @ a)  # two dependent operations per step
        return h

    for steps in (1, 5, 9):
        count, _ = dependency_depth(loop, x, steps)
        assert (count.depth, count.matmul_depth, count.matmuls) == (2 * steps, steps, steps)


def test_attention_depth_does_not_depend_on_length():
    depths = set()
    for T in (4, 16, 64):
        q, k, v = (torch.randn(1, T, 8, dtype=torch.float64) for _ in range(3))
        count, _ = dependency_depth(selfattn.scaled_dot_product_attention, q, k, v, selfattn.causal_mask(T))
        assert count.matmul_depth == 2 and count.matmuls == 2  # Q K^T, then weights V
        depths.add(count.depth)
    assert len(depths) == 1
