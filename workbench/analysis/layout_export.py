"""A recommended layout exported as code: a script snippet (:func:`layout_code`: the mesh, the mode's rules as a
``(regex, PartitionSpec)`` table, remat, microbatches, the config) and a pytest file for the user's CI
(:func:`budget_test_code`) that compiles the step for the target and asserts its peak memory and collective
bytes stay within a margin of today's and every parameter keeps its spec (:mod:`.layout_budget`).

Example:
    >>> rec = recommend("mlp", "cpu", 64, verify=False)
    >>> "SHARDING_RULES = [" in layout_code(rec.chosen)
    True
"""

from __future__ import annotations

import pprint
from ..errors import WorkbenchError
from .layout_budget import DEFAULT_MARGIN, layout_specs
from .recommendation import Candidate, layout_settings
from .verification import DEFAULT_TIMEOUT_S, plan_config


def _config_code(candidate: Candidate) -> str:
    """The :class:`~workbench.TrainConfig` that trains ``candidate``, one setting a line (``remat`` only when not
    ``none``, the config's default)."""
    settings = layout_settings(candidate)
    if settings["remat"] == "none":
        del settings["remat"]
    lines = "".join(f"    {name}={value!r},\n" for name, value in settings.items())
    return f"wb.TrainConfig(\n{lines})"


def layout_code(candidate: Candidate) -> str:
    """Python to paste into a training script: ``candidate``'s mesh, rule table, remat policy and microbatches, and
    the :class:`~workbench.TrainConfig` that trains it with the workbench.

    Example:
        >>> rec = recommend("mlp", "cpu", 64, verify=False)
        >>> namespace = {}
        >>> exec(layout_code(rec.chosen), namespace)
        >>> namespace["MESH"] == str(rec.chosen.mesh), namespace["ACCUM"] == rec.chosen.accum
        (True, True)
    """
    plan = candidate.plan
    mesh = candidate.mesh
    return "\n".join([
        f"# The layout `workbench recommend` chose for {plan.model} on {mesh.size:,} x {plan.hardware.name}:",
        f"# {candidate.choice}; predicted {candidate.step_s * 1e3:.1f} ms a step, "
        f"{'verified by the compiler' if candidate.verified else 'not verified'}.",
        "import workbench as wb",
        "",
        f"MESH = {str(mesh)!r}  # jax.make_mesh({tuple(mesh.sizes)!r}, {tuple(mesh.names)!r})",
        f"MODE = {candidate.mode!r}",
        f"REMAT = {candidate.remat!r}  # what each block keeps for the backward pass",
        f"ACCUM = {candidate.accum}  # microbatches per step (gradients summed, one update)",
        f"GLOBAL_BATCH = {plan.global_batch}",
        "",
        plan.rules_code(),
        "",
        "# The same layout, trained by the workbench:",
        f"CONFIG = {_config_code(candidate)}",
        "",
    ])


def budget_test_code(candidate: Candidate, *, margin: float = DEFAULT_MARGIN,
                     timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """A pytest file that holds ``candidate`` (verified: its compiled figures are today's) to its budget: the step
    compiled for the same target needs at most ``margin`` more peak memory and collective bytes, and every
    parameter keeps its spec. Raises WorkbenchError for a candidate the compiler has not verified.

    Example:
        >>> rec = recommend("mlp", "cpu", 64, verify=False)
        >>> budget_test_code(rec.chosen)
        Traceback (most recent call last):
        ...
        workbench.errors.WorkbenchError: ...has no compiled figures to hold...
    """
    compiled = candidate.plan.compiled
    if compiled is None:
        raise WorkbenchError(f"{candidate.choice} has no compiled figures to hold a later step to: export a "
                             "verified layout (recommend with verify, the default; --top 1 or more)")
    plan = candidate.plan
    config = plan_config(plan)
    specs = layout_specs(config, seq_len=plan.seq_len)
    budget = {kind: nbytes for kind, nbytes in compiled.bytes_by_kind().items()}
    return "\n".join([
        f'"""Layout budget for {plan.model} in {candidate.mode} on {candidate.mesh}, compiled for {compiled.target}.',
        "",
        "Written by `workbench recommend --export-test`. It fails when a change makes the compiled step need more",
        f"than {margin:.0%} above today's peak memory or collective bytes per device, or moves a parameter's spec.",
        '"""',
        "",
        "import workbench as wb",
        "from workbench.analysis import assert_layout, assert_step_budget, verify_step",
        "",
        f"CONFIG = {_config_code(candidate)}",
        f"TARGET = {compiled.target!r}",
        f"SEQ_LEN = {plan.seq_len!r}",
        f"MARGIN = {margin!r}",
        f"PEAK_BYTES = {compiled.peak_bytes}  # per device, compiled today",
        f"COLLECTIVE_BYTES = {pprint.pformat(budget, width=100)}  # per device per step, by kind",
        f"SPECS = {pprint.pformat(specs, width=100)}",
        "",
        "",
        "def test_the_step_stays_within_its_budget():",
        f"    compiled = verify_step(CONFIG, TARGET, seq_len=SEQ_LEN, timeout={float(timeout)!r})",
        "    assert_step_budget(compiled, peak_bytes=PEAK_BYTES, collective_bytes=COLLECTIVE_BYTES, margin=MARGIN)",
        "",
        "",
        "def test_every_parameter_keeps_its_spec():",
        "    assert_layout(CONFIG, SPECS, seq_len=SEQ_LEN)",
        "",
    ])


__all__ = ["budget_test_code", "layout_code"]
