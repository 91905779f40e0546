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

import importlib
import pprint
import re
from typing import Any

from ..errors import WorkbenchError
from ..training.models import MODELS
from .exported_step import OwnModel
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


def budget_test_code(candidate: Candidate, *, margin: float = DEFAULT_MARGIN, timeout: float = DEFAULT_TIMEOUT_S,
                     own: OwnModel | None = None, imports: dict[str, str] | None = None) -> str:
    """A pytest file that holds ``candidate`` (verified: its compiled figures are today's) to its budget: the step
    compiled for the same target needs at most ``margin`` more peak memory and collective bytes, and every
    parameter keeps its spec. Raises WorkbenchError for a candidate the compiler has not verified.

    Your own module (or a registered model with your rules): pass ``own``, the
    :class:`~.exported_step.OwnModel` the recommendation compiled (``rec.own``). The test imports your model's
    builder and your loss by name: each must be defined at the top level of a module your tests can import, or be
    named in ``imports`` (``{"model": "mypkg.models:make_model", "loss": "mypkg.train:loss_fn"}``, as a notebook's
    functions must be); the example batch is written as its shapes and dtypes, your rules as a table.

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
    if own is None and plan.model not in MODELS:
        raise WorkbenchError(f"{candidate.choice} is your {plan.model}: pass own=rec.own (the module, loss, example "
                             "batch and rules the recommendation compiled) to write its budget test")
    budget = dict(compiled.bytes_by_kind())
    header = [
        f'"""Layout budget for {plan.model} in {candidate.mode} on {candidate.mesh}, compiled for {compiled.target}.',
        "",
        "Written by `workbench recommend --export-test` (wb.analysis.budget_test_code). It fails when a change makes",
        f"the compiled step need more than {margin:.0%} above today's peak memory or collective bytes per device, or",
        "moves a parameter's spec.",
        '"""',
        "",
    ]
    figures = [
        f"TARGET = {compiled.target!r}",
        f"SEQ_LEN = {plan.seq_len!r}",
        f"MARGIN = {margin!r}",
        f"PEAK_BYTES = {compiled.peak_bytes}  # per device, compiled today",
        f"COLLECTIVE_BYTES = {pprint.pformat(budget, width=100)}  # per device per step, by kind",
    ]
    if own is None:
        config = plan_config(plan)
        return "\n".join([
            *header,
            "import workbench as wb",
            "from workbench.analysis import assert_layout, assert_step_budget, verify_step",
            "",
            f"CONFIG = {_config_code(candidate)}",
            *figures,
            f"SPECS = {pprint.pformat(layout_specs(config, seq_len=plan.seq_len), width=100)}",
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
    return "\n".join([*header, *_own_test_code(candidate, own, imports or {}, figures, timeout)])


def _own_test_code(candidate: Candidate, own: OwnModel, imports: dict[str, str], figures: list[str],
                   timeout: float) -> list[str]:
    """The budget test's lines after its docstring for ``own``: your builder and loss imported, the plan made again
    as the recommendation made it, the step traced here and compiled in a child process (:func:`verify_plan`)."""
    plan = candidate.plan
    unknown = sorted(set(imports) - {"model", "loss"})
    if unknown:
        raise WorkbenchError(f"imports={imports!r} names {', '.join(map(repr, unknown))}: give 'model' and 'loss' "
                             "only, e.g. imports={'model': 'mypkg.models:make_model', 'loss': 'mypkg.train:loss_fn'}")
    lines = ["import jax", "from jax.sharding import PartitionSpec as P", "", "import workbench as wb",
             "from workbench.analysis import OwnModel, VerifySettings, assert_layout, assert_step_budget, verify_plan"]
    if isinstance(own.model, str):  # a registered model with your rules
        model, loss = repr(own.model), "None"
    else:
        model_import, model = _import_of("model", own.model, imports.get("model"))
        lines.append(model_import)
        loss = "None"
        if own.loss is not None:
            loss_import, loss = _import_of("loss", own.loss, imports.get("loss"))
            lines.append(loss_import)
    # The table's own import of P is already among the imports above.
    rules = "RULES = None" if own.table is None else own.table.to_code("RULES").replace(lines[1] + "\n\n", "", 1)
    settings = {"optimizer": plan.optimizer, "global_batch": plan.global_batch, "seq_len": plan.seq_len,
                "precision": plan.precision, "accum": plan.accum, "remat": plan.remat}
    options = dict(plan.model_options) if isinstance(own.model, str) else None
    return [
        *lines,
        "",
        f"MODEL = {model}",
        f"LOSS = {loss}",
        f"EXAMPLE_BATCH = {_batch_code(own.example_batch)}",
        rules,
        f"MESH = {str(candidate.mesh)!r}",
        f"MODE = {candidate.mode!r}",
        *figures,
        f"SPECS = {pprint.pformat(layout_specs(plan), width=100)}",
        "",
        "",
        "def _plan():",
        "    return wb.plan_training(",
        f"        MODEL, {options!r}, MESH, MODE, rules=RULES, loss=LOSS, example_batch=EXAMPLE_BATCH, simulate=False,",
        f"        {', '.join(f'{name}={value!r}' for name, value in settings.items())})",
        "",
        "",
        "def test_the_step_stays_within_its_budget():",
        f"    settings = VerifySettings(TARGET, timeout={float(timeout)!r})",
        "    compiled = verify_plan(_plan(), settings, OwnModel(MODEL, LOSS, EXAMPLE_BATCH, RULES))",
        "    assert_step_budget(compiled, peak_bytes=PEAK_BYTES, collective_bytes=COLLECTIVE_BYTES, margin=MARGIN)",
        "",
        "",
        "def test_every_parameter_keeps_its_spec():",
        "    assert_layout(_plan(), SPECS)",
        "",
    ]


_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _import_of(role: str, value: Any, given: str | None) -> tuple[str, str]:
    """(``from module import name``, the expression naming ``value``) for your ``role`` ("model": the builder,
    "loss"), from ``given`` (``"module:qualified.name"``) or where ``value`` is defined. Raises WorkbenchError when a
    test file could not import it (a lambda, a notebook's function, a function inside another)."""
    where = given or _defined_at(value)
    module, _, name = (where or "").partition(":")
    if not (_DOTTED.match(module) and _DOTTED.match(name)):
        shown = getattr(value, "__qualname__", None) or repr(value)
        why = f"imports[{role!r}]={given!r} is not 'module:name'" if given else \
            f"your {role} {shown} cannot be imported by a test file"
        raise WorkbenchError(f"{why}: define it at the top level of a module your tests import, or pass "
                             f"imports={{{role!r}: 'mypkg.module:name'}}")
    return f"from {module} import {name.split('.')[0]}", name


def _defined_at(value: Any) -> str | None:
    """``"module:qualified.name"`` where ``value`` is defined, if importing that gives ``value`` back."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is value else None


def _batch_code(batch: Any) -> str:
    """Python for ``batch`` as ``jax.ShapeDtypeStruct`` leaves (dicts, lists and tuples of arrays): all a trace
    needs of an example batch (None: a registered model's, which its data set gives)."""
    if batch is None:
        return "None"
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{key!r}: {_batch_code(value)}" for key, value in batch.items()) + "}"
    if isinstance(batch, (list, tuple)):
        items = ", ".join(_batch_code(value) for value in batch)
        return f"[{items}]" if isinstance(batch, list) else f"({items}{',' if len(batch) == 1 else ''})"
    return f"jax.ShapeDtypeStruct({tuple(batch.shape)!r}, {str(batch.dtype)!r})"


__all__ = ["budget_test_code", "layout_code"]
