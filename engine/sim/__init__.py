"""Simulation of one training iteration, and what is read off it.

* :mod:`engine.sim.full`: FlexFlow's Algorithm 1, the event loop (numba) over a task graph,
  and the :class:`~engine.sim.full.Timeline` it gives;
* :mod:`engine.sim.delta`: FlexFlow's Algorithm 2, one op's config changed and only what it
  touches simulated again (identical to a full simulation, task for task);
* :mod:`engine.sim.steady`: a long pipeline's steady state, simulated once and extrapolated;
  :mod:`engine.sim.unfold`: every task of the iteration drawn from it;
* :mod:`engine.sim.hier`: a layout's prediction composed from a short reference run
  (:mod:`engine.sim.composed`, :mod:`engine.sim.units`, :mod:`engine.sim.unroll`; the
  reference's graph, cluster and links: :mod:`engine.sim.reference`; its memory:
  :mod:`engine.sim.composed_memory`);
* :mod:`engine.sim.idle`: when each GPU idles; :mod:`engine.sim.lanes`: the tasks on a Gantt chart's
  lanes (a row per GPU or link), read in one pass;
* :mod:`engine.sim.memory` (with :mod:`engine.sim.memory_static`): per-device memory as PyTorch
  would report it; :mod:`engine.sim.memory_floor`: a floor under it from the configs and the
  schedule alone (a layout sure not to fit, said without a simulation);
* :mod:`engine.sim.report` (with :mod:`engine.sim.report_moe`): the one simulation entry point,
  :func:`~engine.sim.report.simulate_strategy`, and everything ``soapbox simulate`` prints;
* :mod:`engine.sim.trace`: a Chrome trace of the iteration.

The face imports nothing: each module is imported where it is used (the event loop's compiled
code loads only with :mod:`engine.sim.full`).
"""
