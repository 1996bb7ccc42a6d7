"""Strategies: how every operator is partitioned and placed, and the settings around it.

* :mod:`engine.strategy.config`: an op's :class:`Config` (FlexFlow's parallelization
  configuration), the pipeline settings, the degrees a dim can take;
* :mod:`engine.strategy.core`: the :class:`Strategy` record and its JSON form;
* :mod:`engine.strategy.checks`: every reason a strategy cannot run a model on a cluster;
* :mod:`engine.strategy.runs`: devices written as runs (``"0-7,64-71"``);
* :mod:`engine.strategy.recompute`: what each recomputation policy reruns and keeps.
"""

from .checks import check_strategy, validate_strategy
from .config import (Config, PipelineSettings, check_config, degree_choices, divisors, partition_coords, partition_grid,
                     splits_into_microbatches, zero_shares)
from .core import (FP8_LIBRARIES, GATHER_UNITS, KERNELS, MAX_MICROBATCHES, MAX_VIRTUAL_STAGES, OFFLOAD_DEVICES, OPTIMIZER_STATES, RECOMPUTE,
                   RECOMPUTE_MODULES, SCHEDULES, Strategy, strategy_from_dict)

__all__ = ["Config", "PipelineSettings", "Strategy", "strategy_from_dict", "validate_strategy", "check_strategy",
           "check_config", "degree_choices", "divisors", "partition_coords", "partition_grid",
           "splits_into_microbatches", "zero_shares", "SCHEDULES", "RECOMPUTE", "RECOMPUTE_MODULES",
           "OFFLOAD_DEVICES", "OPTIMIZER_STATES", "KERNELS", "FP8_LIBRARIES", "GATHER_UNITS", "MAX_MICROBATCHES", "MAX_VIRTUAL_STAGES"]
