"""The plan's simulated peak per device against XLA:CPU's compiled peak of the same step (arguments + outputs -
aliased + temporaries, nothing allocated), per configuration: target 0.85-1.15 (workbench/analysis/step_memory.py).

The matrix is the test's (tests/test_step_memory.py, read from there) plus dp-tp in bf16. The cnn is not in it:
its plan says "not modelled" (XLA:CPU expands max-pooling's gradient into buffers the jaxpr does not show; the
simulation measured 0.40-0.45 of the compiler there). With ``BENCH_STEP_MEMORY_1_3B=1`` it also runs
``--verify cpu`` of the README's 1.3B transformer in fsdp on data=64,model=8, unrolled and scanned (about a minute).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib

from timing import machine, record

from workbench.analysis.planning import plan_training
from workbench.training.config import TrainConfig
from workbench.training.step import build_abstract_step

def _test_module():
    """tests/test_step_memory.py: its matrix is the one the bench reports (one list, held by the test)."""
    path = pathlib.Path(__file__).resolve().parent.parent / "tests" / "test_step_memory.py"
    spec = importlib.util.spec_from_file_location("test_step_memory", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TESTED = _test_module()
# the test's matrix, and dp-tp in bf16 too
MATRIX = [(*row, 1) for row in [*TESTED.MATRIX, ("transformer", TESTED.LM, "dp-tp", "data=4,model=2", "bf16", 32)]]
# gradient accumulation (the tests hold dp, fsdp, dp-tp and fsdp-tp at 4 layers of 256 tokens to the 15%; on 2 layers
# of 64 tokens they measured 0.88-1.02 on JAX 0.10.2), to the same target
ACCUMULATED = [("transformer", options, mode, mesh, "fp32", 64, accum)
               for options in (TESTED.LM, TESTED.ACCUMULATED) for mode, mesh in
               (("dp", "data=8"), ("fsdp", "data=8"), ("dp-tp", "data=4,model=2"), ("fsdp-tp", "data=4,model=2"))
               for accum in (2, 4)]
BIG = {"d_model": 2048, "n_layers": 24, "n_heads": 16, "vocab": 32000}


def run() -> list[dict]:
    records = []
    for model, options, mode, mesh, precision, batch, accum in MATRIX + ACCUMULATED:
        plan = plan_training(model, options, mesh, mode, hardware="cpu", global_batch=batch, precision=precision,
                             accum=accum)
        config = TrainConfig(model=model, model_options=options, mode=mode, mesh=mesh, precision=precision,
                             batch=batch, optimizer="adamw", accum=accum)
        stats = build_abstract_step(config).compile().memory_analysis()
        peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
                + stats.temp_size_in_bytes)
        temporaries = stats.temp_size_in_bytes
        scanned = " scanned" * bool(options.get("scan_layers"))
        shape = f" {options['n_layers']}x{options['max_len']} accum {accum}" if accum > 1 else ""
        records.append(record(
            f"step memory {model}{scanned}{shape} {mode} {mesh} {precision}", plan.peak_bytes / peak, "x",
            ("±", 1.0, 0.15),
            note=f"plan {plan.peak_bytes:,} B (temporaries {plan.memory.temp_bytes:,}), XLA:CPU {peak:,} B "
                 f"(temporaries {temporaries:,}) per device, batch {batch}, adamw; {machine()}",
        ))
    if os.environ.get("BENCH_STEP_MEMORY_1_3B"):
        for options, how in ((BIG, ""), ({**BIG, "scan_layers": True}, " scanned")):
            plan = plan_training("transformer", options, "data=64,model=8", "fsdp", verify="cpu")
            records.append(record(
                f"step memory 1.3B LM{how} fsdp data=64,model=8 bf16 (verify cpu)",
                plan.peak_bytes / plan.compiled.peak_bytes, "x", ("±", 1.0, 0.15),
                note=f"plan {plan.peak_bytes:,} B, XLA:CPU {plan.compiled.peak_bytes:,} B per device; {machine()}"))
    return records


if __name__ == "__main__":
    for result in run():
        print(json.dumps(result))
