"""A back-of-the-envelope cost model: how long a collective or a step's maths takes on given hardware.

:func:`collective_time` prices all-gather, reduce-scatter and all-reduce with the bandwidth-optimal ring
algorithms (an all-reduce of ``V`` bytes over ``W`` devices: ``2 (W-1)/W * V / BW`` plus latency);
:func:`compute_time` is FLOPs at a utilisation of the chip's peak; :data:`HARDWARE` holds the presets.
First-order: no topology, contention or overlap. Formulas and sources: docs/design/cost-model.md.

Example:
    >>> hw = hardware("tpu-v5p")
    >>> round(collective_time("all-reduce", 4e9, 64, hw), 4)  # 1e9 float32 gradients over 64 chips
    0.0789
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..errors import WorkbenchError

# The compiler's steps also hold all-to-alls (libtpu reshards a value between two dimensions with them) and
# collective-permutes: priced so that a verified step's time counts what it compiled (step_time's ``collectives``).
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# Model FLOPs utilisation assumed when none is given. Well-tuned large LM training reaches roughly
# 40-60% (PaLM reported 46% on TPU v4; MegaScale 55% on GPUs); 50% is a round middle figure.
DEFAULT_UTILISATION = 0.5
GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One accelerator chip, as the cost model sees it.

    Attributes:
        name: the preset's name, e.g. ``"tpu-v5p"``.
        peak_flops: dense bfloat16 matmul FLOP/s per chip (no sparsity).
        memory_bytes: accelerator memory (HBM) per chip.
        bandwidth: bytes/s one chip sends to its ring neighbour: the one-direction figure of one link,
            which is what a single unidirectional ring over one mesh axis can use. A bidirectional ring
            or one spread over several links goes faster, so ring times here are conservative.
        latency_s: seconds per ring step (link hop plus software overhead): a rough figure.
        description: where each figure comes from.
        devices_per_host: chips that share the fast links (a GPU host's NVLink domain); None: one domain
            (a TPU slice's ICI spans it whole).
        host_bandwidth: bytes/s one chip sends to another host, one direction (its share of the network:
            InfiniBand or Ethernet); a collective whose group spans hosts is priced on it, the slower link.
        compiler: the compile target kind whose compiler builds its programs (``"cpu"``, ``"gpu"``,
            ``"tpu"``): the plan's memory follows that compiler's rules (:mod:`.compiler_rules`).
    """

    name: str
    peak_flops: float
    memory_bytes: int
    bandwidth: float
    latency_s: float
    description: str
    devices_per_host: int | None = None
    host_bandwidth: float | None = None
    compiler: str = "cpu"

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON-ready values."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """One line: ``tpu-v5p: 459 TFLOP/s bf16, 95.0 GiB, 100 GB/s per link one way, 1 us/step``."""
        across = (f", {self.host_bandwidth / 1e9:g} GB/s across hosts of {self.devices_per_host}"
                  if self.host_bandwidth else "")
        return (
            f"{self.name}: {self.peak_flops / 1e12:g} TFLOP/s bf16, {self.memory_bytes / GiB:.1f} GiB, "
            f"{self.bandwidth / 1e9:g} GB/s per link one way{across}, {self.latency_s * 1e6:g} us/step"
        )


HARDWARE: dict[str, Hardware] = {
    hw.name: hw
    for hw in (
        Hardware(
            "tpu-v5e", 197e12, 16 * GiB, 50e9, 1e-6,
            "Google Cloud TPU v5e docs (cloud.google.com/tpu/docs/v5e): 197 TFLOP/s bf16 per chip, 16 GB HBM2, "
            "400 GB/s bidirectional ICI per chip over 4 ports, i.e. 50 GB/s per link one way (as in the JAX "
            "'How to Scale Your Model' book, ICI 5e10 B/s one-way per link). Latency ~1 us per hop: rough.",
            compiler="tpu",
        ),
        Hardware(
            "tpu-v5p", 459e12, 95 * GiB, 100e9, 1e-6,
            "Google Cloud TPU v5p docs (cloud.google.com/tpu/docs/v5p): 459 TFLOP/s bf16 per chip, 95 GiB HBM2e, "
            "1,200 GB/s bidirectional ICI per chip over 6 ports (3-D torus), i.e. 100 GB/s per link one way "
            "(the 'How to Scale Your Model' book: 1e11 B/s one-way per link). Latency ~1 us per hop: rough.",
            compiler="tpu",
        ),
        Hardware(
            "tpu-v4", 275e12, 32 * GiB, 45e9, 1e-6,
            "Google Cloud TPU v4 docs (cloud.google.com/tpu/docs/v4): 275 TFLOP/s bf16 per chip, 32 GiB HBM2, 6 ICI "
            "ports (3-D torus); 45 GB/s per link one way from the 'How to Scale Your Model' book's table (ICI "
            "4.5e10 B/s one-way per link). Latency ~1 us per hop: rough.",
            compiler="tpu",
        ),
        Hardware(
            "tpu-v6e", 918e12, 32 * GiB, 100e9, 1e-6,
            "Google Cloud TPU v6e docs (cloud.google.com/tpu/docs/v6e): 918 TFLOP/s bf16 per chip, 32 GB HBM, "
            "800 GB/s bidirectional ICI per chip over 4 ports (2-D torus), i.e. 100 GB/s per link one way. "
            "Latency ~1 us per hop: rough.",
            compiler="tpu",
        ),
        Hardware(
            "a100-80gb", 312e12, 80 * GiB, 300e9, 3e-6,
            "NVIDIA A100 SXM4 80GB datasheet: 312 TFLOP/s dense bf16 (624 with sparsity), 80 GB HBM2e at 2.0 TB/s; "
            "NVLink 3 at 600 GB/s bidirectional per GPU through NVSwitch, i.e. 300 GB/s per direction, within an "
            "8-GPU HGX host. Across hosts: one 200 Gb/s HDR InfiniBand port per GPU (DGX A100), 25 GB/s one way. "
            "Latency ~3 us per ring step: rough.",
            devices_per_host=8, host_bandwidth=25e9, compiler="gpu",
        ),
        Hardware(
            "h100-nvlink", 989e12, 80 * GiB, 450e9, 3e-6,
            "NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense bf16 (1,979 with sparsity), 80 GB HBM3; NVLink 4 at "
            "900 GB/s bidirectional per GPU (18 links) through NVSwitch, i.e. 450 GB/s per direction, within an "
            "8-GPU HGX host. Across hosts: one 400 Gb/s NDR InfiniBand port per GPU (DGX H100), 50 GB/s one way. "
            "Latency ~3 us per ring step (NCCL small-message figures): rough.",
            devices_per_host=8, host_bandwidth=50e9, compiler="gpu",
        ),
        Hardware(
            "h100-pcie", 756e12, 80 * GiB, 64e9, 5e-6,
            "NVIDIA H100 PCIe datasheet: 756 TFLOP/s dense bf16 (1,513 with sparsity), 80 GB HBM2e; PCIe Gen5 x16 "
            "at 128 GB/s bidirectional, i.e. ~64 GB/s per direction (no NVLink bridge), within a host of 8. "
            "Across hosts: a 200 Gb/s NIC per GPU assumed (PCIe servers vary), 25 GB/s one way. Latency ~5 us per "
            "ring step: rough.",
            devices_per_host=8, host_bandwidth=25e9, compiler="gpu",
        ),
        Hardware(
            "h200", 989e12, 141 * 10**9, 450e9, 3e-6,
            "NVIDIA H200 SXM datasheet: 989 TFLOP/s dense bf16 (as H100 SXM), 141 GB HBM3e at 4.8 TB/s; NVLink 4 "
            "at 900 GB/s bidirectional, 450 GB/s per direction, within an 8-GPU HGX host. Across hosts: 400 Gb/s "
            "NDR InfiniBand per GPU, 50 GB/s one way. Latency ~3 us per ring step: rough.",
            devices_per_host=8, host_bandwidth=50e9, compiler="gpu",
        ),
        Hardware(
            "b200", 2250e12, 180 * 10**9, 900e9, 3e-6,
            "NVIDIA DGX B200 datasheet: 72 PFLOP/s FP8 training for 8 GPUs, i.e. 2,250 TFLOP/s dense bf16 per "
            "GPU; 180 GB HBM3e at 8 TB/s (XLA's spec: 191.5 GB); NVLink 5 at 1.8 TB/s bidirectional, 900 GB/s "
            "per direction, within 8 GPUs. Across hosts: 400 Gb/s ConnectX-7 per GPU, 50 GB/s one way. Latency "
            "~3 us per ring step: rough.",
            devices_per_host=8, host_bandwidth=50e9, compiler="gpu",
        ),
        Hardware(
            "cpu", 1e11, 16 * GiB, 10e9, 1e-5,
            "The local CPU, very rough: ~100 GFLOP/s (a 2,048^2 float32 matmul measured 145 GFLOP/s on the "
            "2-core development machine), 16 GiB of RAM, ~10 GB/s memory copies between simulated devices, "
            "~10 us per step. Simulated devices share the host, so each gets a fraction of these figures.",
        ),
    )
}
HARDWARE_NAMES: tuple[str, ...] = tuple(HARDWARE)


def hardware(name: str | Hardware) -> Hardware:
    """The preset called ``name`` (a :class:`Hardware` is returned as is).

    Raises :class:`~workbench.errors.WorkbenchError` listing the presets when there is none.

    Example:
        >>> hardware("h100-nvlink").bandwidth
        450000000000.0
    """
    if isinstance(name, Hardware):
        return name
    if name not in HARDWARE:
        raise WorkbenchError(f"unknown hardware {name!r}: choose one of {', '.join(HARDWARE_NAMES)}")
    return HARDWARE[name]


def _check_number(what: str, value: Any, example: str, *, integer: bool = False, minimum: float = 0) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value >= minimum or value != value:
        kind = "a whole number" if integer else "a number"
        raise WorkbenchError(f"{what}={value!r} must be {kind} >= {minimum}: use e.g. {what}={example}")


def collective_time(kind: str, nbytes: float, group_size: int, hw: str | Hardware, *,
                    spans_hosts: bool = False) -> float:
    """Seconds for one ring collective of ``nbytes`` (the full array per device) over ``group_size`` devices.

    ``kind`` is ``"all-reduce"``, ``"all-gather"``, ``"reduce-scatter"`` (formulas in the module docstring),
    ``"all-to-all"`` (each device sends ``(W-1)/W`` of its array, an all-gather's bytes) or
    ``"collective-permute"`` (each device sends its whole array once, to one other). A group of one device costs
    nothing. A group that ``spans_hosts`` runs at the speed of its slowest link: the hardware's
    :attr:`~Hardware.host_bandwidth` where it has one.

    Example:
        >>> hw = Hardware("toy", 1e12, 2**30, 1e9, 1e-6, "", devices_per_host=8, host_bandwidth=1e8)
        >>> collective_time("all-gather", 8e9, 8, hw)  # 7/8 * 8 s + 7 us
        7.000007
        >>> collective_time("all-gather", 8e9, 8, hw, spans_hosts=True)  # ten times slower links
        70.000007
    """
    if kind not in COLLECTIVES:
        raise WorkbenchError(f"unknown collective {kind!r}: choose one of {', '.join(COLLECTIVES)}")
    _check_number("bytes", nbytes, "4e9")
    _check_number("group_size", group_size, "8", integer=True, minimum=1)
    hw = hardware(hw)
    if group_size == 1:
        return 0.0
    steps = group_size - 1
    bandwidth = hw.host_bandwidth if spans_hosts and hw.host_bandwidth else hw.bandwidth
    if kind == "collective-permute":
        return nbytes / bandwidth + hw.latency_s
    one_pass = nbytes * steps / group_size / bandwidth + steps * hw.latency_s
    return 2 * one_pass if kind == "all-reduce" else one_pass


def group_spans_hosts(mesh: Any, axes: tuple[str, ...], devices_per_host: int | None) -> bool:
    """Whether a collective over ``axes`` of ``mesh`` (a MeshShape) reaches devices of several hosts.

    Devices fill hosts in the mesh's order (its last axis fastest, as jax.make_mesh lays them out), so a
    group stays in a host when every axis it runs over, with the axes after it, fits in one.

    Example:
        >>> from workbench.layout.mesh import MeshShape
        >>> mesh = MeshShape(("data", "model"), (64, 8))
        >>> group_spans_hosts(mesh, ("model",), 8), group_spans_hosts(mesh, ("data",), 8)
        (False, True)
    """
    if not devices_per_host:
        return False
    sizes = dict(zip(mesh.names, mesh.sizes, strict=True))
    for axis in axes:
        inner = math.prod(sizes[name] for name in mesh.names[mesh.names.index(axis):])
        if sizes[axis] > 1 and inner > devices_per_host:
            return True
    return False


def compute_time(flops: float, hw: str | Hardware, utilisation: float = DEFAULT_UTILISATION) -> float:
    """Seconds for ``flops`` of maths on one chip running at ``utilisation`` of its peak (MFU).

    Example:
        >>> compute_time(459e12, "tpu-v5p", utilisation=0.5)
        2.0
    """
    _check_number("flops", flops, "1e15")
    if isinstance(utilisation, bool) or not isinstance(utilisation, (int, float)) or not 0 < utilisation <= 1:
        raise WorkbenchError(f"utilisation={utilisation!r} must be in (0, 1]: use e.g. utilisation=0.5 (50% MFU)")
    return flops / (hardware(hw).peak_flops * utilisation)


@dataclasses.dataclass(frozen=True)
class ComputeBoundTest:
    """Whether a data-parallel step's maths hides its gradient synchronisation (see :func:`compute_bound_test`).

    Attributes:
        tokens_per_device: the actual per-device batch, in tokens (examples for non-sequence models).
        threshold_tokens: the per-device batch at which compute time equals communication time.
        compute_bound: ``tokens_per_device >= threshold_tokens``.
        hardware: the preset's name.
        sentence: the verdict in words.
        formula: how the threshold was computed, with the numbers.
    """

    tokens_per_device: float
    threshold_tokens: float
    compute_bound: bool
    hardware: str
    sentence: str
    formula: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compute_bound_test(
    tokens_per_device: float,
    hw: str | Hardware,
    *,
    bytes_per_param: float = 4,
    flops_per_param_per_token: float = 6.0,
    group_size: int | None = None,
    utilisation: float = DEFAULT_UTILISATION,
    unit: str = "tokens",
) -> ComputeBoundTest:
    """Is data-parallel training compute-bound? Compares the per-device batch with FLOP/s / bandwidth.

    Per step and device, with ``N`` parameters, ``b`` tokens per device, ``f`` training FLOPs per parameter
    and token (6: forward 2, backward 4), ``beta`` bytes per gradient element, peak ``F``, utilisation
    ``u``, link bandwidth ``BW`` and ``W`` devices in the data-parallel group:

    * compute takes ``f N b / (u F)``;
    * the gradient all-reduce (or FSDP's all-gather plus reduce-scatter: the same bytes) takes
      ``2 beta N (W-1)/W / BW`` (ring, latency ignored).

    ``N`` cancels, so communication hides under compute (with perfect overlap) when

        ``b >= (u F / BW) * (2 beta / f) * (W-1)/W``.

    In words: each device needs more tokens than its FLOP/s-to-bandwidth ratio, scaled by the bytes sent
    per FLOP done for each parameter. ``group_size=None`` takes the large-W limit ``(W-1)/W = 1``.

    Example:
        >>> compute_bound_test(4096, "tpu-v5p", bytes_per_param=2, utilisation=1.0).sentence
        'compute-bound: 4,096 tokens per device >= the 3,060 needed on tpu-v5p'
    """
    hw = hardware(hw)
    _check_number("tokens_per_device", tokens_per_device, "4096")
    _check_number("bytes_per_param", bytes_per_param, "4")
    if not flops_per_param_per_token > 0:
        raise WorkbenchError(f"flops_per_param_per_token={flops_per_param_per_token!r} must be > 0: use e.g. 6")
    compute_time(1.0, hw, utilisation)  # checks utilisation
    if group_size is not None:
        _check_number("group_size", group_size, "8", integer=True, minimum=1)
    ring = 1.0 if group_size is None else (group_size - 1) / group_size
    threshold = utilisation * hw.peak_flops / hw.bandwidth * (2 * bytes_per_param / flops_per_param_per_token) * ring
    bound = tokens_per_device >= threshold
    verdict = "compute-bound" if bound else "communication-bound"
    relation = ">=" if bound else "<"
    sentence = (f"{verdict}: {tokens_per_device:,.0f} {unit} per device {relation} the {threshold:,.0f} needed "
                f"on {hw.name}")
    ring_text = "" if group_size is None else f" * ({group_size}-1)/{group_size}"
    formula = (
        f"threshold = u*F/BW * 2*beta/f{' * (W-1)/W' if group_size else ''} = {utilisation:g} * {hw.peak_flops:.3g} / "
        f"{hw.bandwidth:.3g} * 2*{bytes_per_param:g}/{flops_per_param_per_token:.3g}{ring_text} "
        f"= {threshold:,.0f} {unit}"
    )
    return ComputeBoundTest(float(tokens_per_device), float(threshold), bool(bound), hw.name, sentence, formula)
