"""Every docstring example in the engine and the widgets runs and prints what it says (examples marked ``+SKIP`` need a
run, a server or minutes, and are only read). Names of the public ``workbench`` namespace are in scope, as
they are for a user who did ``from workbench import *``."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import widgets
import workbench

MODULES = sorted(
    info.name
    for package in (workbench, widgets)
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
    if not info.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    public = {key: getattr(workbench, key) for key in dir(workbench) if not key.startswith("_")}
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    failures = []
    for test in finder.find(module, name, extraglobs=public):
        result = runner.run(test, out=failures.append)
        assert result.failed == 0, "".join(failures)
