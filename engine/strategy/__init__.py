"""Strategies: how every operator is partitioned and placed, and the settings around it.

* :mod:`engine.strategy.config`: an op's :class:`Config`, the pipeline settings, degrees;
* :mod:`engine.strategy.core`: the :class:`Strategy` record, its JSON form and its checks;
* :mod:`engine.strategy.device_runs`: devices written as runs (``"0-7,64-71"``);
* :mod:`engine.strategy.recompute`: what each recomputation policy reruns and keeps.
"""

from .core import (GATHER_UNITS, MAX_MICROBATCHES, MAX_VIRTUAL_STAGES, OFFLOAD_DEVICES, RECOMPUTE, RECOMPUTE_MODULES,
    SCHEDULES, Strategy, check_strategy, selective_recompute_reruns, strategy_from_dict, validate_strategy)
from .config import (Config, PipelineSettings, check_config, divisors, partition_coords, partition_grid,
    splits_into_microbatches, zero_shares)

__all__ = ["selective_recompute_reruns", "RECOMPUTE_MODULES", "zero_shares", "divisors", "splits_into_microbatches",
           "check_config", "Config", "PipelineSettings", "Strategy", "SCHEDULES", "RECOMPUTE", "OFFLOAD_DEVICES",
           "validate_strategy", "check_strategy", "partition_coords", "partition_grid", "strategy_from_dict",
           "MAX_MICROBATCHES", "MAX_VIRTUAL_STAGES", "GATHER_UNITS"]
