"""Experiments: a one-way wing. The core never imports it (``tests/test_layers.py`` checks
that only the command line does), so an experiment can change or go without touching the
simulator.

* :mod:`engine.experiments.init_sweep`: parallel random initialisation tested at equal
  compute (``soapbox init-sweep``).
"""
