"""Which rows of the global batch each process loads, and arrays that span processes.

On ``jax.distributed`` every process holds only its own devices. A global batch is therefore never
loaded whole: each process reads the rows its devices hold (:class:`ProcessShare`, from the mesh and the
axis the batch is split over) and :func:`global_arrays` joins the parts into one global ``jax.Array``
without copying between processes. :func:`host_values` brings arrays back to the host, gathering across
processes where one process does not hold all of an array. In one process all three are what they were
before: the whole batch, ``jax.device_put`` and ``jax.device_get``.

Example:
    >>> mesh = build_mesh("data=8")
    >>> batch_share(mesh, "data", 64).rows  # one process holds every row
    slice(0, 64, None)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from ..errors import WorkbenchError


@dataclasses.dataclass(frozen=True)
class ProcessShare:
    """The rows of every global batch that process ``process_index`` of ``process_count`` loads.

    Attributes:
        process_index, process_count: this process and how many train together.
        rows: a slice of the ``global_rows`` rows of each global batch.
        global_rows: the global batch size.
    """

    process_index: int
    process_count: int
    rows: slice
    global_rows: int

    @property
    def size(self) -> int:
        """How many rows of each global batch this process loads."""
        return self.rows.stop - self.rows.start

    @property
    def whole(self) -> bool:
        """Whether this process loads every row (one process, or a batch every device reads whole)."""
        return self.size == self.global_rows

    def take(self, batch: Any) -> Any:
        """This process's rows of a global batch (a tree of arrays with the batch first).

        Example:
            >>> ProcessShare(1, 2, slice(2, 4), 4).take({"x": np.arange(4)})["x"]
            array([2, 3])
        """
        return batch if self.whole else jax.tree.map(lambda x: x[self.rows], batch)

    def describe(self) -> str:
        """One line: which rows this process loads."""
        return (f"process {self.process_index} of {self.process_count} loads rows "
                f"{self.rows.start}-{self.rows.stop - 1} "
                f"of each global batch of {self.global_rows}")


def batch_share(mesh: Any, batch_axis: str | None, global_rows: int, process_index: int | None = None) -> ProcessShare:
    """The rows of a global batch split over ``batch_axis`` of ``mesh`` that the devices of process
    ``process_index`` (default: this one) hold. A batch no axis splits is loaded whole by every process.

    Raises:
        WorkbenchError: the process's devices hold rows that are not one block (a mesh whose batch axis
            interleaves processes), or the process has no device in the mesh.

    Example:
        >>> batch_share(build_mesh("data=4,model=2"), "data", 32, process_index=0).rows
        slice(0, 32, None)
    """
    process = jax.process_index() if process_index is None else process_index
    count = jax.process_count()
    if batch_axis is None:
        return ProcessShare(process, count, slice(0, global_rows), global_rows)
    axis = tuple(mesh.axis_names).index(batch_axis)
    parts = int(mesh.shape[batch_axis])
    positions = sorted({index[axis] for index, device in np.ndenumerate(np.asarray(mesh.devices))
                        if device.process_index == process})
    if not positions:
        raise WorkbenchError(f"process {process} has no device in the mesh {dict(mesh.shape)}: build the mesh over "
                             "jax.devices() (every process's devices)")
    first, last = positions[0], positions[-1] + 1
    if last - first != len(positions):
        raise WorkbenchError(
            f"process {process} holds batch parts {positions} of {parts}, which are not one block of rows: order "
            "the mesh's devices by process (jax.devices() order)"
        )
    per_part = global_rows // parts
    return ProcessShare(process, count, slice(first * per_part, last * per_part), global_rows)


def global_arrays(local: Any, shardings: Any, leading: int) -> Any:
    """Global arrays laid out by ``shardings`` from this process's part ``local`` of each (NumPy leaves);
    ``leading`` is the global size of the first dimension. In one process: ``jax.device_put``.

    Example:
        >>> from jax.sharding import NamedSharding, PartitionSpec
        >>> from workbench.layout.mesh import build_mesh
        >>> sharding = NamedSharding(build_mesh("data=8"), PartitionSpec("data"))
        >>> global_arrays({"x": np.ones((8, 2))}, {"x": sharding}, 8)["x"].shape
        (8, 2)
    """
    if jax.process_count() == 1:
        return jax.device_put(local, shardings)

    def join(part: Any, sharding: Any) -> jax.Array:
        part = np.asarray(part)
        return jax.make_array_from_process_local_data(sharding, part, (leading, *part.shape[1:]))

    return jax.tree.map(join, local, shardings)


def host_values(tree: Any) -> Any:
    """Every array of ``tree`` on the host as NumPy. An array that spans processes is gathered from all of
    them, so every process must call this with the same tree at the same point (it is a collective).

    Example:
        >>> host_values({"w": jax.numpy.ones(2)})["w"]
        array([1., 1.], dtype=float32)
    """
    if jax.process_count() == 1:
        return jax.device_get(tree)

    def fetch(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return jax.device_get(leaf)

    return jax.tree.map(fetch, tree)


__all__ = ["ProcessShare", "batch_share", "global_arrays", "host_values"]
