"""Framework layouts: the one typed :class:`Layout` record, its rules, the one enumerator of
valid layouts, and how a layout becomes a strategy.

* :mod:`engine.layout.record`: the record and its rules, the enumerator;
* :mod:`engine.layout.experts`: the expert-parallel shapes of a mixture-of-experts model;
* :mod:`engine.layout.placement`: layers into pipeline chunks, each op's tensor-parallel dim.
"""

from .record import (MAX_CP, MAX_MICROBATCHES_PER_STAGE, MIN_CP_TOKENS, ON_BY_DEFAULT, OPTION_NAMES, SWITCHES, Layout,
    layout_problem, mesh_shapes, micro_batch_sizes, microbatch_count, tp_problem, valid_layouts)
from .experts import expert_shapes

__all__ = ["Layout", "microbatch_count", "micro_batch_sizes", "tp_problem", "layout_problem",
           "valid_layouts", "mesh_shapes", "expert_shapes", "OPTION_NAMES", "SWITCHES", "ON_BY_DEFAULT",
           "MAX_CP", "MIN_CP_TOKENS", "MAX_MICROBATCHES_PER_STAGE"]
