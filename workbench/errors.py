"""The exceptions the workbench raises for bad input.

Every message names the bad value, what was expected, and a fix, so the CLI can print it as one line
and a widget can show it inline. All of them subclass ``ValueError`` so callers that already catch
``ValueError`` around JAX sharding code keep working.
"""

from __future__ import annotations


class WorkbenchError(ValueError):
    """Base class: bad input to the workbench, with a message that says how to fix it."""


class MeshError(WorkbenchError):
    """A mesh description that cannot be parsed or built (names, sizes, device count)."""


class SpecError(WorkbenchError):
    """A partition spec that cannot be parsed, or that does not fit a mesh and an array shape."""


class ShapeError(WorkbenchError):
    """An array shape that cannot be parsed (negative sizes, non-integers)."""


class DTypeError(WorkbenchError):
    """A dtype name that JAX does not know."""


class RuleError(WorkbenchError):
    """A rule table (regex -> spec) that cannot be parsed or applied."""


class GradientSyncError(WorkbenchError):
    """A gradient reduction that would give the wrong answer (unknown reduction, unbound axis,
    or gradients that JAX already summed across devices)."""


class VerificationError(WorkbenchError):
    """A step that could not be compiled to check a plan: the compiler failed or ran out of memory, its
    process died, ran out of time or was cancelled."""


class StepDoesNotFit(VerificationError):
    """A step the target's compiler refused because it needs more memory than a chip has (libtpu checks a step against
    the chip's HBM while it compiles): the target's answer, with what the compiler reported and the levers that keep
    less, not a failure of the machine compiling it."""


class RunError(WorkbenchError):
    """A training run on disk that cannot be written, found or read (bad name, non-JSON value, garbled file)."""


def nearest_multiples(value: int, unit: int) -> str:
    """The multiples of ``unit`` around ``value``, for "use a batch of ..." advice.

    Example:
        >>> nearest_multiples(100, 8), nearest_multiples(5, 8)
        ('96 or 104', '8')
    """
    lower, upper = value // unit * unit, -(-value // unit) * unit
    return f"{lower} or {upper}" if lower else f"{upper}"
