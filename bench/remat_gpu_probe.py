"""Per remat policy, the planned peak per device beside the compiled one for the README's 0.8B transformer on one
GPU (d_model 2048, 16 layers, 16 heads, vocab 32000, 1,024 tokens, batch 16, bf16, AdamW, dp): the check of the
remat pricing (workbench/training/remat.py) on a real GPU compiler, about 2 minutes.

    .venv/bin/python bench/remat_gpu_probe.py              # the local GPU: compile the step on it (nothing runs)
    .venv/bin/python bench/remat_gpu_probe.py gpu:h200:1   # deviceless XLA:GPU, no GPU needed (make gpu-compile)
    .venv/bin/python bench/remat_gpu_probe.py train         # on a GPU: each policy trained for a few steps

``train`` runs each policy in a process of its own (the allocator's peak only grows within a process): the plan's
peak, the compiled step's, the GPU allocator's peak after the steps, and tokens per second.

Prints one line per policy: the plan's peak (simulated with XLA:GPU's rules), the compiler's, their ratio (held to
0.85-1.15 elsewhere), the plan's recomputed FLOPs and the compiled step's flops (XLA's cost analysis). Run it
without the test conftest: JAX must see the GPU (JAX_PLATFORMS unset or ``cuda``).
"""

from __future__ import annotations

import os
import sys

import workbench as wb

OPTIONS = {"d_model": 2048, "n_layers": 16, "n_heads": 16, "vocab": 32000, "max_len": 1024}
BATCH, SEQ_LEN, PRECISION, MESH = 16, 1024, "bf16", "data=1"
if os.environ.get("SMALL"):  # a smoke test of the script itself, on any machine
    OPTIONS, BATCH, SEQ_LEN = {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab": 256, "max_len": 64}, 4, 64
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


TRAIN_STEPS = 12


def train_one(remat: str) -> dict:
    """``remat``'s step on this machine's first GPU: planned, compiled and allocator peaks, and tokens per second
    over :data:`TRAIN_STEPS` steps after the first (one batch of random tokens, as the trainer places it)."""
    import time

    import jax

    data = {"vocab_size": OPTIONS["vocab"], "seq_len": SEQ_LEN, "num_train": 4 * BATCH, "num_eval": BATCH}
    config = wb.TrainConfig(model="transformer", data="tokens", data_options=data,
                            model_options=OPTIONS, mode="dp", mesh=MESH, batch=BATCH, precision=PRECISION,
                            optimizer="adamw", remat=remat)
    plan = wb.plan_training("transformer", OPTIONS, MESH, "dp", hardware="h200", global_batch=BATCH, seq_len=SEQ_LEN,
                            precision=PRECISION, remat=remat, compiler="gpu")
    built = wb.training.build_step(config)
    mode = built.mode
    state = mode.place_state(built.state)
    batch = mode.place_batch(built.first_batches(1)[0])
    stats = mode.compile_step(state, batch).memory_analysis()
    compiled = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
                + stats.temp_size_in_bytes)
    state, metrics = mode.step(state, batch)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(TRAIN_STEPS):
        state, metrics = mode.step(state, batch)
    jax.block_until_ready(metrics)
    seconds = (time.perf_counter() - start) / TRAIN_STEPS
    live = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use", 0)
    return {"remat": remat, "plan_peak": plan.peak_bytes, "compiled_peak": compiled, "allocator_peak": live,
            "step_s": seconds, "tokens_per_s": BATCH * SEQ_LEN / seconds, "loss": float(metrics["loss"]),
            "plan_flops": plan.flops_per_device, "plan_remat_flops": plan.remat_flops_per_device}


def train_all(timeout_s: float = 120.0) -> None:
    """:func:`train_one` for every policy, each in a child process with a time limit; one JSON line each."""
    import json
    import subprocess

    for remat in wb.training.REMAT_POLICIES:
        try:
            done = subprocess.run([sys.executable, __file__, "train-one", remat], capture_output=True, text=True,
                                  timeout=timeout_s)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            print(lines[-1] if lines else json.dumps({"remat": remat, "failed": done.stderr[-800:]}), flush=True)
        except subprocess.TimeoutExpired:  # run() kills the child on timeout
            print(json.dumps({"remat": remat, "failed": f"over {timeout_s:.0f} s"}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"]:
        train_all()
    elif sys.argv[1:2] == ["train-one"]:
        import json

        print(json.dumps(train_one(sys.argv[2])), flush=True)
    else:
        probe(sys.argv[1] if len(sys.argv) > 1 else None)
