"""Helpers that several test files share: plain functions, classes and constants, no fixtures (those live in
conftest.py) and no state. Test files import it as ``from helpers import ...``: pytest puts tests/ on the path
for conftest.py, the same way under ``pytest tests/x.py`` and under ``-n 2``. A test file never imports another
test file (tests/test_test_suite.py checks it)."""

from __future__ import annotations

import time
from typing import Any

import psutil
from html.parser import HTMLParser

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import workbench as wb
from widgets.common import Selection
from workbench.layout.mesh import MODEL_AXIS
from workbench.training.modes import mode_class
from workbench.training.step import build_step


def poll(condition, timeout: float = 60.0, interval: float = 0.01) -> bool:
    """Whether ``condition()`` came true within ``timeout`` seconds, asked every ``interval``: a bounded wait
    for another thread or process, never a measure of speed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


# --- your own model: a module and a loss the workbench does not know, as a user brings them ----------------


class TwoLayer(nnx.Module):
    def __init__(self, rngs):
        self.a, self.b = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.b(nnx.tanh(self.a(x)))


# TwoLayer's own tensor-parallel rules (a column-then-row split of its pair of layers over 'model') and an example of
# its input: what a user passes to plan, recommend and verify it.
TWO_LAYER_RULES = (("a/kernel", "None, model"), ("b/kernel", "model, None"))
TWO_LAYER_BATCH = {"x": jax.ShapeDtypeStruct((8, 8), jnp.float32), "y": jax.ShapeDtypeStruct((8, 1), jnp.float32)}


def child_processes() -> list[int]:
    """The process ids of this process's children (a test that stops work checks none is left behind)."""
    return [child.pid for child in psutil.Process().children()]


def my_loss(model, batch):
    return jnp.mean((model(batch["x"])[:, 0] - batch["y"][:, 0]) ** 2), {}


# --- profiles --------------------------------------------------------------------------------------------


def profile_while_training(config, steps, run_root):
    """A real profile of ``steps`` steady steps of a run of ``config``, read back; the run is stopped after."""
    trainer = wb.Trainer(config, run_root=str(run_root))
    trainer.start()
    try:
        capture = trainer.profile(steps, timeout=120)
    finally:
        trainer.stop()
        trainer.wait(60)
    return wb.read_profile(capture)


# --- widgets ---------------------------------------------------------------------------------------------

SMALL_MODEL = {"hidden": 16}
QUIET = {"batch": 64, "log_every": 5, "eval_every": 0, "sync_every": 0}  # nothing but training


def dp_selection(**options) -> Selection:
    """The dashboard's small mlp under dp on 8 devices, logging every 5 steps and nothing else."""
    return Selection(mesh="data=8", mode="dp", model_options=dict(SMALL_MODEL), options={**QUIET, **options})


def errors(dashboard) -> list[str]:
    """The error messages a dashboard's status area shows."""
    return [text for level, text in dashboard.status.messages if level == "error"]


class TableRows(HTMLParser):
    """Text of every table row's cells (entities decoded), header rows included: ``.rows`` after ``feed``."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def mode_mesh(mode: str, model_width: int = 2) -> str:
    """The mesh the tests run ``mode`` on, from the axes the mode declares: 8 devices over ``data``, or a
    ``model`` axis ``model_width`` wide for a mode that splits layers (``dp-tp`` keeps 4 data positions).
    A mode added to the registry joins every matrix built on it.

    Example:
        >>> [mode_mesh(mode) for mode in ("dp", "tp", "dp-tp")]
        ['data=8', 'model=2', 'data=4,model=2']
    """
    axes = mode_class(mode).axes
    if MODEL_AXIS not in axes:
        return "data=8"
    return f"data=4,{MODEL_AXIS}=2" if len(axes) > 1 else f"{MODEL_AXIS}={model_width}"


def trained(config: wb.TrainConfig, steps: int) -> tuple[np.ndarray, Any]:
    """The losses of ``steps`` steps of ``config``'s step as the trainer builds it (its own first batches), and the
    parameters after them, on the host: what two modes or two settings are compared on.

    Example:
        >>> losses, params = trained(wb.TrainConfig(model="linear", mode="dp", mesh="data=8"), 2)
        >>> losses.shape
        (2,)
    """
    built = build_step(config)
    state = built.mode.place_state(built.state)
    losses = []
    for batch in built.first_batches(steps):
        state, metrics = built.mode.step(state, built.mode.place_batch(batch))
        losses.append(metrics["loss"])
    return np.array(jax.device_get(losses)), jax.device_get(state.params)
