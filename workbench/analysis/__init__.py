"""Analysis of a training step: the communication ledger, planning and its cost model, the reference check."""
