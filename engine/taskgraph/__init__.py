"""Task graphs: (OpGraph, Strategy, Cluster) -> arrays of compute, transfer and collective tasks.

Following FlexFlow's execution simulator (Jia et al. SysML'19 §5), every partition of every op
gets a forward and a backward *compute task* on its device, per microbatch, and data moves in
*transfer tasks* wherever a consumer partition needs a region of a tensor that another device
holds (size = overlap volume x bytes per element). Beyond FlexFlow:

* **Reductions.** A producer split along a reduction dim (row-parallel linear, vocabulary-
  parallel embedding) holds partial sums: an all-reduce (a reduce-scatter when the consumers
  are split the same way under sequence parallelism) runs before consumers read. In the
  backward pass, consumer partitions that each read a whole input they do not split (a
  column-parallel linear's input) hold partial input gradients, reduced the same way.
* **Gradient synchronisation** of replicated parameters: one collective per group of
  partitions holding the same parameter region, over that group's real links, starting when
  the group's last backward task ends, so it overlaps the rest of the backward pass. ZeRO
  stages 1-2 reduce-scatter gradients and all-gather parameters after the update; stage 3
  (FSDP) also all-gathers parameters before each forward and backward and reduce-scatters
  gradients per microbatch (Rajbhandari et al. SC'20).
* **Pipelines.** Microbatches run in GPipe, 1F1B or interleaved 1F1B order (Narayanan et al.
  SC'21 §2.2), enforced by zero-duration barrier tasks between consecutive schedule units on
  each device; with one stage and several microbatches this is gradient accumulation.
* **Recomputation**: full recomputation reruns every op's forward before its backward;
  selective reruns the attention core (Korthikanti et al. 2022).
* **Transfers over several links** are one task per link, pipelined (cut-through): hop k+1
  may start ``latency_k`` after hop k starts, and every hop streams for the bottleneck time, so
  an uncontended transfer takes sum(latency) + bytes / min(bandwidth), as on real networks.

Tasks are numbered and stored as NumPy arrays (``[task]``); dependencies as CSR successor
lists. No Python object is made per task. A first build makes a segment whose inputs twin an
earlier one's (the identical layers of a pipeline stage) by copying it (:mod:`.twins`).

Preconditions not checked here: the strategy passed :func:`engine.strategy.validate_strategy`.
"""

from __future__ import annotations

from .builder import TaskGraphBuilder, build_task_graph
from .estimate import estimate_symmetric_tasks, estimate_tasks, symmetric_task_bound
from .estimate import count_text, quick_task_bound, tasks_within
from .schedule import schedule_order, unit_order
from .symmetry import Symmetry, find_symmetry, forget_found
from .tasks import BARRIER, BWD, COLL, COLL_INDEX, COLL_NAMES, FWD, KIND_NAMES, OFFLOAD, UPDATE, XFER, TaskGraph

__all__ = [
    "TaskGraph",
    "TaskGraphBuilder",
    "Symmetry",
    "find_symmetry",
    "forget_found",
    "build_task_graph",
    "estimate_tasks",
    "estimate_symmetric_tasks",
    "symmetric_task_bound",
    "quick_task_bound",
    "tasks_within",
    "count_text",
    "schedule_order",
    "unit_order",
    "FWD",
    "BWD",
    "XFER",
    "COLL",
    "UPDATE",
    "BARRIER",
    "OFFLOAD",
    "KIND_NAMES",
    "COLL_NAMES",
    "COLL_INDEX",
]
