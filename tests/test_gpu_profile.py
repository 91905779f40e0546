"""A profile taken on a real GPU reads into the same timeline as a CPU one.

The fixture ``tests/data/h200-profile-mlp.tar.gz`` is a run folder profiled on an NVIDIA H200 (JAX 0.11.2, the mlp
in mode dp on data=1, 3 steps): its kernels lie on the GPU's stream threads (process ``/device:GPU:0``) with
``hlo_op`` and ``correlation_id`` but no ``device_ordinal`` or ``run_id``; the steps are told apart by the
host's launch of each (``cuGraphLaunch`` with the same correlation id) inside the host's ``Execute`` of its run.
"""

import collections
import tarfile
from pathlib import Path

import pytest

import workbench as wb
from workbench.analysis.memory_comparison import compare_memory
from workbench.views.profile_text import memory_table, profile_text

FIXTURE = Path(__file__).parent / "data" / "h200-profile-mlp.tar.gz"


@pytest.fixture
def h200_run(tmp_path):
    with tarfile.open(FIXTURE) as archive:
        _extract_plain_files(archive, tmp_path)
    return tmp_path / "gpu-profile-mlp"


def _extract_plain_files(archive: tarfile.TarFile, folder: Path) -> None:
    """``archive`` into ``folder``, refusing links, devices and paths that leave it: tarfile's ``"data"`` filter
    where this Python has it (3.11.4 on; Debian 12's python3 is 3.11.2, which lacks it), else the same checks."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(folder, filter="data")
        return
    for member in archive.getmembers():
        name = Path(member.name)
        if not (member.isfile() or member.isdir()) or name.is_absolute() or ".." in name.parts:
            raise ValueError(f"{FIXTURE.name}: {member.name!r} is not a plain file inside the archive")
    archive.extractall(folder)


def test_a_gpu_trace_reads_into_steps_of_kernels_on_their_device(h200_run):
    report = wb.read_profile(h200_run)
    assert report.timeline_error is None
    timeline = report.timeline
    assert timeline.module == "jit__step_fn" and timeline.devices == (0,)
    per_step = collections.Counter(op.step for op in timeline.ops)
    assert per_step == {0: 28, 1: 28, 2: 28}  # one CUDA-graph launch per step, 28 kernels each
    assert [step.step for step in timeline.steps] == [0, 1, 2]
    for step in timeline.steps:  # the kernels of one step, measured on the H200: 35-37 us apart
        assert 30 < step.wall_us < 40
    assert {op.layer for op in timeline.ops} >= {"hidden1", "hidden2", "output"}  # named from the step's HLO
    assert all(op.kind == "compute" for op in timeline.ops)  # one GPU: no collectives
    text = profile_text(report)
    assert "training steps 2 to 4 (3 steps)" in text and "no timeline" not in text


def test_the_gpu_allocators_figures_stand_beside_the_arrays_counted(h200_run):
    memory = wb.read_profile(h200_run).memory
    [device] = memory.devices
    # The H200's allocator agreed with the arrays counted and with the compiled peak: nothing to flag.
    assert device.in_use == 384_000 and device.peak_in_use == 1_309_696  # compiled peak: 1,305,412 B (0.3% apart)
    assert abs(device.in_use - device.live) < 0.02 * device.live and memory.flags == ()
    header = memory_table(memory).splitlines()[0]
    assert "allocator in use" in header and "allocator peak" in header


def test_an_allocator_holding_more_than_the_arrays_or_the_compiled_peak_is_flagged():
    compiled = {"argument_bytes": 1000, "output_bytes": 1000, "alias_bytes": 1000, "temp_bytes": 1000}
    sample = {"by_device": {0: {"state": 900, "batch": 100}}, "in_use": {0: 1500}, "peak_in_use": {0: 4000}}
    flags = compare_memory(None, compiled, [sample]).flags
    assert len(flags) == 2
    assert flags[0].startswith("device 0: the allocator has 1.5 KiB in use and the arrays counted are 1000 B (+500 B)")
    assert "the allocator's peak is 3.9 KiB and the compiled step's 2.0 KiB" in flags[1]
    cpu = {"by_device": {0: {"state": 900, "batch": 100}}, "in_use": None, "peak_in_use": None}
    assert compare_memory(None, compiled, [cpu]).flags == ()  # XLA:CPU keeps no allocator figures
    assert "allocator" not in memory_table(compare_memory(None, compiled, [cpu]))


def test_a_step_that_needs_more_than_the_allocators_limit_is_flagged():
    compiled = {"argument_bytes": 1000, "output_bytes": 1000, "alias_bytes": 1000, "temp_bytes": 9000}
    sample = {"by_device": {0: {"state": 900, "batch": 100}}, "in_use": {0: 1000}, "peak_in_use": {0: 10_000},
              "limit": {0: 8192}}
    memory = compare_memory(None, compiled, [sample])
    assert memory.devices[0].limit == 8192
    [flag] = memory.flags
    assert flag.startswith("device 0: the step needs 9.8 KiB at its peak and the allocator may hand out 8.0 KiB")
    assert "allocator limit" in memory_table(memory).splitlines()[0]
    roomy = {**sample, "limit": {0: 1 << 30}}
    assert compare_memory(None, compiled, [roomy]).flags == ()
