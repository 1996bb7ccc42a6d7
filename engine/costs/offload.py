"""Host-side times of ZeRO-Offload and ZeRO-Infinity: an optimizer step run by the host's CPUs
(its state in host memory or on NVMe) and the copies it needs, read by the task-graph builder
(:mod:`engine.taskgraph.emit`) for a strategy that offloads its optimizer."""

from __future__ import annotations

__all__ = ["host_optimizer_time_s", "CPU_ADAM_PARAMS_PER_S", "NVME_BW_BYTES_PER_S", "HOST_BW_BYTES_PER_S",
           "NVME_STATE_BYTES_PER_PARAM"]

#: DeepSpeed's CPU-Adam over a whole host: ZeRO-Offload (Ren et al. ATC'21, Table 3) times one
#: step over 1 billion parameters at 0.22 s on a DGX-2 host (2 x 24-core Xeon Platinum 8168,
#: AVX512 and OpenMP; PyTorch's CPU Adam: 1.39 s), i.e. ~4.5e9 parameters/s. The GPUs of a node
#: each run CPU-Adam over their own shard at once, so each gets its share of the cores:
#: this rate / the node's GPUs.
CPU_ADAM_PARAMS_PER_S = 1e9 / 0.22
#: NVMe bandwidth of one node, shared by its GPUs: ZeRO-Infinity (Rajbhandari et al. SC'21,
#: §3 and Fig. 2b) assumes ~25 GB/s of aggregate NVMe bandwidth on a DGX-2 node; a DGX A100's
#: eight U.2 NVMe drives (15 TB) are of the same order (~25 GB/s read at their datasheets' 3-7
#: GB/s each, writes slower). Reads and writes are priced alike.
NVME_BW_BYTES_PER_S = 25e9
#: Host<->GPU bandwidth of one GPU when the cluster states none: PCIe 4.0 x16's 32 GB/s
#: peak at the ~80% that pinned-memory copies reach (cudaMemcpy bandwidth tests).
HOST_BW_BYTES_PER_S = 25e9
#: Bytes per parameter ZeRO-Infinity moves to and from NVMe each step: fp32 master weight,
#: momentum and variance read, then written back (4 + 4 + 4, plus the fp32 gradient's 4
#: written by the gradient copy and read by the step): 16 each way.
NVME_STATE_BYTES_PER_PARAM = 16


def host_optimizer_time_s(params: float, host_bw_bytes_per_s: float = HOST_BW_BYTES_PER_S, nvme: bool = False,
                          grad_bytes: float = 2.0, param_bytes: float = 2.0, gpus_sharing_host: int = 1,
                          cpu_adam_params_per_s: float = CPU_ADAM_PARAMS_PER_S,
                          nvme_bw_bytes_per_s: float = NVME_BW_BYTES_PER_S) -> float:
    """Seconds of one GPU's optimizer step with the optimizer offloaded (ZeRO-Offload, Ren et
    al. ATC'21 §4; ZeRO-Infinity, Rajbhandari et al. SC'21 for ``nvme``), over ``params``
    parameters of its shard, in the simplest honest model (no overlap with the backward pass):

    * the gradients copied to the host: ``params x grad_bytes / host_bw``;
    * CPU-Adam over them at the GPU's share of the host's cores:
      ``params / (cpu_adam_params_per_s / gpus_sharing_host)``;
    * ``nvme``: the optimizer state read from and written back to NVMe
      (2 x :data:`NVME_STATE_BYTES_PER_PARAM` bytes per parameter) at the GPU's share of the
      node's NVMe bandwidth;
    * the updated parameters copied back: ``params x param_bytes / host_bw``.

    >>> round(host_optimizer_time_s(1e9, 25e9, gpus_sharing_host=1), 4)
    0.38
    """
    if params <= 0:
        return 0.0
    t = params * (grad_bytes + param_bytes) / host_bw_bytes_per_s
    t += params * gpus_sharing_host / cpu_adam_params_per_s
    if nvme:
        t += params * 2 * NVME_STATE_BYTES_PER_PARAM * gpus_sharing_host / nvme_bw_bytes_per_s
    return t
