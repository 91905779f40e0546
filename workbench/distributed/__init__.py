"""Training across processes on ``jax.distributed``: each process's part of the batch
(:mod:`.process_data`), the worker each process runs (:mod:`.worker`) and the launcher that starts and
watches them on one machine (:mod:`.launcher`)."""
