"""The communication ledger and compiler memory estimate for a training configuration, without training.

:func:`ledger_for_config` builds what :class:`workbench.Trainer` would build for a
:class:`~workbench.TrainConfig` (model on its data, optimizer, parallel mode), compiles one step on a
placed state and batch, and reads the collectives and the compiler's memory estimate
(:func:`workbench.analysis.ledger.ledger_for_mode`). Nothing runs: compiling is enough.

Example:
    >>> ledger = ledger_for_config(TrainConfig(mode="dp", mesh="data=8", batch=64))
    >>> ledger.bytes_by_kind()  # the mlp's gradients (104,492 bytes) and the loss (4)
    {'all-reduce': 104496}
"""

from __future__ import annotations

from ..training.config import ResolvedConfig, TrainConfig
from ..training.step import build_step
from .ledger import CommLedger, ledger_for_mode


def ledger_for_config(config: TrainConfig | ResolvedConfig) -> CommLedger:
    """Compile ``config``'s training step (built as the trainer builds it) and return its
    :class:`~workbench.analysis.ledger.CommLedger`. ``config`` may be the record a widget or the CLI resolved
    where it entered (:meth:`~workbench.TrainConfig.resolved`): it is not checked again.

    Raises a WorkbenchError for a bad config, or for a mode whose step is several programs
    (``simulated``: a Python loop has no single compiled step).
    """
    built = build_step(config)
    mode, batch = built.mode, built.first_batches(1)[0]
    return ledger_for_mode(mode, mode.place_state(built.state), mode.place_batch(batch))
