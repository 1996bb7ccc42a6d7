"""The operator catalogue: shapes, FLOPs, bytes, parameters and parallel dimensions.

Each operator kind knows, from its input tensors and attributes,

* its output tensors (shape, axis names, dtype),
* its parameter tensors (shapes, in elements),
* its forward and backward FLOPs,
* the dimensions along which it can be partitioned, each tagged as in FlexFlow's
  Table 1 (Jia et al., SysML'19, §4): **S**ample (the batch), **A**ttribute (e.g. height,
  width, sequence length; splitting needs no parameter replication change), **P**arameter
  (splitting divides the op's parameters), plus **R**eduction dimensions: splitting the
  contracted axis of a matmul leaves every partition with a partial sum of the whole
  output, which an all-reduce must combine afterwards (Megatron-LM's row-parallel linear,
  Shoeybi et al. 2019, §3; vocabulary-parallel embedding and cross-entropy).

FLOPs counting convention (documented, not measured): a multiply-add is 2 FLOPs; matmul-like
ops (conv2d, linear, batch_matmul, LSTM gates) count only their multiply-adds, as model-FLOP
utilisation accounting does (Chowdhery et al., PaLM 2022, Appendix B; Narayanan et al.
SC'21 Eq. 3), bias additions are not counted; pointwise ops count a fixed number of
FLOPs per element given by the ``*_FLOPS_PER_ELEMENT`` constants below. Every FLOPs
formula is *multiplicative* in the partitioned axes, so the FLOPs of an op's partitions add
up exactly to the op's FLOPs (a property the tests check by recomputing the formula on each
partition's shapes). Backward FLOPs are 2x forward for ops with a weight gradient and an
input gradient (both are matmuls of the same size), 1x for the others.

Preconditions not checked here: attribute values have already passed the JSON Schema
(types); this module checks their meaning (divisibility, shape agreement).

The kinds live by family, each module registering its own (:func:`kinds`):
:mod:`engine.ops.shape` (inputs, concat, split, reshape, transpose, broadcast),
:mod:`engine.ops.dense` (convolution, pooling, linear, batched matmul, embedding, LSTM),
:mod:`engine.ops.pointwise` (norms, softmax, bias and gain, elementwise),
:mod:`engine.ops.attention` (fused attention, cross-entropy) and
:mod:`engine.ops.experts` (router, experts); :mod:`engine.ops.base` holds what they share and
:mod:`engine.ops.registry` the catalogue by name.
"""

from .base import (ATTRIBUTE, DIM_KINDS, DTYPE_BYTES, EXPERT, FLOAT_ATTRS, FLOAT_DTYPES, MAX_DIM, MAX_OP_TENSORS,
                   MAX_RANK, MAX_TENSOR_ELEMENTS, PARAMETER, REDUCTION, REPLICA, REPLICA_DIM, SAMPLE, OpError, OpKind,
                   ParallelDim, ParamInfo, TensorInfo, replica_dim, sliding_window)
from .experts import MOE_DISPATCHERS, experts_capacity_share
from .pointwise import ELEMENTWISE_KINDS
from .registry import MOE_KINDS, OP_KINDS, op_kind

__all__ = ["sliding_window", "SAMPLE", "ATTRIBUTE", "PARAMETER", "REDUCTION", "REPLICA", "EXPERT", "MOE_KINDS",
           "MOE_DISPATCHERS", "experts_capacity_share", "REPLICA_DIM", "replica_dim", "DIM_KINDS", "DTYPE_BYTES",
           "FLOAT_DTYPES", "TensorInfo", "ParamInfo", "ParallelDim", "OpError", "OpKind", "OP_KINDS", "op_kind",
           "ELEMENTWISE_KINDS", "MAX_DIM", "MAX_RANK", "MAX_TENSOR_ELEMENTS", "MAX_OP_TENSORS", "FLOAT_ATTRS"]
