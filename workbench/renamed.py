"""Names the workbench renamed, kept importable under their old names with a DeprecationWarning.

``check_*`` now means a reference check (``run_check``, ``workbench check``) and, in ``workshop``, an exercise's
grader; a function that refuses bad input is ``validate_*``. ``StepPlan`` became ``StepSetup``: "plan" is the
planner's ``TrainingPlan`` alone. A script written against the old names keeps working and is told the new one.

Example:
    >>> import warnings, workbench as wb
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     wb.training.StepPlan is wb.training.StepSetup
    True
"""

from __future__ import annotations

import warnings
from typing import Any

RENAMED = {  # old name -> new name (2026-11)
    "StepPlan": "StepSetup",
    "check_verifiable": "validate_verifiable",
}


def renamed_attribute(module: str, name: str, namespace: dict[str, Any]) -> Any:
    """The value of old name ``name`` in ``module`` (its ``globals()`` as ``namespace``), with a DeprecationWarning
    naming the new one; an AttributeError for any other missing name. A package's ``__getattr__`` calls it."""
    new = RENAMED.get(name)
    if new is None or new not in namespace:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(f"{module}.{name} was renamed {new}: use {module}.{new}", DeprecationWarning, stacklevel=3)
    return namespace[new]
