"""The plan's simulated peak per device against the deviceless compilers' for GPU and TPU fleets: target 0.85-1.15
for XLA:GPU (workbench/analysis/compiler_rules.py) and for libtpu's medium steps on v5p; its small rows are reported,
since there libtpu keeps much of a step in on-chip VMEM and the plan says to trust libtpu's figure.

The GPU rows are the issue's H200 rows (one GPU, AdamW, dp: mlp, the 512-wide transformer in fp32 and bf16, the
1024-wide at batch 8 and 32, the 0.8B), the modes on 8 H200s and fsdp / fsdp-tp under remat ``block`` (and fsdp on
2,048-token sequences); each is ``plan_training(..., verify="gpu:h200:N")``, the compile in its own child as
``--verify`` runs it. Reported after ``make gpu-compile`` (and the TPU rows with the ``tpu`` extra: the small rows on
three generations, and three medium steps on v5p, about a minute each); about 3 minutes for the GPU rows on 2 cores.
Rows under 4 MiB per device and the mlp whose matmul XLA:GPU splits along its contraction (split-K, a buffer the jaxpr
does not show) are reported without a target. One step over XLA:GPU's memory budget
(the 1.3B unrolled on 512 H100s, a minute more) is held to the target against the step as written, and its compiled
temporaries to the budget.
"""

from __future__ import annotations

from timing import machine, record

from workbench.analysis.compile_target import libtpu_installed
from workbench.analysis.gpu_target import gpu_compiler_problem
from workbench.analysis.planning import plan_training

MiB, GiB = 2**20, 2**30


def _lm(d_model: int, layers: int, heads: int, seq: int) -> dict:
    return {"d_model": d_model, "n_layers": layers, "n_heads": heads, "vocab": 32000, "max_len": seq}


# name, model, options, mesh, mode, global batch, precision, sequence length, held to the target
GPU_ROWS = [
    ("mlp fp32 b256", "mlp", {}, "data=1", "dp", 256, "fp32", None, False),  # 1.2 MiB: under 4 MiB
    ("LM 512x4 s256 b16 fp32", "transformer", _lm(512, 4, 8, 256), "data=1", "dp", 16, "fp32", 256, True),
    ("LM 512x4 s256 b16 bf16", "transformer", _lm(512, 4, 8, 256), "data=1", "dp", 16, "bf16", 256, True),
    ("LM 1024x8 s512 b8 bf16", "transformer", _lm(1024, 8, 16, 512), "data=1", "dp", 8, "bf16", 512, True),
    ("LM 1024x8 s512 b32 bf16", "transformer", _lm(1024, 8, 16, 512), "data=1", "dp", 32, "bf16", 512, True),
    ("LM 0.8B 2048x16 s1024 b16 bf16", "transformer", _lm(2048, 16, 16, 1024), "data=1", "dp", 16, "bf16", 1024, True),
    ("LM 512x4 fsdp data=8 bf16", "transformer", _lm(512, 4, 8, 256), "data=8", "fsdp", 64, "bf16", 256, True),
    ("LM 512x4 dp-tp data=2,model=4 bf16", "transformer", _lm(512, 4, 8, 256), "data=2,model=4", "dp-tp", 32, "bf16",
     256, True),
    ("LM 512x4 tp model=8 bf16", "transformer", _lm(512, 4, 8, 256), "model=8", "tp", 16, "bf16", 256, True),
    ("mlp 2048 fsdp data=8 fp32 (split-K)", "mlp", {"hidden": 2048}, "data=8", "fsdp", 1024, "fp32", None, False),
]
# Per-layer fsdp under remat block: XLA:GPU's reduce-scatter combiner held every layer's gradients until the end
# (fsdp 273 MiB, plan 182) while a layer's input gradient did not wait for its reduce-scatter.
GPU_REMAT_ROWS = [  # the same, and remat
    ("LM 512x4 fsdp data=8 bf16 remat block", "transformer", _lm(512, 4, 8, 256), "data=8", "fsdp", 64, "bf16", 256,
     True, "block"),
    ("LM 512x4 fsdp-tp data=4,model=2 bf16 remat block", "transformer", _lm(512, 4, 8, 256), "data=4,model=2",
     "fsdp-tp", 64, "bf16", 256, True, "block"),
    # Long sequences, heads not split, blocks scanned: (batch, heads, T, T) buffers weigh (causal_attention).
    ("LM 256x4 s2048 fsdp data=8 bf16 scanned remat block", "transformer",
     {**_lm(256, 4, 8, 2048), "vocab": 8192, "scan_layers": True}, "data=8", "fsdp", 8, "bf16", 2048, True, "block"),
]
# Over XLA:GPU's memory budget: the 1.3B unrolled without remat on 512 H100s. The compiler recomputes values until its
# temporaries are at the budget (gpu_memory_budget.py); the verification compiles it again with the budget lifted.
BUDGET_ROW = ("LM 1.3B 2048x24 s2048 fsdp data=64,model=8 bf16 unrolled", "transformer",
              {**_lm(2048, 24, 16, 2048), "scan_layers": False}, "data=64,model=8", "fsdp", 512, "bf16", 2048)
TPU_ROWS = [  # 8 chips: the smallest slice every generation offers
    ("LM 512x4 fsdp data=8 bf16", "transformer", _lm(512, 4, 8, 256), "data=8", "fsdp", 64, "bf16", 256),
    ("LM 512x4 tp model=8 bf16", "transformer", _lm(512, 4, 8, 256), "model=8", "tp", 16, "bf16", 256),
]
TPU_TOPOLOGIES = ("v5e:2x4", "v6e:2x4", "v5p:2x2x2")
# Steps of some hundreds of MiB a chip, where VMEM (under 48 MiB on v5p) weighs less: 2 blocks of d_model 1,024 on
# 1,024 tokens, unrolled (the transformer's default), where libtpu's fusions weigh most (it computes a layer norm's
# broadcasts inside each reader, and a layer norm or a GELU inside the matmul reading it: compiler_rules.LIBTPU).
# Held to the target: 1.06, 1.04 and 1.05 (2026-11-29); 2.49, 2.32 and 1.63 before those rules.
_MEDIUM_LM = {**_lm(1024, 2, 8, 1024), "vocab": 1024}
TPU_MEDIUM_ROWS = [
    ("LM 1024x2 s1024 fsdp-tp data=2,model=4 bf16", "transformer", _MEDIUM_LM, "data=2,model=4", "fsdp-tp", 16, "bf16",
     1024),
    ("LM 1024x2 s1024 dp-tp data=2,model=4 bf16", "transformer", _MEDIUM_LM, "data=2,model=4", "dp-tp", 16, "bf16",
     1024),
    ("LM 1024x2 s1024 fsdp data=8 bf16", "transformer", _MEDIUM_LM, "data=8", "fsdp", 16, "bf16", 1024),
]


def _row(label: str, target: str, model: str, options: dict, mesh: str, mode: str, batch: int, precision: str,
         seq_len: int | None, held: bool, remat: str = "none") -> dict:
    plan = plan_training(model, options, mesh, mode, global_batch=batch, precision=precision, seq_len=seq_len,
                         remat=remat, verify=target)
    compiled = plan.compiled
    on_chip = ""
    if compiled.hbm_block_bytes is not None:  # libtpu: its HBM block, and its memory analysis's estimate (tpu_buffers)
        on_chip = (f": memory analysis {compiled.reported_temp_bytes / MiB:,.1f}, buffer assignment's HBM block "
                   f"{compiled.hbm_block_bytes / MiB:,.1f}; {(compiled.on_chip_bytes or 0) / MiB:,.1f} MiB in VMEM")
    return record(
        f"plan / {target.split(':')[0]} compiler peak: {label} ({target})", plan.peak_bytes / compiled.peak_bytes, "x",
        ("±", 1.0, 0.15) if held else None,
        note=f"plan {plan.peak_bytes / MiB:,.1f} MiB (temporaries {plan.memory.temp_bytes / MiB:,.1f}), compiler "
             f"{compiled.peak_bytes / MiB:,.1f} MiB (temporaries {compiled.temp_bytes / MiB:,.1f}{on_chip}) per "
             f"device, compiled in {compiled.compile_seconds:.1f} s; {machine()}",
    )


def _budget_rows() -> list[dict]:
    """The plan against the step as written (compiled with the budget lifted), and the compiled temporaries against
    the budget the compile had."""
    label, model, options, mesh, mode, batch, precision, seq_len = BUDGET_ROW
    target = "gpu:h100:512"
    plan = plan_training(model, options, mesh, mode, global_batch=batch, precision=precision, seq_len=seq_len,
                         verify=target)
    compiled, comparison = plan.compiled, plan.comparison
    if compiled.as_written_temp_bytes is None or comparison.recomputed_to_budget is None:
        raise RuntimeError(f"{label}: no longer reaches XLA:GPU's budget on {target}: choose a larger step")
    planned, written, budget = plan.memory.temp_bytes, compiled.as_written_temp_bytes, comparison.recomputed_to_budget
    note = (f"plan temporaries {planned / GiB:.1f} GiB, as written {written / GiB:.1f} GiB, compiled "
            f"{compiled.temp_bytes / GiB:.1f} GiB at a budget of {budget / GiB:.1f} GiB; compiled in "
            f"{compiled.compile_seconds:.1f} s (and again, lifted); {machine()}")
    return [
        record(f"plan / XLA:GPU temporaries as written: {label} ({target})",
               planned / written, "x", ("±", 1.0, 0.15), note=note),
        record(f"XLA:GPU temporaries / its budget: {label} ({target})",
               compiled.temp_bytes / budget, "x", ("<=", 1.0), note=note),
    ]


def run() -> list[dict]:
    records = []
    if gpu_compiler_problem() is None:
        for label, model, options, mesh, mode, batch, precision, seq_len, held in GPU_ROWS:
            devices = 1 if mesh == "data=1" else 8
            records.append(_row(label, f"gpu:h200:{devices}", model, options, mesh, mode, batch, precision, seq_len,
                                held))
        for label, model, options, mesh, mode, batch, precision, seq_len, held, remat in GPU_REMAT_ROWS:
            records.append(_row(label, "gpu:h200:8", model, options, mesh, mode, batch, precision, seq_len, held,
                                remat))
        records += _budget_rows()
    if libtpu_installed():
        for topology in TPU_TOPOLOGIES:
            for label, model, options, mesh, mode, batch, precision, seq_len in TPU_ROWS:
                records.append(_row(label, f"tpu:{topology}", model, options, mesh, mode, batch, precision, seq_len,
                                    False))
        for label, model, options, mesh, mode, batch, precision, seq_len in TPU_MEDIUM_ROWS:
            records.append(_row(label, "tpu:v5p:2x2x2", model, options, mesh, mode, batch, precision, seq_len, True))
    return records
