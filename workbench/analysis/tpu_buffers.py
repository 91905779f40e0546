"""What a step compiled by libtpu reserves per chip in HBM and in on-chip VMEM, read off libtpu's buffer assignment.

libtpu keeps a step's temporaries in one preallocated block per memory space, and ``memory_analysis()``'s
temporaries are not the HBM block: JAX 0.10's libtpu reported 0 B for a small step whose block in HBM is 7.4 MB (and
46 MB in VMEM), and 5-53% more than the block on larger steps (2 blocks of d_model 1,024-2,048 on 8 chips of v5p,
v6e and v5e). The verification takes the block (``compile_child``): libtpu's own memory-usage report of HBM is the
arguments, the block and the constants, byte for byte, where its memory analysis is an estimate (MaxText logs it as
one; its maintainers note it can over-estimate HBM, AI-Hypercomputer/maxtext#4514). :func:`compile_reading_buffers`
compiles with ``xla_dump_to`` set, where libtpu writes its buffer assignment as text, and
:func:`read_buffer_assignment` reads the blocks' sizes. What was measured: docs/design/compile-verification.md,
"libtpu's temporaries".

Example:
    >>> text = '''allocation 614: size 7422144, preallocated-temp:
    ... allocation 616: size 2048, color 6, preallocated-temp:
    ... allocation 617: size 45814272, color 1, preallocated-temp:'''
    >>> read_buffer_assignment(text)
    TpuBuffers(hbm_block_bytes=7422144, on_chip_bytes=45814272)
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# XLA's memory spaces (an allocation's "color") on a TPU: 0, HBM (no color written); 1, VMEM. The others are small
# scratch spaces (SMEM and the like, a few KiB).
_HBM, _VMEM = 0, 1
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+), (.*):\s*$", re.MULTILINE)
_COLOR = re.compile(r"\bcolor (\d+)\b")


@dataclasses.dataclass(frozen=True)
class TpuBuffers:
    """A compiled TPU step's temporaries per device.

    Attributes:
        hbm_block_bytes: the temporaries' block in HBM (what the step holds beside its arguments and outputs).
        on_chip_bytes: the temporaries' block in VMEM, on-chip memory apart from HBM.
    """

    hbm_block_bytes: int
    on_chip_bytes: int


def read_buffer_assignment(text: str) -> TpuBuffers | None:
    """The preallocated temporaries' blocks of one buffer assignment (XLA's ``*buffer-assignment.txt``): None if it
    holds none (another compiler's, or text of another form)."""
    blocks: dict[int, int] = {}
    for size, attributes in _ALLOCATION.findall(text):
        if "preallocated-temp" in attributes:
            color = _COLOR.search(attributes)
            space = int(color.group(1)) if color else _HBM
            blocks[space] = blocks.get(space, 0) + int(size)
    if not blocks:
        return None
    return TpuBuffers(hbm_block_bytes=blocks.get(_HBM, 0), on_chip_bytes=blocks.get(_VMEM, 0))


def compile_reading_buffers(compile_step: Callable[[dict[str, Any] | None], Any]) -> tuple[Any, TpuBuffers | None]:
    """``compile_step(compiler_options)`` run with libtpu's dump in a temporary folder, and its buffers read from it
    (None where it wrote no buffer assignment). Nothing is left behind: the folder goes with the call."""
    with tempfile.TemporaryDirectory(prefix="workbench-libtpu-") as folder:
        compiled = compile_step({"xla_dump_to": folder})
        reports = sorted(Path(folder).glob("*after_optimizations-buffer-assignment.txt"))
        buffers = [read_buffer_assignment(report.read_text()) for report in reports]
        found = [b for b in buffers if b is not None]
        if not found:
            return compiled, None
        # One program per step; were there several, the step's is the one with the largest HBM block.
        return compiled, max(found, key=lambda b: b.hbm_block_bytes)


__all__ = ["TpuBuffers", "compile_reading_buffers", "read_buffer_assignment"]
