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
With "collapse blocks" (the default), a model built from blocks (transformer layers, Inception
modules) is drawn as a **stack**, inputs at the top: a square per block, and consecutive blocks
split alike (the same ops with the same configs on the same GPUs, in the same pipeline stage)
share one row with their count: "layers.0–15 (16 blocks, same split)". Each row says how many
ops a block has, its most common split, how many GPUs it uses and its pipeline stage; the colour
is the split (grey: mixed). Click a row to select all its ops (an edit then applies to all of
them) and to **expand** it: its first block's ops appear below, top to bottom, the ops of one
step side by side (q · k · v); click one of them to select that op alone. Lines are the tensors
between blocks (a bracket at the left for one that skips rows). Without "collapse blocks",
every op is a dot in a layered drawing, data flowing left to right. The op panel shows the
selected op's output shape, parallel dims, FLOPs, parameters, config and time on its devices;
memory is shown per GPU, not per op.
"""),
    "gantt": ("The timeline", """
One iteration as simulated: a row per GPU (forward in blue, backward in orange, the optimizer
step in green), a row for the collectives it joins (gradient all-reduces, tensor-parallel
reductions), and a row per link for transfers. FlexFlow's simulator runs each device and link as
a FIFO queue of tasks, each ready when its inputs are. The red outline is the **critical
chain**: the tasks whose ends set the iteration time; speeding up anything else does not help.

Many GPUs: identical replicas are simulated once and drawn once, "GPU 0 (x32 alike)". "rows"
draws each GPU, or one GPU per pipeline stage or per node with how many it stands for and how
far their busy times spread ("auto": each GPU up to 16 rows, else per stage or node). Link rows
show up to 16 by themselves; "show" / "hide" decides past that. The filter keeps rows by GPU
ids ("0-7, 12"), "stage 1", "node 2-3" or any text in a label ("collectives", "nic"). Drag to
zoom; past a few thousand bars, neighbouring tasks are drawn merged until you zoom in (the line
above the chart says so).
"""),
    "pipeline": ("Pipelines and microbatches", """
With pipeline parallelism, consecutive groups of layers (stages) run on different devices and
the batch is cut into **microbatches** that flow through the stages one after another. GPipe
runs all forwards, then all backwards; 1F1B alternates one forward and one backward after a
warm-up, so fewer microbatches' activations are held at once (Narayanan et al. SC'21). While
the first microbatches fill the pipeline and the last ones drain it, stages wait: the
*bubble*, hatched grey on the timeline. With p stages, m microbatches and every stage as long,
it takes (p − 1) / (m + p − 1) of the time; the interleaved schedule, v model chunks per GPU,
cuts it to (p − 1) / (v·m + p − 1). The line above the timeline gives the idle share measured
on the simulated GPUs next to that formula: more than the formula means stages of unequal
length or waits for transfers.
"""),
    "topology": ("The cluster", """
GPUs (squares, coloured by how busy they are or how full their memory is), the switches and
NICs they connect through, and the network fabric between nodes. Hover a link for its
bandwidth. Transfers take latency + bytes / bandwidth on each link they cross; collectives are
timed by NCCL's own cost model (ring or tree, with its protocols' latencies and bandwidth
shares; in-switch reduction, NVLS, inside H100 and H200 nodes).
"""),
    "memory": ("Memory", """
Per group of GPUs whose memory is the same (one bar, "stage 1 · GPU 32 (x32)"): weights,
gradients and Adam's optimizer state (2 moments, plus an fp32 master copy in mixed precision;
ZeRO stage 1 shards the optimizer state, 2 the gradients too, 3 the weights), communication
buffers, and the activations saved for the backward pass at their peak over the iteration
(recomputation keeps fewer). The parts add up to the GPU's peak. A bar past its capacity mark
(red) does not fit: the search rejects such a strategy, and the summary says "over!".
"Smallest cluster for this layout" rebuilds the layout (its tp, pp, micro-batch, ZeRO, ...;
data parallel fills each size) on every size of the cluster's family from one node, in the
background, and says the first on which it fits.
"""),
    "experts": ("Expert parallelism (mixture of experts)", """
A mixture-of-experts (MoE) layer replaces the MLP by many **experts** (small MLPs) and a
**router** that scores every token over them and sends it to its top-k (Mixtral: 8 experts,
top-2; DeepSeek-V3: 256, top-8). Each token passes through k experts only, so a MoE model has
far more parameters than it computes with (Mixtral: 46.7 B, 12.9 B active).

* **ep** (expert parallelism, Megatron's --expert-model-parallel-size) splits the experts over
  ep GPUs: with 8 experts and ep 8 each GPU holds one. Tokens live where attention left them,
  so each layer sends every token copy to the GPU holding its expert and back: two
  **all-to-alls** per layer forward (*dispatch* and *combine*) and two backward. They are
  drawn in wine red on the timeline's collectives rows; hover one to see which it is.
* **etp** (expert tensor parallelism) splits each expert's FFN width over etp GPUs, as tp
  splits a dense MLP; it must divide tp.
* **edp** (expert data parallelism) is what is left: tp x cp x dp / (ep x etp) copies of each
  expert, whose gradients are all-reduced like any replicated weights. ep folds onto the
  attention's tp x cp x dp GPUs (Megatron-Core's "parallel folding"), so it costs no GPUs of
  its own; ep must divide the experts, and tp > 1 with experts needs sequence parallelism.

**The slowest expert gates the step.** Every GPU of an expert-parallel group waits at the
combine for the one whose experts received the most tokens (GShard §2.2; Switch Transformer
§2.2). With balanced routing every expert gets tokens x top-k / experts; a skewed router
sends more to a few, and the busiest rank's share x ep is how much longer everyone takes. The
Experts panel (Explore, shown for MoE models) draws tokens and time per expert and per rank
for one layer, under balanced routing and under a what-if: a Zipf skew (expert i gets a share
proportional to 1/(i+1)^skew) or an uploaded histogram of measured token counts. "Apply
what-if" re-simulates the iteration with it. Published MoE runs are measured with balanced
routing (Megatron-Core's tables force it), and soapbox simulates balanced routing unless a
what-if is applied. Memory: the experts' weights, gradients and optimizer state are part of
the memory chart's bars; its hover says how much of them is routed experts'.
"""),
    "search": ("Searching", """
Five searches, one protocol (a budget, a seed, progress, a best strategy that fits in memory):

* **auto** (the default) runs the fast searches that apply as seeds, prices them with the
  baselines, polishes the best by coordinate descent (a few whole-strategy settings, then each
  op's configs in turn, those with the most parameters for their compute first (embeddings, then
  fully connected and recurrent layers, then convolutions), keeping the best; an op with alike
  twins, such as an unrolled RNN's time steps, also tries its best configs on the whole class at
  once; when that finds nothing faster, the next best start is polished too; a start it can only
  change by whole settings, its graph too large to re-simulate op by op, comes after one it can
  change op by op) and starts MCMC from it; it is never slower than a baseline or seed that fits.
* **mcmc**: FlexFlow's search. It proposes a change (one op's config, or a whole layout:
  recomputation, ZeRO, microbatches, the layer split between stages), re-simulates only what a
  one-op change touches (delta simulation), and accepts it with probability
  min(1, exp(β·(old − new))): better strategies always, worse ones sometimes, so it can leave
  local optima. Several chains; at each rung the worse half is dropped (successive halving);
  the best is polished by the same coordinate descent as auto's.
* **pase**: PaSE's dynamic programming over a vertex ordering: the exact optimum of a cost that
  adds each op's time and each edge's re-layout (Elango, IPDPS'21); it estimates its time first
  and refuses a graph it cannot finish in the budget.
* **pipeline**: Alpa-style planning: layers cut into stages by dynamic programming, a layout
  inside each stage, stages placed on the GPUs that suit them, microbatches chosen.
* **differentiable**: each op's choice relaxed to a softmax over its configs, the simulated
  cost's smooth stand-in minimised by gradient descent with annealing, then rounded and polished.

The trace plots the best (red) and current cost against proposals. Adopt the best to edit or
compare it.
"""),
    "init-sweep": ("Parallel random initialisation, measured", """
An idea from soapbox's source material: sample many random initialisations of a network in
parallel, keep those with low loss and large gradients, narrow the sampling around them, then
train the few best, converging faster than from one initialisation. `soapbox init-sweep` tests
it on a small MLP and a 2-D spiral (PyTorch, CPU), with three arms that spend exactly the same
compute (2,000 full-batch steps of 300 examples each):

* **init-sweep**: 16 inits scored (loss, gradient norm), the best 8 kept, 8 more drawn by
  perturbing their weights, then successive halving on the trained loss, the last 2 trained.
* **16 independent runs** of 125 steps each.
* **one run** of 2,000 steps.

**Measured (7 seeds, median):** one run reached the target loss with about 3x less compute than
the init-sweep (83 k against 254 k examples on a 2-32-32-3 MLP; 42 k against 149 k on a narrow
deep 2-8-8-8-8-3 one) and ended at a slightly lower loss; the 16 short runs did worst. The score
at initialisation barely predicts which init trains fastest (Spearman's rho between -0.04 and
0.34), and narrowing around the survivors changed nothing measurable. What the sweep does buy
comes from halving on trained loss: on the narrow deep MLP, where one init in 16 stalls, its
spread over seeds is 137-164 k examples against 28-479 k for one run, and with a worker per
member it reaches the target in 89 sequential steps against 140. It trades hardware for wall
time and robustness; it does not save compute. Reproduce with
`python benchmarks/init_sweep.py` (BENCHMARKS.md has the table).

The figure: the lowest loss each arm has reached against the compute it has spent, the line the
median over the seeds and the band the best to the worst seed; the dashed line is the target.
The init-sweep's line trails the one run's by the compute it spends on members it later drops:
when its rungs end (156 k examples) its best member has trained 93 steps, where one run has
trained 520. On the narrow deep MLP the one run's wide band is the seed whose single init stalls.
"""),
}
