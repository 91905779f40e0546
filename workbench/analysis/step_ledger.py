"""The communication ledger and compiler memory estimate for a training configuration, without training.

:func:`ledger_for_config` builds what :class:`workbench.Trainer` would build for a
:class:`~workbench.TrainConfig` (model on its data, optimizer, parallel mode), compiles one step on a
placed state and batch, and reads the collectives and the compiler's memory estimate
(:func:`workbench.analysis.ledger.ledger_for_mode`). Nothing runs: compiling is enough.

Example:
    >>> ledger = ledger_for_config(TrainConfig(mode="dp", mesh="data=8", batch=64))  # doctest: +SKIP
    >>> ledger.bytes_by_kind()  # doctest: +SKIP
    {'all-reduce': 104500}
"""

from __future__ import annotations

from .ledger import CommLedger, ledger_for_mode
from ..training.data import load_dataset
from ..training.models import model_config_for_data
from ..layout.mesh import parse_mesh
from ..training.modes import StepPlan, build_mode
from ..training.modes.base import training_mesh
from ..training.modes.core import init_state
from ..training.config import TrainConfig, make_optimizer


def ledger_for_config(config: TrainConfig) -> CommLedger:
    """Compile ``config``'s training step and return its :class:`~workbench.analysis.ledger.CommLedger`.

    Raises a WorkbenchError for a bad config, or for a mode whose step is several programs
    (``simulated``: a Python loop has no single compiled step).
    """
    config = config.checked()
    training_mesh(parse_mesh(config.mesh))  # a mesh larger than the machine: say so before loading anything
    dataset = load_dataset(config.data, seed=config.seed, **config.data_options)
    net = model_config_for_data(config.model, dataset, **config.model_options).build(seed=config.seed)
    tx = make_optimizer(config.optimizer, config.lr)
    graphdef, state = init_state(net, tx)
    plan = StepPlan(graphdef, type(net).loss, tx, config.mesh, config.batch, config.accum, config.precision,
                    tuple(type(net).tensor_parallel_rules()), config.faults)
    mode = build_mode(config.mode, plan)
    batch = next(dataset.batches(config.batch, seed=config.seed))
    return ledger_for_mode(mode, mode.place_state(state), mode.place_batch(batch))
