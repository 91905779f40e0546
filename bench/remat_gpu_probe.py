"""Per remat policy, the planned peak per device beside the compiled one for the README's 0.8B transformer on one
GPU (d_model 2048, 16 layers, 16 heads, vocab 32000, 1,024 tokens, batch 16, bf16, AdamW, dp): the check of the
remat pricing (workbench/training/remat.py) on a real GPU compiler, about 2 minutes.

    .venv/bin/python bench/remat_gpu_probe.py              # the local GPU: compile the step on it (nothing runs)
    .venv/bin/python bench/remat_gpu_probe.py gpu:h200:1   # deviceless XLA:GPU, no GPU needed (make gpu-compile)

Prints one line per policy: the plan's peak (simulated with XLA:GPU's rules), the compiler's, their ratio (held to
0.85-1.15 elsewhere), the plan's recomputed FLOPs and the compiled step's flops (XLA's cost analysis). Run it
without the test conftest: JAX must see the GPU (JAX_PLATFORMS unset or ``cuda``).
"""

from __future__ import annotations

import sys

import workbench as wb

OPTIONS = {"d_model": 2048, "n_layers": 16, "n_heads": 16, "vocab": 32000, "max_len": 1024}
BATCH, SEQ_LEN, PRECISION, MESH = 16, 1024, "bf16", "data=1"
GiB = 2**30


def _local_compile(remat: str) -> tuple[int, float]:
    """The step compiled for this machine's first device: (peak bytes, flops)."""
    import jax

    config = wb.TrainConfig(model="transformer", model_options=OPTIONS, mode="dp", mesh=MESH, batch=BATCH,
                            precision=PRECISION, optimizer="adamw", remat=remat)
    compiled = wb.training.build_abstract_step(config, seq_len=SEQ_LEN, devices=jax.devices()[:1]).compile()
    stats = compiled.memory_analysis()
    peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
            + stats.temp_size_in_bytes)
    return peak, float(compiled.cost_analysis()["flops"])


def probe(target: str | None = None) -> list[str]:
    """One line per policy for ``target`` (``gpu:<chip>:1``, deviceless) or the local GPU (None).

    Example:
        >>> print(probe("gpu:h200:1")[0])  # doctest: +SKIP
        remat none: plan 60.1 GiB, compiler 58.9 GiB (1.02); plan FLOPs 2.6e+14 (0 recomputed), compiled 2.6e+14
    """
    lines = []
    for remat in wb.training.REMAT_POLICIES:
        plan = wb.plan_training("transformer", OPTIONS, MESH, "dp", hardware="h200", global_batch=BATCH,
                                seq_len=SEQ_LEN, precision=PRECISION, remat=remat, compiler="gpu",
                                verify=target)
        if target is None:
            peak, flops = _local_compile(remat)
        else:
            peak, flops = plan.compiled.peak_bytes, plan.compiled.flops or float("nan")
        lines.append(f"remat {remat}: plan {plan.peak_bytes / GiB:.1f} GiB, compiler {peak / GiB:.1f} GiB "
                     f"({plan.peak_bytes / peak:.2f}); plan FLOPs {plan.flops_per_device:.3g} "
                     f"({plan.remat_flops_per_device:.3g} recomputed), compiled {flops:.3g}")
        print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    probe(sys.argv[1] if len(sys.argv) > 1 else None)
