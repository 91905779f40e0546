"""Where JAX's API moved between the versions the workbench supports (JAX 0.10 to 0.12), said once.

CI runs the whole suite on the oldest stack (Python 3.11, JAX 0.10.2) and the newest the pins allow (Python 3.13,
JAX 0.12): whatever reads a JAX internal that differs between them reads it through here.

Example:
    >>> import jax, jax.numpy as jnp
    >>> eqn = jax.make_jaxpr(lambda c, xs: jax.lax.scan(lambda c, x: (c + x, c), c, xs))(0.0, jnp.ones(3)).eqns[0]
    >>> scan_operand_counts(eqn.params)
    (0, 1)
"""

from __future__ import annotations

from typing import Any


def scan_operand_counts(params: dict[str, Any]) -> tuple[int, int]:
    """(constants, carried values) at the front of a ``scan`` equation's operands; the scanned inputs follow.

    JAX 0.10 and 0.11 name them ``num_consts`` and ``num_carry``; JAX 0.12 gives the operands as a flat tree
    instead, ``ft_in``: a tuple of (constants, carry, scanned) whose ``len`` counts every leaf, unpacked into
    the three groups.
    """
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


__all__ = ["scan_operand_counts"]
