"""Device types, devices, links and node specs, with the hardware constants they are built from
(sources cited per constant). See :mod:`engine.cluster`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping
GB = 1e9
GIB = 2**30
#: Largest cluster accepted (devices); beyond this the path tables and task graphs stop
#: being interactive. 16,384 is above every published run in ``published_runs_public.csv``.
MAX_DEVICES = 16384
#: Most links (one-directional queues) a cluster may have: a mesh node of n GPUs has n(n-1),
#: so this also bounds mesh nodes (512 GPUs); 2,048 DGX H100 nodes (16,384 GPUs) have 98,304.
MAX_LINKS = 2**18
# Physical ranges of rates and capacities: below them a file describes no real machine and
# times or utilisations stop being numbers (1e-300 bytes/s gives infinite transfer times).
# Files (the JSON Schema) are held to the whole range; a cluster built in code may go above a
# rate's maximum (1e18 bytes/s idealises a link that costs nothing) but not below its
# minimum, and must stay finite.
#: Link and memory bandwidth, bytes/s: 1 MB/s to 1 PB/s (NVLink4 is 4.5e11, HBM3 3.35e12).
BW_RANGE_BYTES_PER_S = (1e6, 1e15)
#: Peak FLOP/s of a device at any precision: 1 GFLOP/s to 1 EFLOP/s (an H100's fp8: 2e15).
FLOPS_RANGE_PER_S = (1e9, 1e18)
#: Memory of a device, bytes: 1 MiB to 1 PiB (an H100 has 80 GiB).
MEMORY_RANGE_BYTES = (2**20, 2**50)
#: Longest link latency, s (a round trip between continents is ~0.2 s).
MAX_LATENCY_S = 1.0
# Latencies are assumptions of the right order, to be calibrated against measurements
# (issue 3): NVLink/NVSwitch hop ~1 us, PCIe hop ~1 us, InfiniBand port-to-port plus
# host software ~2 us per direction. Small transfers are latency-bound; large ones are not.
NVLINK_LATENCY_S = 1e-6
PCIE_LATENCY_S = 1e-6
IB_LATENCY_S = 2e-6
#: Device types whose NVSwitch (third generation, DGX H100/H200) reduces in the switch
#: (NVLink SHARP): NCCL's NVLS all-reduce sends each rank's buffer once and reads the sum once
#: (NCCL 2.17 release notes; NVIDIA DGX H100 user guide), instead of the ring's 2(n-1)/n.
NVLS_DEVICE_TYPES = frozenset({"H100-SXM5-80GB", "H200-SXM-141GB"})
# Per-direction bandwidths, bytes/s (hardware_specs.csv).
NVLINK1_PAIR_BW = 20 * GB  # one NVLink1 link per GPU pair, 20 GB/s per direction (P100)
NVLINK2_PAIR_BW = 25 * GB  # one NVLink2 link, 25 GB/s per direction (V100)
A100_NVSWITCH_BW = 300 * GB  # 600 GB/s bidirectional per GPU (NVLink3, DGX A100)
H100_NVSWITCH_BW = 450 * GB  # 900 GB/s bidirectional per GPU (NVLink4, DGX H100)
V100_DGX2_NVSWITCH_BW = 150 * GB  # Megatron-LM 2019 blog: 300 GB/s between GPUs, bidirectional
PCIE3_BW = 15.75 * GB  # PCIe Gen3 x16 per direction
PCIE4_BW = 31.5 * GB  # PCIe Gen4 x16 per direction
PCIE5_BW = 63 * GB  # PCIe Gen5 x16 per direction
IB_FDR_BW = 56e9 / 8  # 56 Gb/s FDR InfiniBand (FlexFlow's K80 cluster)
IB_EDR_BW = 100e9 / 8  # 100 Gb/s per port per direction (IBTA)
IB_HDR_BW = 200e9 / 8
IB_NDR_BW = 400e9 / 8


@dataclass(frozen=True)
class DeviceType:
    """A kind of accelerator.

    Attributes
    ----------
    name : str
    peak_flops_per_s : mapping of precision -> FLOP/s
        Dense peak per dtype (``fp32``, ``tf32``, ``fp16``, ``bf16``, ``fp8``); a precision
        missing here is not supported by the device.
    mem_bw_bytes_per_s : float
    memory_bytes : int
    source : str
    """

    name: str
    peak_flops_per_s: Mapping[str, float]
    mem_bw_bytes_per_s: float
    memory_bytes: int
    source: str = ""

    def peak(self, precision: str) -> float:
        """Peak FLOP/s at ``precision``; ``ValueError`` when the device lacks it."""
        try:
            return self.peak_flops_per_s[precision]
        except KeyError:
            have = ", ".join(self.peak_flops_per_s)
            raise ValueError(f"{self.name} has no {precision} peak (it has {have})") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_flops_per_s": dict(self.peak_flops_per_s),
            "mem_bw_bytes_per_s": self.mem_bw_bytes_per_s,
            "memory_bytes": self.memory_bytes,
            "source": self.source,
        }


_CSV = "validation/hardware_specs.csv"
#: Device types of the presets, dense peaks (no 2:4 sparsity).
DEVICE_TYPES: dict[str, DeviceType] = {
    d.name: d
    for d in [
        DeviceType("A100-SXM4-40GB", {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
                   1555 * GB, 40 * GIB, f"NVIDIA A100 datasheet ({_CSV})"),
        DeviceType("A100-SXM4-80GB", {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
                   2039 * GB, 80 * GIB, f"NVIDIA A100 datasheet ({_CSV})"),
        DeviceType("H100-SXM5-80GB",
                   {"fp32": 66.9e12, "tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12, "fp8": 1978.9e12},
                   3350 * GB, 80 * GIB, f"NVIDIA H100 page, glennklockwood ({_CSV})"),
        # H200: the H100's GH100 compute with 141 GB of HBM3e at 4.8 TB/s (DGX BasePOD RA)
        DeviceType("H200-SXM-141GB",
                   {"fp32": 66.9e12, "tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12, "fp8": 1978.9e12},
                   4800 * GB, 141 * GB, f"NVIDIA DGX BasePOD reference architecture ({_CSV})"),
        DeviceType("V100-SXM2-32GB", {"fp32": 15.7e12, "fp16": 125e12}, 900 * GB, 32 * GIB,
                   f"NVIDIA V100 datasheet, AWS P3 post ({_CSV})"),
        # DGX-2H runs V100s at higher clocks: 130 TFLOP/s fp16 implied by the Megatron-LM
        # blog's "39 TF = 30% of peak" (derivation in the CSV); fp32 kept at the SXM2 figure.
        DeviceType("V100-SXM3-32GB", {"fp32": 15.7e12, "fp16": 130e12}, 900 * GB, 32 * GIB,
                   f"Megatron-LM 2019 blog, derived ({_CSV})"),
        DeviceType("P100-SXM2-16GB", {"fp32": 10.6e12, "fp16": 21.2e12}, 732 * GB, 16 * GIB,
                   f"NVIDIA P100 launch specs ({_CSV})"),
        # One GK210 die (half a K80 board): 8.73 TFLOP/s fp32 per board with boost / 2;
        # no fast fp16 path, so fp16 runs at the fp32 rate.
        DeviceType("K80-GK210", {"fp32": 8.73e12 / 2, "fp16": 8.73e12 / 2}, 240 * GB, 12 * GIB,
                   f"NVIDIA Tesla K80 board spec ({_CSV})"),
    ]
}


@dataclass(frozen=True)
class Device:
    """One accelerator: ``id`` is its index in the cluster (0..n-1), used in configs."""

    id: int
    name: str
    type: str
    node: int


@dataclass(frozen=True)
class Link:
    """A one-directional link (a queue in the simulator)."""

    id: int
    src: str
    dst: str
    bw_bytes_per_s: float
    latency_s: float
    kind: str

    def transfer_time_s(self, size_bytes: float) -> float:
        """FlexFlow's assumption 2: latency + size / bandwidth."""
        return self.latency_s + size_bytes / self.bw_bytes_per_s


@dataclass(frozen=True)
class NodeSpec:
    """A group of ``repeat`` identical nodes (sizes in elements, rates per direction)."""

    name: str
    gpus: int
    device_type: str
    intra_topology: str  # "switch" | "mesh"
    intra_bw_bytes_per_s: float
    intra_latency_s: float = NVLINK_LATENCY_S
    intra_kind: str = "nvlink"
    nics: int = 1
    nic_bw_bytes_per_s: float = IB_EDR_BW
    nic_latency_s: float = IB_LATENCY_S
    attach_bw_bytes_per_s: float = PCIE3_BW  # GPU <-> NIC (PCIe)
    repeat: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "repeat": self.repeat,
            "gpus": self.gpus,
            "device_type": self.device_type,
            "intra": {"topology": self.intra_topology, "kind": self.intra_kind,
                      "bw_bytes_per_s": self.intra_bw_bytes_per_s, "latency_s": self.intra_latency_s},
            "nics": {"count": self.nics, "bw_bytes_per_s": self.nic_bw_bytes_per_s,
                     "latency_s": self.nic_latency_s, "attach_bw_bytes_per_s": self.attach_bw_bytes_per_s},
        }


