"""Loop buffers in shapes of their own (``training/shapes_apart.py``): no two leaves share a shape, nothing moves
(the values and their order are the leaves'), and :func:`restored` undoes it, on the tree or on a loop's slice."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from workbench.training.shapes_apart import apart, apart_shapes, restored, shapes_of

shapes = st.lists(st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple), min_size=1, max_size=12)


@given(shapes)
def test_no_two_leaves_share_a_shape_and_each_keeps_its_elements(leaf_shapes):
    own = apart_shapes(leaf_shapes)
    assert len(set(own)) == len(own)
    for shape, new in zip(leaf_shapes, own, strict=True):
        assert new[:len(shape)] == shape and set(new[len(shape):]) <= {1}
        assert int(np.prod(new)) == int(np.prod(shape))
    assert all(own[leaf_shapes.index(shape)] == shape for shape in leaf_shapes)  # the first of each shape keeps it


@given(shapes)
def test_restored_undoes_apart_value_for_value(leaf_shapes):
    tree = {f"leaf{i:02d}": np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + i  # reshaped as jax's
            for i, shape in enumerate(leaf_shapes)}
    back = restored(apart(tree), shapes_of(tree))
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(tree), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_loops_slice_is_restored_to_the_layers_shapes():
    stacked = {"bias": jnp.zeros((3, 4)), "scale": jnp.ones((3, 4)), "kernel": jnp.ones((3, 4, 4))}
    handed = jax.tree.map(lambda leaf: leaf[0], apart(stacked))
    assert sorted(leaf.shape for leaf in jax.tree.leaves(handed)) == [(4,), (4, 1), (4, 4)]
    layer = restored(handed, [shape[1:] for shape in shapes_of(stacked)])
    assert {key: leaf.shape for key, leaf in layer.items()} == {"bias": (4,), "scale": (4,), "kernel": (4, 4)}
