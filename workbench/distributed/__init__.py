"""Training across processes on ``jax.distributed``: the worker each process runs (:mod:`.worker`). Which rows
each process loads is :mod:`workbench.training.process_share`; the processes are started and watched on one
machine by :mod:`workbench.training.process_group`. Why it works this way: docs/design/processes.md."""
