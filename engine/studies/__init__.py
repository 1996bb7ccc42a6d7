"""Studies over many simulations, each a ``soapbox`` command:

* :mod:`engine.studies.sweep`: layouts x cluster sizes, on a process pool or Ray
  (``soapbox sweep``), and the smallest cluster a layout fits;
* :mod:`engine.studies.whatif`: what a failed GPU, node or link (or a slow GPU) costs, the
  re-plan, and goodput with checkpoints (``soapbox whatif``);
* :mod:`engine.studies.profiling`: FlexFlow's "measure each distinct operator once" with
  PyTorch (``soapbox profile``).
"""
