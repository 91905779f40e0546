"""Training runs side by side: one row per run, and the table ``workbench runs`` prints.

:func:`compare_runs` reads runs (:mod:`workbench.training.runs` stores them) into rows of the same keys: name,
status, the main config fields and the final metrics. :func:`choose_columns` picks the columns a table
shows (:data:`DEFAULT_COLUMNS`, as many as fit), and :func:`compare_table` prints them aligned. Like the
run files, this needs only the standard library.

Example:
    >>> rows = [{"name": "mlp-dp", "status": "finished", "loss": 0.1234}]
    >>> choose_columns(rows, ["name", "loss"])
    ['name', 'loss']
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import RunError
from ..formatting import align_columns
from .runs import Run, _is_number, load_run

# The config fields compare_runs shows, in this order, when at least one run has them.
COMPARED_CONFIG = ("model", "data", "mode", "mesh", "optimizer", "lr", "batch", "steps")
# What `workbench runs` shows by default, most telling first: what tells runs apart, then how each ended.
# Columns no run has are skipped, and a later one is left out when it would make the table too wide (the
# trainer's default names, e.g. transformer-dp-shard-map-20261122-183117, take a third of 120 characters).
DEFAULT_COLUMNS = (
    "name", "status", "mode", "mesh", "model", "loss", "eval_accuracy", "eval_loss", "examples_per_s", "last_step",
    "data",
)


def _as_run(run: Any, run_root: str | os.PathLike) -> Run:
    return run if isinstance(run, Run) else load_run(run, run_root)


def compare_runs(
    runs: Sequence[Run | str], keys: Sequence[str] | None = None, run_root: str | os.PathLike = "runs"
) -> list[dict[str, Any]]:
    """One row per run: name, status, the main config fields, and final metrics; every row has the same keys.

    The config fields are those of ``model, data, mode, mesh, optimizer, lr, batch, steps`` that at least
    one run has. By default the metrics are the last ``"step"`` (as ``last_step``) and then every key
    that is a number in some run's :attr:`Run.final`. A metric named like a column before it (e.g. a
    logged ``lr`` schedule) is shown as ``final_<key>``. Values a run lacks are None.

    Args:
        runs: :class:`Run` objects, or names / folder paths to load with :func:`load_run`.
        keys: the metrics to show instead of the default ones (``"last_step"`` means the last ``"step"``).
        run_root: where names are looked up.

    Raises:
        RunError: a run cannot be loaded, or a key in ``keys`` is in no run's metrics (the keys are listed).

    Example:
        >>> compare_runs(["mlp-dp"], keys=["loss"])
        [{'name': 'mlp-dp', 'status': 'finished', 'model': 'mlp', ..., 'loss': ...}]
    """
    if isinstance(runs, (str, os.PathLike, Run)):
        runs = [runs]  # one run given on its own, not a sequence of names to iterate letter by letter
    loaded = [_as_run(run, run_root) for run in runs]
    finals = [run.final for run in loaded]
    config_fields = [f for f in COMPARED_CONFIG if any(f in run.config for run in loaded)]
    if keys is None:
        numeric = (k for final in finals for k, v in final.items() if k != "step" and _is_number(v))
        metrics = ["last_step", *dict.fromkeys(numeric)]
    else:
        metrics = [keys] if isinstance(keys, str) else list(keys)
        available = {k for final in finals for k in final} | {"last_step"}
        unknown = [k for k in metrics if k not in available]
        if unknown:
            known = sorted(available - {"step"})
            raise RunError(
                f"metric {', '.join(map(repr, unknown))} is in none of these runs: choose from {', '.join(known)}"
            )
    taken = {"name", "status", *config_fields}
    rows = []
    for run, final in zip(loaded, finals, strict=True):
        row = {"name": run.name, "status": run.status, **{f: run.config.get(f) for f in config_fields}}
        for key in metrics:
            value = final.get("step") if key == "last_step" else final.get(key)
            row[f"final_{key}" if key in taken else key] = value
        rows.append(row)
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def choose_columns(
    rows: Sequence[Mapping[str, Any]], wanted: Sequence[str] | None = None, *, max_width: int | None = None,
    skip_missing: bool = False,
) -> list[str]:
    """Which columns of :func:`compare_runs` rows a table shows, in the order wanted.

    Args:
        rows: from :func:`compare_runs` (every row has the same keys).
        wanted: column names, most important first (default: every column).
        max_width: when given, a column that would make a line of the table longer than this is left out,
            and the next ones are still tried; the first column (the run's name) always stays.
        skip_missing: leave out wanted columns the rows lack (for a default list) instead of raising.

    Raises:
        RunError: a wanted column is in none of the rows (the known ones are listed).

    Example:
        >>> rows = [{"name": "mlp-dp", "status": "finished", "loss": 0.1234}]
        >>> choose_columns(rows, ["name", "loss"]), choose_columns(rows, ["name", "status", "loss"], max_width=14)
        (['name', 'loss'], ['name', 'loss'])
    """
    known = list(rows[0]) if rows else ["name", "status"]
    wanted = known if wanted is None else list(wanted)
    unknown = [c for c in wanted if c not in known]
    if unknown and not skip_missing:
        raise RunError(
            f"unknown column {', '.join(map(repr, unknown))}: these runs have {', '.join(known)}"
        )
    columns = [c for c in wanted if c in known]
    if max_width is None:
        return columns
    cells = {c: [_cell(row[c]) for row in rows] for c in columns}
    widths = {c: max([len(c), *map(len, cells[c])]) for c in columns}
    shown, used = [], 0
    for column in columns:
        extra = widths[column] + (2 if shown else 0)  # two spaces between columns
        if not shown or used + extra <= max_width:
            shown.append(column)
            used += extra
    return shown


def compare_table(
    runs: Sequence[Run | str], keys: Sequence[str] | None = None, run_root: str | os.PathLike = "runs",
    *, columns: Sequence[str] | None = None,
) -> str:
    """:func:`compare_runs` as an aligned plain-text table: a header, a rule of dashes, one line per run.

    Floats show 4 significant digits, missing values ``-``; columns of numbers are right-aligned.
    ``columns`` picks which columns to show and in what order (default: all of them; see
    :func:`choose_columns` and :data:`DEFAULT_COLUMNS` for a table that fits a terminal).

    Raises:
        RunError: as :func:`compare_runs`, or a name in ``columns`` is no column of these runs.

    Example:
        >>> columns = ["name", "status", "mode", "lr", "last_step", "loss"]
        >>> print(compare_table(list_runs("runs"), columns=columns))
        name      status    mode     lr  last_step  loss...
        --------  --------  ----  -----  ---------  ----...
        mlp-dp    finished  dp    0.001         20  ...
        mlp-fsdp  finished  fsdp  0.001         20  ...
    """
    rows = compare_runs(runs, keys, run_root)
    shown = choose_columns(rows, columns)
    cells = [[_cell(row[c]) for c in shown] for row in rows]
    # Columns of numbers are right-aligned so their digits line up; a column with any text is left-aligned.
    present = [[row[c] for row in rows if row[c] is not None] for c in shown]
    numeric = [number for number, values in enumerate(present) if values and all(map(_is_number, values))]
    return "\n".join(align_columns(shown, cells, right=numeric))


__all__ = ["COMPARED_CONFIG", "DEFAULT_COLUMNS", "choose_columns", "compare_runs", "compare_table"]
