"""Every docstring example in the engine and the widgets runs and prints what it says, as a user would type it
after a couple of training runs. Each module's examples run in a fresh folder of their own, holding a copy of the
runs that :func:`world` made once with the workbench itself (``runs/mlp-dp`` and ``runs/mlp-fsdp``) when the
examples name them, with the public ``workbench`` names in scope (as after ``from workbench import *``) and the
few names examples take as given (:data:`GIVEN`). Examples marked ``+SKIP`` are only read: they compile for a
minute, or for seconds in a panel's background child (the engine's calls run in their own examples), start several
processes, need a GPU compiler, show a widget or figure in a notebook or browser, clear the machine's compilation
cache, or run only inside a traced ``shard_map``."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
import shutil

import pytest
from flax import nnx

import widgets
import workbench
import workbench as wb
from helpers import TwoLayer, my_loss
from workbench.training import build_step, load_dataset

MODULES = sorted(
    info.name
    for package in (workbench, widgets)
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
    if not info.name.endswith("__main__")
)

# The runs every example may read: the digits mlp on the 8 simulated devices, 20 steps, checkpointed every 10,
# 3 steps profiled as soon as they are compiled. Small, so that making them costs seconds.
RUN = wb.TrainConfig(model="mlp", mode="dp", mesh="data=8", batch=64, steps=20, log_every=5, eval_every=10,
                     sync_every=0, checkpoint_every=10)
PROFILED_STEPS = 3
READS_RUNS = re.compile(r"\bruns\b|\bmlp-(?:dp|fsdp)\b")  # an example that names the runs gets its own copy
COMPILE_TIMEOUT_S = 300  # the plan's compile in a child process: killed and reaped if it takes longer
GIVEN = {
    "config": "the TrainConfig of runs/mlp-dp",
    "trainer": "the Trainer that ran runs/mlp-dp, finished",
    "mode": "config's parallel mode (dp on data=8), built",
    "state": "the TrainState that mode starts from, on the host",
    "batch": "the first global batch of config's data",
    "graphdef": "the mlp's nnx graph definition",
    "loss_fn": "the mlp's loss",
    "optimizer": "config's optimizer (adam)",
    "my_module": "a module of your own (two Linear layers)",
    "my_loss": "its loss",
    "my_batches": "seed -> its batches (64 rows of 8 features)",
    "plan": 'plan_training("mlp", {}, "data=8", "dp", hardware="cpu", verify="cpu"): verified by the compiler',
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The folder holding ``runs/`` and the :data:`GIVEN` names, made once per worker by the workbench itself."""
    folder = tmp_path_factory.mktemp("doctest-world")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # runs are written to the relative runs/, as a user's are
        trainer = wb.Trainer(RUN)
        trainer.run(name="mlp-dp", profile=PROFILED_STEPS)
        wb.Trainer(RUN, mode="fsdp").run(name="mlp-fsdp", profile=PROFILED_STEPS)
    built = build_step(RUN)
    regression = load_dataset("regression")
    names = {
        "config": RUN, "trainer": trainer, "mode": built.mode, "state": built.state,
        "batch": built.first_batches(1)[0], "graphdef": built.mode.setup.graphdef, "loss_fn": built.loss,
        "optimizer": built.mode.setup.optimizer, "my_module": TwoLayer(nnx.Rngs(0)), "my_loss": my_loss,
        "my_batches": lambda seed: regression.batches(64, seed=seed, drop_remainder=True),
        "plan": wb.plan_training("mlp", {}, "data=8", "dp", hardware="cpu",
                                 verify=wb.analysis.VerifySettings("cpu", timeout=COMPILE_TIMEOUT_S)),
    }
    assert set(names) == set(GIVEN)
    yield folder, names
    _stop(trainer)


def _stop(trainer) -> None:
    """Stop ``trainer``'s run if one is active (an example that failed half-way), and wait for it to end."""
    if trainer.is_active:
        trainer.stop()
        trainer.wait(60)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, world, tmp_path, monkeypatch):
    folder, given = world
    module = importlib.import_module(name)
    public = {key: getattr(workbench, key) for key in dir(workbench) if not key.startswith("_")}
    given = {key: value for key, value in given.items() if key not in vars(module)}  # a module's own name wins
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [test for test in finder.find(module, name, extraglobs={**public, **given}) if test.examples]
    monkeypatch.chdir(tmp_path)  # whatever an example writes lands here, never in the repository
    if any(READS_RUNS.search(example.source) for test in tests for example in test.examples):
        shutil.copytree(folder / "runs", "runs")  # the module's own: its examples may resume or reopen one
    failures = []
    try:
        for test in tests:
            runner.run(test, out=failures.append)
        assert runner.failures == 0, "".join(failures)
    finally:
        trainer = world[1]["trainer"]
        _stop(trainer)  # no run is left behind for the next module
        trainer.config = RUN  # start(steps=...) changed it: every module starts from the same trainer
