"""libtpu's buffer assignment read into a step's temporaries in HBM and in on-chip VMEM
(workbench/analysis/tpu_buffers.py).

The excerpts are libtpu's own lines (JAX 0.10's libtpu 0.0.42, and JAX 0.12's, which adds a page to each allocation);
compiling with libtpu itself is tests/test_verification.py's TPU test.
"""

from pathlib import Path

import pytest

from workbench.analysis.tpu_buffers import TpuBuffers, compile_reading_buffers, read_buffer_assignment

JAX_0_10 = """BufferAssignment:
allocation 0: size 512, thread-local:
 value: <119 add.1832 @0> (size=512,offset=0): bf16[]{:T(256)}
allocation 1: size 1048576, parameter 64, shape |f32[1024,256]| at ShapeIndex {}, maybe-live-out:
allocation 590: size 96768, constant:
allocation 613: size 832, output shape is |(f32[], f32[])|, maybe-live-out:
allocation 614: size 7422144, preallocated-temp:
 value: <5 fusion.12 @0> (size=65536,offset=0): f32[16,1024]{1,0:T(8,128)}
allocation 615: size 184, color 2, preallocated-temp:
allocation 616: size 2048, color 6, preallocated-temp:
allocation 617: size 45814272, color 1, preallocated-temp:
"""
JAX_0_12 = """allocation 0: size 512, page 0, thread-local:
allocation 1: size 1048576, page 0, parameter 64, shape |f32[1024,256]| at ShapeIndex {}, maybe-live-out:
allocation 614: size 11747360, page 0, preallocated-temp:
allocation 615: size 184, color 2, page 0, preallocated-temp:
allocation 617: size 4, color 8, page 0, preallocated-temp:
allocation 618: size 0, color 7, page 0, preallocated-temp:
allocation 619: size 46031360, color 1, page 0, preallocated-temp:
"""


@pytest.mark.parametrize("text,expected", [(JAX_0_10, TpuBuffers(7422144, 45814272)),
                                           (JAX_0_12, TpuBuffers(11747360, 46031360))], ids=["jax-0.10", "jax-0.12"])
def test_the_temporaries_are_the_preallocated_blocks_in_hbm_and_in_vmem(text, expected):
    # Parameters, outputs, constants and per-thread scratch are not temporaries; the small spaces (SMEM and the like,
    # colors 2 and up) are neither HBM nor VMEM.
    assert read_buffer_assignment(text) == expected


def test_a_step_without_temporaries_in_a_space_holds_zero_bytes_there():
    assert read_buffer_assignment("allocation 3: size 4096, preallocated-temp:\n") == TpuBuffers(4096, 0)
    assert read_buffer_assignment("allocation 3: size 4096, color 1, preallocated-temp:\n") == TpuBuffers(0, 4096)


def test_text_without_a_preallocated_block_reads_as_none():
    assert read_buffer_assignment("allocation 0: size 512, thread-local:\nallocation 1: size 8, constant:\n") is None
    assert read_buffer_assignment("") is None


def test_the_dump_is_read_from_a_folder_that_is_gone_after_the_compile():
    # The compiler writes its dump where `xla_dump_to` says (libtpu's file name); the folder is removed after.
    seen = {}

    def compile_step(options):
        folder = Path(options["xla_dump_to"])
        (folder / "module_0000.jit__step_fn.cl_1.after_optimizations-buffer-assignment.txt").write_text(JAX_0_12)
        (folder / "module_0000.jit__step_fn.cl_1.after_optimizations.txt").write_text("HloModule jit__step_fn\n")
        seen["folder"] = folder
        return "compiled"

    compiled, buffers = compile_reading_buffers(compile_step)
    assert (compiled, buffers) == ("compiled", TpuBuffers(11747360, 46031360))
    assert not seen["folder"].exists()
    assert compile_reading_buffers(lambda options: "compiled") == ("compiled", None)  # wrote none (not libtpu)
