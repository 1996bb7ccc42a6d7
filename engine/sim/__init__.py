"""Simulation: the event loop, delta and steady-state simulation, memory, the report, traces."""
