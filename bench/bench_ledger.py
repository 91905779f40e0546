"""Communication per step: the ledger (read from the compiled step) against theory, for dp and FSDP.

What is measured: for ``mlp`` on digits (batch 256) and the preset ``transformer`` on text (batch 32),
on ``data=8``, the bytes per device per step of every collective in the compiled training step
(:func:`workbench.analysis.step_ledger.ledger_for_config`), over what the mode needs in theory
(:func:`workbench.analysis.ledger.theoretical_collectives`): data parallelism all-reduces every gradient
once (P, the bytes of the float parameters); ``fsdp-whole-tree`` all-gathers the parameters and
reduce-scatters the gradients (P each, 2P in all); ``fsdp`` gathers each layer for the forward pass and
again for the backward pass (at most 2P) and reduce-scatters once (3P in all). Bytes are the whole arrays
the collectives work on (see :mod:`workbench.analysis.ledger`), so the ratio is 1.00 when the compiler
sends exactly what the mode must.

How to read it: no timing, so no noise: the figures are exact. The few bytes above 1.00 are the loss
and example count summed with the gradients (dp), and the biases FSDP leaves replicated and all-reduces
instead; the note gives the split by kind. Target: 1.00 within 1%, and for ``fsdp`` at most 1.00: a
layer whose backward pass reads no parameter (the first layer, whose input needs no gradient; an
embedding lookup) is not gathered again, nor is the last layer called (it keeps the parameters its forward
pass gathered), so it sends less than twice the parameters.
"""

from __future__ import annotations

from flax import nnx
from timing import record

import workbench as wb
from workbench.analysis.ledger import compare_with_theory, float_param_bytes
from workbench.analysis.step_ledger import ledger_for_config

CASES = [("mlp", "digits", 256), ("transformer", "text", 32)]
MODES = ("dp", "dp-shard-map", "dp-pmap", "fsdp-whole-tree", "fsdp")


def run() -> list[dict]:
    results = []
    for model, data, batch in CASES:
        dataset = wb.load_dataset(data)
        params = nnx.state(wb.training.model_config_for_data(model, dataset).build(seed=0), nnx.Param)
        param_bytes = float_param_bytes(params)
        for mode in MODES:
            ledger = ledger_for_config(wb.TrainConfig(model=model, data=data, mode=mode, mesh="data=8", batch=batch))
            kinds = compare_with_theory(ledger, mode, param_bytes)
            theory = sum(k["theory"] or 0 for k in kinds.values())
            split = "; ".join(f"{kind} {k['measured']:,} B (theory "
                              f"{'layout-dependent' if k['theory'] is None else format(k['theory'], ',')})"
                              for kind, k in kinds.items())
            results.append(record(
                f"ledger / theory bytes per step, {mode} ({model})", ledger.total_bytes / theory, "x",
                ("<=", 1.0) if mode == "fsdp" else ("±", 1.0, 0.01),
                note=f"{ledger.total_bytes:,} B measured per device per step, {theory:,} B in theory; {split}; "
                     f"P = {param_bytes:,} B of float parameters; data=8, batch {batch}",
            ))
    return results
