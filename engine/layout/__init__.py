"""Framework layouts: the one typed :class:`Layout` record, its rules, the one enumerator of
valid layouts, and the builder that makes a layout a strategy.

* :mod:`engine.layout.record`: the record, each field with its :class:`Option` (help, the
  builders that take it, where the explorer shows it);
* :mod:`engine.layout.rules`: the rules every layout must satisfy (:func:`layout_problem`);
* :mod:`engine.layout.enumeration`: every valid layout of a model on a cluster;
* :mod:`engine.layout.experts`: the expert-parallel shapes of a mixture-of-experts model;
* :mod:`engine.layout.placement`: layers into pipeline chunks, each op's tensor-parallel dim
  and its config on a stage's mesh;
* :mod:`engine.layout.build`: the strategy a layout makes (:func:`build_layout`, :func:`fsdp`).
"""

from .build import build_layout, fsdp
from .enumeration import (MAX_CP, MAX_MICROBATCHES_PER_STAGE, MIN_CP_TOKENS, mesh_shapes, micro_batch_sizes,
                          valid_layouts)
from .experts import expert_shapes
from .record import BUILDERS, ON_BY_DEFAULT, OPTION_NAMES, SWITCHES, Layout, Option, option_of, options_for
from ..strategy.config import microbatch_count
from .rules import layout_problem, resolved, tp_problem

__all__ = ["Layout", "Option", "option_of", "options_for", "build_layout", "fsdp", "layout_problem", "resolved",
           "microbatch_count", "tp_problem", "valid_layouts", "mesh_shapes", "micro_batch_sizes", "expert_shapes",
           "BUILDERS", "OPTION_NAMES", "SWITCHES", "ON_BY_DEFAULT", "MAX_CP", "MIN_CP_TOKENS",
           "MAX_MICROBATCHES_PER_STAGE"]
