"""What each remat policy saves and costs, planned against XLA:CPU's compile of the same step: per policy, the peak
per device (plan / compiler, target 0.85-1.15), the memory saved against ``none`` (plan / compiler, target
0.85-1.15) and the FLOPs added (the plan's recomputed FLOPs / the growth of XLA's ``cost_analysis`` flops, target
0.75-1.25; reported without a target for ``dots``, whose recomputed norms, softmax and GELU the plan does not
count). The transformer is the one tests/test_remat.py plans (d_model 128, 2 layers, 64 tokens), unrolled, in dp
on data=8, dp-tp and fsdp-tp on data=4,model=2, where activations are a third or more of the peak. About a minute.
"""

from __future__ import annotations

import json

from timing import machine, record

import workbench as wb

LM = {"d_model": 128, "n_layers": 2, "n_heads": 4, "vocab": 256, "max_len": 64}
ROWS = [("dp", "data=8", "fp32", 128), ("dp-tp", "data=4,model=2", "fp32", 64),  # mode, mesh, precision, batch
        ("fsdp-tp", "data=4,model=2", "fp32", 64)]
POLICIES = wb.training.REMAT_POLICIES
MiB = 2**20


def _compiled(mode: str, mesh: str, precision: str, batch: int, remat: str) -> tuple[int, float]:
    config = wb.TrainConfig(model="transformer", model_options=LM, mode=mode, mesh=mesh, precision=precision,
                            batch=batch, optimizer="adamw", remat=remat)
    compiled = wb.training.build_abstract_step(config).compile()
    stats = compiled.memory_analysis()
    peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
            + stats.temp_size_in_bytes)
    return peak, float(compiled.cost_analysis()["flops"])


def run() -> list[dict]:
    records = []
    for mode, mesh, precision, batch in ROWS:
        plans = {r: wb.plan_training("transformer", LM, mesh, mode, hardware="cpu", global_batch=batch,
                                     precision=precision, remat=r) for r in POLICIES}
        compiled = {r: _compiled(mode, mesh, precision, batch, r) for r in POLICIES}
        where = f"{mode} {mesh} {precision} batch {batch}"
        for policy in POLICIES:
            plan, (peak, flops) = plans[policy], compiled[policy]
            records.append(record(
                f"remat {policy} peak plan / XLA:CPU, {where}", plan.peak_bytes / peak, "x", ("±", 1.0, 0.15),
                note=f"plan {plan.peak_bytes / MiB:.1f} MiB, XLA:CPU {peak / MiB:.1f} MiB per device; {machine()}"))
            if policy == "none":
                continue
            planned_saved = plans["none"].peak_bytes - plan.peak_bytes
            compiled_saved = compiled["none"][0] - peak
            records.append(record(
                f"remat {policy} memory saved plan / XLA:CPU, {where}", planned_saved / compiled_saved, "x",
                ("±", 1.0, 0.15),
                note=f"plan saves {planned_saved / MiB:.1f} MiB, XLA:CPU {compiled_saved / MiB:.1f} MiB per device "
                     f"(of {compiled['none'][0] / MiB:.1f}); analytic activations {plan.activation_bytes / MiB:.1f} "
                     f"MiB against {plans['none'].activation_bytes / MiB:.1f}"))
            compiled_added = flops - compiled["none"][1]
            records.append(record(
                f"remat {policy} FLOPs added plan / XLA:CPU, {where}", plan.remat_flops_per_device / compiled_added,
                "x", ("±", 1.0, 0.25) if policy == "block" else None,
                note=f"plan adds {plan.remat_flops_per_device:.3g} FLOPs per device, XLA:CPU {compiled_added:.3g} "
                     f"(of {compiled['none'][1]:.3g})"))
    return records


if __name__ == "__main__":
    for result in run():
        print(json.dumps(result))
