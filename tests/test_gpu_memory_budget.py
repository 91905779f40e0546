"""XLA:GPU's memory budget: the limit over which the compiler recomputes values, as XLA computes it from the GPU's
memory, the step's arguments and outputs, its slop factor and JAX's allocator share; and what a plan says about it.
(The compile that shows XLA:GPU recomputing down to it is in test_gpu_target.py: it needs the CUDA plugin.)"""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import workbench as wb
from workbench.analysis.gpu_memory_budget import (
    GpuMemoryBudget, gpu_memory_budget, over_budget_note, recomputed_toward_budget,
)
from workbench.analysis.gpu_target import GPU_CHIPS, chip_for_hardware
from workbench.cli.main import main
from workbench.errors import WorkbenchError

SMALL_LM = {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab": 256, "max_len": 32}
H100 = GPU_CHIPS["h100"]


def test_each_chip_gives_the_memory_xla_budgets_from():
    assert H100.memory_bytes == 84_942_979_072 and GPU_CHIPS["h200"].memory_bytes == 151_397_597_184
    assert all(64 * 2**30 < chip.memory_bytes < 200 * 2**30 for chip in GPU_CHIPS.values())
    assert chip_for_hardware("h200") is GPU_CHIPS["h200"] and chip_for_hardware("cpu") is None


def test_the_budget_is_xla_gpus_formula():
    # GetSchedulerMemoryLimit: (base - (arguments + outputs - aliased)) * slop / 100, integer bytes; base is 80% of
    # the memory without a GPU and the allocator's limit on one.
    io = 251_329_444  # the 1.3B fsdp step's on 512 H100s
    budget = gpu_memory_budget(H100.memory_bytes, io, xla_flags="", mem_fraction="")
    assert budget.without_gpu == (84_942_979_072 * 80 // 100 - io) * 95 // 100 == 64_317_901_122
    assert budget.on_gpu == (int(84_942_979_072 * 0.75) - io) * 95 // 100
    json.dumps(budget.to_json())


def test_the_slop_factor_and_allocator_share_are_read_as_xla_and_jax_read_them(monkeypatch):
    flags = "--xla_gpu_autotune_level=0 --xla_gpu_memory_limit_slop_factor=50 --xla_gpu_memory_limit_slop_factor=80"
    budget = gpu_memory_budget(100 * 2**30, 0, xla_flags=flags, mem_fraction=".5")
    assert (budget.slop_percent, budget.mem_fraction, budget.on_gpu) == (80, 0.5, 40 * 2**30)  # the last flag wins
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_memory_limit_slop_factor=0")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
    assert (gpu_memory_budget(2**30, 0).slop_percent, gpu_memory_budget(2**30, 0).mem_fraction) == (0, 0.9)
    with pytest.raises(WorkbenchError, match=r"--xla_gpu_memory_limit_slop_factor=high: it takes a whole percentage"):
        gpu_memory_budget(2**30, 0, xla_flags="--xla_gpu_memory_limit_slop_factor=high")
    with pytest.raises(WorkbenchError, match=r"XLA_PYTHON_CLIENT_MEM_FRACTION='most' is not a fraction"):
        gpu_memory_budget(2**30, 0, mem_fraction="most")
    with pytest.raises(WorkbenchError, match=r"XLA_PYTHON_CLIENT_MEM_FRACTION='1.5' is outside \(0, 1\]"):
        gpu_memory_budget(2**30, 0, mem_fraction="1.5")


@given(memory=st.integers(2**30, 2**38), io=st.integers(0, 2**38), slop=st.integers(0, 200),
       fraction=st.floats(0.05, 0.8))
def test_the_budget_shrinks_with_the_arguments_and_never_goes_below_zero(memory, io, slop, fraction):
    budget = GpuMemoryBudget(memory, io, slop, fraction)
    more = GpuMemoryBudget(memory, io + 2**20, slop, fraction)
    assert 0 <= budget.on_gpu <= budget.without_gpu  # the allocator's share is at most the 80% a compile assumes
    assert more.on_gpu <= budget.on_gpu and more.without_gpu <= budget.without_gpu


def test_only_a_compile_that_holds_clearly_less_than_a_plan_over_its_budget_recomputed():
    assert recomputed_toward_budget(78, 60, 60) and recomputed_toward_budget(78, 51, 31)  # as far as it went
    assert not recomputed_toward_budget(50, 40, 60)  # within the budget: the plan's own difference
    assert not recomputed_toward_budget(78, 77, 60)  # over it, but holding what the plan holds
    assert "allocator" not in over_budget_note(GpuMemoryBudget(2**30, 0), 2**30)
    assert "its peak, 1.0 GiB, is over the 768.0 MiB JAX's allocator takes (75% of the GPU" in over_budget_note(
        GpuMemoryBudget(2**30, 0), 2**30, peak_bytes=2**30)
    assert over_budget_note(GpuMemoryBudget(2**40, 0), 2**30) is None


def test_a_plan_for_a_gpu_names_its_budget_and_says_when_the_step_is_over_it():
    within = wb.plan_training("transformer", SMALL_LM, "data=8", "fsdp", global_batch=16, seq_len=32,
                              hardware="h100-nvlink")
    budget = within.gpu_budget
    assert budget.device_memory == H100.memory_bytes  # the chip's memory as XLA reads it, not the preset's 80 GiB
    assert budget.io_bytes == within.memory.argument_bytes + within.memory.output_bytes - within.memory.alias_bytes
    assert "XLA:GPU budget" in within.to_text() and not any("over XLA:GPU's budget" in n for n in within.notes)
    assert within.to_json()["per_device"]["xla_gpu_budget"]["on_gpu"] == budget.on_gpu
    # a GPU of 512 KiB (the plan's own memory, given): the same step's temporaries are over its budget
    over = wb.plan_training("transformer", SMALL_LM, "data=8", "fsdp", global_batch=16, seq_len=32,
                            hardware="h100-nvlink", device_memory="512KiB")
    assert over.gpu_budget.device_memory == 512 * 2**10 and over.memory.temp_bytes > over.gpu_budget.on_gpu
    assert any("over XLA:GPU's budget" in note and "--remat block" in note for note in over.notes)
    # simulated for another compiler: no budget
    assert wb.plan_training("transformer", SMALL_LM, "data=8", "fsdp", global_batch=16, seq_len=32,
                            hardware="cpu").gpu_budget is None


def test_a_bad_slop_factor_is_one_line_in_the_cli(capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_memory_limit_slop_factor=lots")
    code = main(["plan", "--model", "transformer", "--config", "d_model=64,n_layers=2,n_heads=4,vocab=256,max_len=32",
                 "--mesh", "data=8", "--mode", "fsdp", "--hardware", "h100-nvlink", "--seq-len", "32"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--xla_gpu_memory_limit_slop_factor=lots" in err, err
