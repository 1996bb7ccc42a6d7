"""Search algorithms and baselines: functions from (graph, cluster, options) to strategies."""
