"""Which model code an HLO instruction came from: its ``op_name`` and Python source, read from metadata.

Optimised HLO text carries ``metadata={op_name="..." stack_frame_id=N}`` on each instruction and, at its
top, tables (``FileNames``, ``FunctionNames``, ``FileLocations``, ``StackFrames``) holding the Python
call stack of every frame id. :class:`SourceTables` reads them; :func:`op_source` turns one metadata
text into an :class:`OpSource`: the op name and the innermost frame in code that is not JAX, Flax or
Optax (the model's or the mode's own line). Older or other printers write ``source_file=`` and
``source_line=`` inline instead: both are read.

Example:
    >>> import jax, jax.numpy as jnp
    >>> def scaled_sine(x):
    ...     return jnp.sin(x) * 3
    >>> compiled = jax.jit(scaled_sine).lower(jnp.ones(7)).compile()
    >>> tables = SourceTables.parse(compiled.as_text())
    >>> sine = next(line for line in compiled.as_text().splitlines() if 'op_name="jit(scaled_sine)/sin"' in line)
    >>> # in a training step: 'jit(_step_fn)/jvp(blocks/0)/mlp/down/dot_general', models.py
    >>> op_source(sine[sine.index("metadata="):], tables)
    OpSource(op_name='jit(scaled_sine)/sin', frame=Frame(file=..., line=2, function='scaled_sine'))
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

from ..training import layer_scopes
from ..training.modes import param_gathering

# Frames in these packages are the machinery, not the code that asked for the op.
LIBRARY_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy")
_ROW = re.compile(r"^(\d+) (.*)$")
_FIELDS = re.compile(r"(\w+)=(\d+)")


@dataclasses.dataclass(frozen=True)
class Frame:
    """One Python frame: file, line and function."""

    file: str
    line: int
    function: str


def _table(lines: list[str], start: int) -> tuple[dict[int, str], int]:
    rows, index = {}, start
    while index < len(lines):
        match = _ROW.match(lines[index])
        if not match:
            break
        rows[int(match[1])] = match[2]
        index += 1
    return rows, index


@dataclasses.dataclass(frozen=True)
class SourceTables:
    """The stack-frame tables of one HLO module: frame id -> its frames, innermost first."""

    frames: dict[int, tuple[Frame, ...]]

    @classmethod
    def parse(cls, hlo_text: str) -> SourceTables:
        """Read the tables at the top of ``hlo_text`` (empty when it has none)."""
        lines, tables, index = hlo_text.splitlines(), {}, 0
        names = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
        while index < len(lines) and len(tables) < len(names):
            if lines[index] in names:
                tables[lines[index]], index = _table(lines, index + 1)
            else:
                index += 1
        if "StackFrames" not in tables:
            return cls({})
        files = {k: v.strip('"') for k, v in tables.get("FileNames", {}).items()}
        functions = {k: v.strip('"') for k, v in tables.get("FunctionNames", {}).items()}
        locations = {}
        for key, text in tables.get("FileLocations", {}).items():
            fields = {name: int(value) for name, value in _FIELDS.findall(text)}
            locations[key] = Frame(files.get(fields.get("file_name_id"), "?"), fields.get("line", 0),
                                   functions.get(fields.get("function_name_id"), "?"))
        raw = {key: {name: int(value) for name, value in _FIELDS.findall(text)}
               for key, text in tables["StackFrames"].items()}
        # XLA prints a frame's parent as the parent's id + 1 on some versions (the root frame then reads
        # parent 1, itself), as the parent's id on others (the root reads 0): the root frame says which.
        offset = 1 if raw.get(1, {}).get("parent_frame_id") == 1 else 0
        frames: dict[int, tuple[Frame, ...]] = {}
        for key in sorted(raw):
            parent = raw[key].get("parent_frame_id", 0) - offset
            here = locations.get(raw[key].get("file_location_id"))
            outer = frames.get(parent, ()) if 0 < parent < key else ()
            frames[key] = ((here,) if here else ()) + outer
        return cls(frames)


@dataclasses.dataclass(frozen=True)
class OpSource:
    """Where one instruction came from.

    Attributes:
        op_name: JAX's name for it, transformations and named scopes included.
        frame: the innermost frame outside :data:`LIBRARY_PACKAGES` (and the layer-naming wrapper of
            :mod:`workbench.training.layer_scopes`), None when unknown.
    """

    op_name: str
    frame: Frame | None

    @property
    def location(self) -> str | None:
        """``file:line`` of :attr:`frame`, the file relative to the import path
        (``workbench/training/models.py:275``)."""
        return f"{short_path(self.frame.file)}:{self.frame.line}" if self.frame else None


def _machinery() -> tuple[str, ...]:
    """Path prefixes of frames to look past: the libraries, and the wrappers that name layers and gather them."""
    dirs = [layer_scopes.__file__, param_gathering.__file__]  # wrappers around a layer's call: look past them
    for name in LIBRARY_PACKAGES:
        path = getattr(sys.modules.get(name), "__file__", None)  # None: not imported, or no file
        if path:
            dirs.append(os.path.dirname(path) + os.sep)
    return tuple(dirs)


def short_path(path: str) -> str:
    """``path`` relative to the ``sys.path`` entry that holds it (the shortest such), else as given."""
    best = path
    for entry in sys.path:
        if entry and path.startswith(os.path.join(os.path.abspath(entry), "")):
            candidate = os.path.relpath(path, entry)
            best = candidate if len(candidate) < len(best) else best
    return best


def op_source(metadata: str, tables: SourceTables) -> OpSource:
    """The :class:`OpSource` of one instruction's ``metadata={...}`` text.

    Example:
        >>> op_source('{op_name="jit(f)/add" source_file="/src/model.py" source_line=12}', SourceTables({})).frame
        Frame(file='/src/model.py', line=12, function='?')
    """
    name = re.search(r'op_name="((?:[^"\\]|\\.)*)"', metadata)
    frame_id = re.search(r"stack_frame_id=(\d+)", metadata)
    stack = tables.frames.get(int(frame_id[1]), ()) if frame_id else ()
    if not stack:
        file, line = re.search(r'source_file="([^"]*)"', metadata), re.search(r"source_line=(\d+)", metadata)
        stack = (Frame(file[1], int(line[1]) if line else 0, "?"),) if file else ()
    machinery = _machinery()
    own = next((frame for frame in stack if not frame.file.startswith(machinery)), stack[0] if stack else None)
    return OpSource(name[1] if name else "", own)


__all__ = ["Frame", "LIBRARY_PACKAGES", "OpSource", "SourceTables", "op_source", "short_path"]
