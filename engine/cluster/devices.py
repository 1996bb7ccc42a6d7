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
#: Device types whose NVSwitch reduces in the switch (NVLink SHARP): NCCL's NVLS all-reduce
#: sends each rank's buffer once and reads the sum once (NCCL 2.17 release notes; NVIDIA DGX
#: H100 user guide), instead of the ring's 2(n-1)/n. Third-generation NVSwitch (DGX H100/H200,
#: HGX H100 as in Grand Teton) and the fifth-generation NVLink switches of DGX B200 and
#: GB200 NVL72 (NVIDIA Blackwell architecture technical brief: "NVLink SHARP" in the switch).
NVLS_DEVICE_TYPES = frozenset({"H100-SXM5-80GB", "H200-SXM-141GB", "H100-SXM5-96GB-HBM2e-500W",
                               "B200-SXM-180GB", "B200-GB200-186GB", "B300-SXM-270GB", "B300-GB300-288GB"})
#: GPU architectures a :class:`DeviceType` may name (``""``: not stated).
ARCHS = ("kepler", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")
# Per-direction bandwidths, bytes/s (hardware_specs.csv).
NVLINK1_PAIR_BW = 20 * GB  # one NVLink1 link per GPU pair, 20 GB/s per direction (P100)
NVLINK2_PAIR_BW = 25 * GB  # one NVLink2 link, 25 GB/s per direction (V100)
A100_NVSWITCH_BW = 300 * GB  # 600 GB/s bidirectional per GPU (NVLink3, DGX A100)
H100_NVSWITCH_BW = 450 * GB  # 900 GB/s bidirectional per GPU (NVLink4, DGX H100)
V100_DGX2_NVSWITCH_BW = 150 * GB  # Megatron-LM 2019 blog: 300 GB/s between GPUs, bidirectional
#: NVLink5: 18 links, 1.8 TB/s bidirectional per GPU (DGX B200 user guide: "14.4 TB/s
#: aggregate" for 8 GPUs; NVIDIA GB200 NVL72 spec table: "5th Generation NVLink: 1.8TB/s").
NVLINK5_NVSWITCH_BW = 900 * GB
#: GH200 quad node (HPE Cray EX254n on CSCS Alps; Eviden XH3000 on JUPITER): the four Hoppers
#: all-to-all, six NVLink4 links per pair = 150 GB/s per direction per pair (JSC JUPITER
#: configuration page: "300 GB/s between pairs of GPUs (150 GB/s per direction)"; CSCS Alps
#: hardware page, GH200 node schematic: 150 GB/s between GPUs).
GH200_NVLINK_PAIR_BW = 150 * GB
#: NVLink-C2C between a Grace CPU and its GPU: 900 GB/s total, 450 GB/s per direction (CSCS
#: GH200 schematic: "450GB/s per Dir"; JSC JUPITER page: "NVLink-C2C CPU-to-GPU link at 900 GB/s").
NVLINK_C2C_BW = 450 * GB
PCIE3_BW = 15.75 * GB  # PCIe Gen3 x16 per direction
PCIE4_BW = 31.5 * GB  # PCIe Gen4 x16 per direction
PCIE5_BW = 63 * GB  # PCIe Gen5 x16 per direction
IB_FDR_BW = 56e9 / 8  # 56 Gb/s FDR InfiniBand (FlexFlow's K80 cluster)
IB_EDR_BW = 100e9 / 8  # 100 Gb/s per port per direction (IBTA; also 100 GbE)
IB_HDR_BW = 200e9 / 8
IB_NDR_BW = 400e9 / 8  # 400 Gb/s (NDR InfiniBand, or 400 GbE RoCE as on Grand Teton)
#: 800 Gb/s (XDR InfiniBand, ConnectX-8 SuperNIC: DGX B300 and GB300 NVL72 give each GPU one)
IB_XDR_BW = 800e9 / 8
#: HPE Slingshot-11 (Cassini NIC): 200 Gb/s per NIC per direction (CSCS GH200 schematic:
#: "200Gb/s (25GB/s)", four per node).
SLINGSHOT11_BW = 200e9 / 8
MIB = 2**20


@dataclass(frozen=True)
class DeviceType:
    """A kind of accelerator.

    Attributes
    ----------
    name : str
    peak_flops_per_s : mapping of precision -> FLOP/s
        Dense peak per dtype (``fp32``, ``tf32``, ``fp16``, ``bf16``, ``fp8``); a precision
        missing here is not supported by the device. ``fp32`` is the SIMT (non-tensor) rate;
        the others are tensor-core rates with the accumulation training uses (fp32: on
        GeForce cards that is half the fp16-accumulate rate NVIDIA headlines).
    mem_bw_bytes_per_s : float
    memory_bytes : int
    source : str
    arch : str
        One of :data:`ARCHS`, or ``""`` when not stated.
    sms : int
        Streaming multiprocessors (0: unknown).
    clock_hz : float
        The boost clock the dense tensor peaks are quoted at (0: unknown). NVIDIA quotes
        Hopper's tensor peaks at a lower clock than its fp32 peak (H100 SXM: 1.83 vs 1.98 GHz).
    l2_bytes : int
        L2 cache (0: unknown); NVIDIA's "MB" of cache are MiB.
    tdp_w : float
        Board power limit the peaks are meant at (0: unknown). A capped part (Grand Teton's
        500 W H100) keeps the datasheet peak here; a cost model must read ``tdp_w``, not assume
        the datasheet's power.
    host_bw_bytes_per_s : float
        The GPU's own link to its CPU's memory, per direction (PCIe x16, or NVLink-C2C);
        0: unknown (:meth:`Cluster.host_bw_bytes_per_s` then falls back to the NIC attach rate).
    """

    name: str
    peak_flops_per_s: Mapping[str, float]
    mem_bw_bytes_per_s: float
    memory_bytes: int
    source: str = ""
    arch: str = ""
    sms: int = 0
    clock_hz: float = 0.0
    l2_bytes: int = 0
    tdp_w: float = 0.0
    host_bw_bytes_per_s: float = 0.0

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
            "arch": self.arch,
            "sms": self.sms,
            "clock_hz": self.clock_hz,
            "l2_bytes": self.l2_bytes,
            "tdp_w": self.tdp_w,
            "host_bw_bytes_per_s": self.host_bw_bytes_per_s,
        }


_CSV = "validation/hardware_specs.csv"
# Whitepapers named below: "NVIDIA A100 Tensor Core GPU Architecture" (2020), "NVIDIA H100
# Tensor Core GPU Architecture" (Hopper, 2022), "NVIDIA Tesla V100 GPU Architecture" (Volta,
# 2017), "NVIDIA Tesla P100" (Pascal, 2016), "NVIDIA Turing GPU Architecture" (2018),
# "NVIDIA Ampere GA102 GPU Architecture" (v2.0, 2021), "NVIDIA Ada GPU Architecture"
# (2022/23), and NVIDIA's GB200 NVL72 / HGX B200 spec table
# (https://www.nvidia.com/en-us/data-center/gb200-nvl72/ , .../hgx/). Figures "derived" are
# arithmetic on published ones; "not re-read" ones are standard datasheet values this change
# did not re-open. Blackwell peaks are NVIDIA's sparse figures halved.
_HOPPER_PEAKS = {"fp32": 66.9e12, "tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12, "fp8": 1978.9e12}
#: Device types of the presets, dense peaks (no 2:4 sparsity).
DEVICE_TYPES: dict[str, DeviceType] = {
    d.name: d
    for d in [
        # A100 whitepaper: 108 SMs at 1410 MHz, 40 MB L2, 400 W (SXM4), PCIe Gen4 host link.
        DeviceType("A100-SXM4-40GB", {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
                   1555 * GB, 40 * GIB, f"NVIDIA A100 datasheet ({_CSV})", arch="ampere", sms=108,
                   clock_hz=1.41e9, l2_bytes=40 * MIB, tdp_w=400, host_bw_bytes_per_s=PCIE4_BW),
        DeviceType("A100-SXM4-80GB", {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
                   2039 * GB, 80 * GIB, f"NVIDIA A100 datasheet ({_CSV})", arch="ampere", sms=108,
                   clock_hz=1.41e9, l2_bytes=40 * MIB, tdp_w=400, host_bw_bytes_per_s=PCIE4_BW),
        # Hopper whitepaper: 132 SMs, 50 MB L2, 700 W, PCIe Gen5; tensor peaks at 1.83 GHz
        # (989.4e12 / (132 SMs x 4096 dense FLOP/clk), derived; fp32's 66.9 is at 1.98 GHz).
        DeviceType("H100-SXM5-80GB", dict(_HOPPER_PEAKS), 3350 * GB, 80 * GIB,
                   f"NVIDIA H100 page, glennklockwood ({_CSV})", arch="hopper", sms=132, clock_hz=1.83e9,
                   l2_bytes=50 * MIB, tdp_w=700, host_bw_bytes_per_s=PCIE5_BW),
        # H200: the H100's GH100 compute with 141 GB of HBM3e at 4.8 TB/s (DGX BasePOD RA)
        DeviceType("H200-SXM-141GB", dict(_HOPPER_PEAKS), 4800 * GB, 141 * GB,
                   f"NVIDIA DGX BasePOD reference architecture ({_CSV})", arch="hopper", sms=132,
                   clock_hz=1.83e9, l2_bytes=50 * MIB, tdp_w=700, host_bw_bytes_per_s=PCIE5_BW),
        # Volta whitepaper: 80 SMs at 1530 MHz, 6 MB L2; 300 W SXM2; PCIe Gen3 host link.
        DeviceType("V100-SXM2-32GB", {"fp32": 15.7e12, "fp16": 125e12}, 900 * GB, 32 * GIB,
                   f"NVIDIA V100 datasheet, AWS P3 post ({_CSV})", arch="volta", sms=80, clock_hz=1.53e9,
                   l2_bytes=6 * MIB, tdp_w=300, host_bw_bytes_per_s=PCIE3_BW),
        # DGX-2H runs V100s at higher clocks: 130 TFLOP/s fp16 implied by the Megatron-LM
        # blog's "39 TF = 30% of peak" (derivation in the CSV); fp32 kept at the SXM2 figure.
        # Clock derived from that peak: 130e12 / (80 SMs x 1024 FLOP/clk) = 1.587 GHz. 450 W:
        # NVIDIA DGX-2H datasheet (not re-read).
        DeviceType("V100-SXM3-32GB", {"fp32": 15.7e12, "fp16": 130e12}, 900 * GB, 32 * GIB,
                   f"Megatron-LM 2019 blog, derived ({_CSV})", arch="volta", sms=80, clock_hz=130e12 / 81920,
                   l2_bytes=6 * MIB, tdp_w=450, host_bw_bytes_per_s=PCIE3_BW),
        # Pascal P100 whitepaper: 56 SMs at 1480 MHz, 4 MB L2, 300 W (not re-read).
        DeviceType("P100-SXM2-16GB", {"fp32": 10.6e12, "fp16": 21.2e12}, 732 * GB, 16 * GIB,
                   f"NVIDIA P100 launch specs ({_CSV})", arch="pascal", sms=56, clock_hz=1.48e9,
                   l2_bytes=4 * MIB, tdp_w=300, host_bw_bytes_per_s=PCIE3_BW),
        # One GK210 die (half a K80 board): 8.73 TFLOP/s fp32 per board with boost / 2;
        # no fast fp16 path, so fp16 runs at the fp32 rate. 13 SMX of 192 cores at 875 MHz
        # boost (2 x 13 x 192 x 2 x 0.875e9 = 8.74e12, the board figure), 1.5 MB L2 per die;
        # 300 W per board = 150 W per die; the board's one PCIe Gen3 x16 is shared by its two
        # dies (host_bw is the link rate) (K80 board spec, not re-read).
        DeviceType("K80-GK210", {"fp32": 8.73e12 / 2, "fp16": 8.73e12 / 2}, 240 * GB, 12 * GIB,
                   f"NVIDIA Tesla K80 board spec ({_CSV})", arch="kepler", sms=13, clock_hz=0.875e9,
                   l2_bytes=1536 * 1024, tdp_w=150, host_bw_bytes_per_s=PCIE3_BW),
        # H100 PCIe (hpctech H100 spec table, in the CSV): 756 TF bf16 dense (1,513 sparse),
        # tf32 378, fp8 1,513, fp32 51.2 (114 SMs x 256 x 1.755 GHz); 80 GB HBM2e at 2.0 TB/s;
        # 350 W; PCIe Gen5. Tensor clock derived: 756e12 / (114 x 4096) = 1.62 GHz.
        DeviceType("H100-PCIe-80GB", {"fp32": 51.2e12, "tf32": 378e12, "fp16": 756e12, "bf16": 756e12,
                                      "fp8": 1513e12},
                   2000 * GB, 80 * GIB, f"NVIDIA H100 datasheet via hpctech ({_CSV})", arch="hopper", sms=114,
                   clock_hz=756e12 / (114 * 4096), l2_bytes=50 * MIB, tdp_w=350, host_bw_bytes_per_s=PCIE5_BW),
        # Meta's Grand Teton H100 (torchtitan docs/performance.md: "Each H100 GPU is equipped
        # with 96GB HBM2e with 2.4 TB/sec peak memory bandwidth ... We used the default 500W
        # power limit"). The torchtitan paper (arXiv 2410.06511): "non-standard ... limited to
        # a lower TDP. The actual peak TFLOPs should be between SXM and NVL, and we don't know
        # the exact value". No public clock at 500 W: the SXM datasheet peaks are kept, and
        # tdp_w = 500 says the part is capped (do not treat it as the 700 W H100).
        DeviceType("H100-SXM5-96GB-HBM2e-500W", dict(_HOPPER_PEAKS), 2400 * GB, 96 * GIB,
                   "torchtitan docs/performance.md (Grand Teton); H100 SXM datasheet peaks", arch="hopper",
                   sms=132, clock_hz=1.83e9, l2_bytes=50 * MIB, tdp_w=500, host_bw_bytes_per_s=PCIE5_BW),
        # GH200 (Hopper + Grace on NVLink-C2C): H100 SXM compute (GH200 datasheet lists the
        # same sparse peaks: 3,958 fp8 / 1,979 bf16), 132 SMs (JSC JUPITER configuration page:
        # "132 multiprocessors, 96 GB HBM3 memory at 4 TB/s", "NVLink-C2C ... 900 GB/s").
        # tdp_w: the superchip module (CPU + GPU + memory) is programmable up to 1,000 W; JUPITER
        # runs 680 W, Alps does not publish its limit.
        DeviceType("GH200-96GB", dict(_HOPPER_PEAKS), 4000 * GB, 96 * GIB,
                   "JSC JUPITER configuration page; CSCS Alps GH200 schematic; GH200 datasheet", arch="hopper",
                   sms=132, clock_hz=1.83e9, l2_bytes=50 * MIB, tdp_w=1000, host_bw_bytes_per_s=NVLINK_C2C_BW),
        # GH200 with HBM3e: 144 GB at 4.9 TB/s (NVIDIA GH200 datasheet, 2024; not re-read:
        # AnandTech SC23 and the August 2023 announcement give "141 GB HBM3e at 5 TB/s" for the
        # first plan; the shipped GH200 datasheet says 144 GB, 4.9 TB/s).
        DeviceType("GH200-144GB", dict(_HOPPER_PEAKS), 4900 * GB, 144 * GIB,
                   "NVIDIA GH200 datasheet (not re-read)", arch="hopper", sms=132, clock_hz=1.83e9,
                   l2_bytes=50 * MIB, tdp_w=1000, host_bw_bytes_per_s=NVLINK_C2C_BW),
        # B200 as in DGX/HGX B200 (NVIDIA HGX B200 spec table, per GPU: FP8 9 PF, FP16/BF16
        # 4.5 PF, TF32 2.2 PF, all sparse -> halved; FP32 75 TF; "Configurable up to 1,000W";
        # "PCIe Gen5: 128GB/s" = 64 per direction, the DGX's Xeon 8570 is Gen5). Memory: DGX
        # B200 user guide "8 x NVIDIA B200 GPUs that provide 1,440 GB total" = 180 GB each; DGX
        # B200 datasheet 64 TB/s aggregate = 8 TB/s each (the HGX table says 7.7 TB/s).
        # SMs: 148 as CUDA reports them (third-party spec pages; NVIDIA's documents give no SM
        # count, clock or L2 for B200: those stay 0, unknown).
        DeviceType("B200-SXM-180GB", {"fp32": 75e12, "tf32": 1.1e15, "fp16": 2.25e15, "bf16": 2.25e15,
                                      "fp8": 4.5e15},
                   8000 * GB, int(180 * GB), "NVIDIA DGX B200 user guide; HGX B200 spec table (sparse halved)",
                   arch="blackwell", sms=148, tdp_w=1000, host_bw_bytes_per_s=PCIE5_BW),
        # The B200 of GB200 NVL72 (NVIDIA GB200 NVL72 spec table, per GPU: FP8 10 PF, FP16/BF16
        # 5 PF, TF32 2.5 PF sparse -> halved; FP32 80 TF; "186GB HBM3E | 8TB/s"; "Configurable
        # up to 1,200W"). Its host link is NVLink-C2C to the Grace (900 GB/s per superchip;
        # whether both GPUs of a superchip share it or each gets 450 GB/s per direction is
        # not stated: we take the link's 450 per direction).
        DeviceType("B200-GB200-186GB", {"fp32": 80e12, "tf32": 1.25e15, "fp16": 2.5e15, "bf16": 2.5e15,
                                        "fp8": 5e15},
                   8000 * GB, int(186 * GB), "NVIDIA GB200 NVL72 spec table (sparse halved)", arch="blackwell",
                   sms=148, tdp_w=1200, host_bw_bytes_per_s=NVLINK_C2C_BW),
        # Blackwell Ultra (B300) as in DGX/HGX B300. Per GPU, dense (sparse halved): FP8 4.5 PF,
        # FP16/BF16 2.25 PF, TF32 1.1 PF, FP32 75 TF, 270 GB HBM3e, 1.1 kW (Verda, "NVIDIA GB300
        # NVL72: GPU Architecture & Performance", per-GPU table after NVIDIA's; the DGX B300
        # datasheet's 72 PF FP8 for 8 GPUs is the sparse figure, as DGX B200's is); 8 TB/s
        # (G. Lockwood's B300 notes after NVIDIA's announcement; Verda lists 7.7). FP4 (13-15 PF
        # dense) is not a training precision soapbox models. SMs: NVIDIA's "Inside NVIDIA Blackwell
        # Ultra" technical blog (2025): 160 SMs in the full GPU (the GB300's, whose 15 PF dense
        # NVFP4 it quotes; HGX B300's own count is not published: taken as 160). No clock.
        DeviceType("B300-SXM-270GB", {"fp32": 75e12, "tf32": 1.1e15, "fp16": 2.25e15, "bf16": 2.25e15,
                                      "fp8": 4.5e15},
                   8000 * GB, int(270 * GB), "Verda GB300 NVL72 per-GPU table; G. Lockwood's B300 notes; NVIDIA "
                   "'Inside NVIDIA Blackwell Ultra' (SMs)", arch="blackwell", sms=160, tdp_w=1100,
                   host_bw_bytes_per_s=PCIE5_BW),
        # The B300 of GB300 NVL72: FP8 5 PF, FP16/BF16 2.5 PF, TF32 1.25 PF dense, FP32 80 TF,
        # 1.4 kW (Verda's per-GPU table); 288 GB HBM3e (NVIDIA's GB300 NVL72 page: "up to 21 TB"
        # of HBM3e in 72 GPUs; the Megatron-Bridge performance summary's rows say 288 GB) at
        # 8 TB/s ("576 TB/s" over 72 GPUs). Host link: NVLink-C2C to its Grace, as GB200's.
        DeviceType("B300-GB300-288GB", {"fp32": 80e12, "tf32": 1.25e15, "fp16": 2.5e15, "bf16": 2.5e15,
                                        "fp8": 5e15},
                   8000 * GB, int(288 * GB), "Verda GB300 NVL72 per-GPU table; NVIDIA GB300 NVL72 page; NVIDIA "
                   "'Inside NVIDIA Blackwell Ultra' (160 SMs)", arch="blackwell", sms=160, tdp_w=1400,
                   host_bw_bytes_per_s=NVLINK_C2C_BW),
        # Turing whitepaper, GeForce RTX 2080 Ti reference board (the Founders Edition's 1635
        # MHz gives 14.2 / 56.9): 68 SMs at 1545 MHz, fp32 13.4 TF, fp16 tensor with FP32
        # accumulate 53.8 TF (GeForce: half the fp16-accumulate 107.6; training accumulates in
        # fp32), no bf16/tf32; 11 GB GDDR6 at 616 GB/s; 5.5 MB L2; 250 W; PCIe Gen3 x16.
        DeviceType("RTX-2080-Ti-11GB", {"fp32": 13.4e12, "fp16": 53.8e12}, 616 * GB, 11 * GIB,
                   "NVIDIA Turing GPU Architecture whitepaper (reference board)", arch="turing", sms=68,
                   clock_hz=1.545e9, l2_bytes=5632 * 1024, tdp_w=250, host_bw_bytes_per_s=PCIE3_BW),
        # TITAN RTX: full TU102, 72 SMs at 1770 MHz; "130 Tensor TFLOPS" with full-rate FP32
        # accumulate (576 tensor cores x 128 x 1.77e9 = 130.5e12); fp32 16.3 TF; 24 GB GDDR6 at
        # 672 GB/s; 6 MB L2; 280 W; PCIe Gen3 x16 (NVIDIA TITAN RTX page; Turing whitepaper).
        DeviceType("TITAN-RTX-24GB", {"fp32": 16.3e12, "fp16": 130e12}, 672 * GB, 24 * GIB,
                   "NVIDIA TITAN RTX product page; Turing whitepaper", arch="turing", sms=72, clock_hz=1.77e9,
                   l2_bytes=6 * MIB, tdp_w=280, host_bw_bytes_per_s=PCIE3_BW),
        # GA102 whitepaper v2.0, Appendix A (GeForce RTX 3090): 82 SMs at 1695 MHz, fp32 35.6
        # TF; "Peak FP16 Tensor TFLOPS with FP32 Accumulate 71/142" (dense/sparse), BF16 71,
        # TF32 35.6; 24 GB GDDR6X at 936 GB/s; 6 MB L2; 350 W; PCIe Gen4 x16.
        DeviceType("RTX-3090-24GB", {"fp32": 35.6e12, "tf32": 35.6e12, "fp16": 71e12, "bf16": 71e12},
                   936 * GB, 24 * GIB, "NVIDIA Ampere GA102 GPU Architecture whitepaper v2.0, Appendix A",
                   arch="ampere", sms=82, clock_hz=1.695e9, l2_bytes=6 * MIB, tdp_w=350,
                   host_bw_bytes_per_s=PCIE4_BW),
        # Ada whitepaper (GeForce RTX 4090): 128 SMs at 2520 MHz, fp32 82.6 TF; FP16/BF16
        # tensor with FP32 accumulate 165.2 dense (330.4 with fp16 accumulate), TF32 82.6; FP8
        # with FP32 accumulate 330.3 dense (half the fp16-accumulate 660.6, as every GeForce
        # rate; a spec page reading the whitepaper, waredb, gives the same); 24 GB GDDR6X at
        # 1,008 GB/s; 72 MB L2; 450 W; PCIe Gen4 x16.
        DeviceType("RTX-4090-24GB", {"fp32": 82.6e12, "tf32": 82.6e12, "fp16": 165.2e12, "bf16": 165.2e12,
                                     "fp8": 330.3e12},
                   1008 * GB, 24 * GIB, "NVIDIA Ada GPU Architecture whitepaper, Appendix (RTX 4090)", arch="ada",
                   sms=128, clock_hz=2.52e9, l2_bytes=72 * MIB, tdp_w=450, host_bw_bytes_per_s=PCIE4_BW),
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
    #: CPU memory of one node (all its sockets), bytes; 0: unknown. Shared by the node's GPUs
    #: (:meth:`Cluster.host_memory_bytes` gives a GPU's share), e.g. for ZeRO-Offload.
    host_memory_bytes: int = 0

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
            "host_memory_bytes": self.host_memory_bytes,
        }


