"""Short explanations reachable from each view (Markdown)."""

from __future__ import annotations

__all__ = ["TOPICS"]

TOPICS: dict[str, tuple[str, str]] = {
    "soap": ("The SOAP dimensions", """
FlexFlow (Jia, Zaharia, Aiken, SysML'19) describes a parallel training step by four choices per operator:

* **Sample** — split the batch: each device runs the op on some of the samples (data parallelism).
  Parameters are replicated, so their gradients must be summed across devices (an all-reduce).
* **Operator** — run different ops on different devices (model parallelism between ops); tensors
  then move between devices.
* **Attribute** — split other dimensions of the data, such as the height and width of an image
  or the sequence; neighbouring pixels needed by a convolution ("halos") are exchanged.
* **Parameter** — split the op's parameters, such as a linear layer's output features; each
  device holds part of the weights and computes part of the output (tensor parallelism).

A *config* gives each op a degree per dimension and the devices of its partitions. soapbox also
splits **reduction** dims (row-parallel layers, whose partial sums are all-reduced) and has a
**replica** dim for ops that are simply repeated (Megatron's LayerNorms).
"""),
    "graph": ("The operator graph", """
Each dot is an operator; lines are the tensors between them (data flows left to right). Colours
show the op's config (how it is split). Click an op to see its output shape, parallel dims,
FLOPs, parameters, config and time on its devices, and to edit its config. With
"collapse blocks", each repeated block (a layer, an Inception module) is one dot; clicking it
selects all its ops, and an edit then applies to all of them.
"""),
    "gantt": ("The timeline", """
One iteration as simulated: a row per GPU (forward in blue, backward in orange, the optimizer
step in green), a row per GPU for the collectives it joins (gradient all-reduces), and a row per
link for transfers. FlexFlow's simulator runs each device and link as a FIFO queue of tasks,
each ready when its inputs are. The red outline is the **critical chain**: the tasks whose ends
set the iteration time — speeding up anything else does not help. Drag to zoom; past a few
thousand bars, neighbouring tasks are drawn merged until you zoom in.
"""),
    "pipeline": ("Pipelines and microbatches", """
With pipeline parallelism, consecutive groups of layers (stages) run on different devices and
the batch is cut into **microbatches** that flow through the stages one after another. GPipe
runs all forwards, then all backwards; 1F1B alternates one forward and one backward after a
warm-up, so fewer microbatches' activations are held at once (Narayanan et al. SC'21). The gap
at the start and end of each stage's row is the pipeline *bubble*:
(stages − 1) / (microbatches + stages − 1) of the time when every stage takes as long.
"""),
    "topology": ("The cluster", """
GPUs (squares, coloured by how busy they are or how full their memory is), the switches and
NICs they connect through, and the network fabric between nodes. Hover a link for its
bandwidth. Transfers take latency + bytes / bandwidth on each link they cross; collectives are
timed by NCCL's own cost model (ring or tree, with its protocols' latencies and bandwidth
shares; in-switch reduction, NVLS, inside H100 and H200 nodes).
"""),
    "memory": ("Memory", """
Per GPU: weights, gradients and Adam's optimizer state (2 moments, plus an fp32 master copy in
mixed precision; ZeRO shards them), communication buffers, and the activations saved for the
backward pass at their peak over the iteration. A strategy over any GPU's capacity (red line)
is infeasible: the search rejects it.
"""),
    "search": ("Searching", """
FlexFlow's MCMC search proposes a change to one op's config, re-simulates only what the change
touches (delta simulation), and accepts it with probability min(1, exp(β·(old − new))): better
strategies always, worse ones sometimes, so the search can leave local optima. Several chains
start from data parallel, the expert strategy and random strategies; at each rung the worse half
is dropped (successive halving). Adopt the best to edit or compare it.
"""),
}
