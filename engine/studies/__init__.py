"""Studies over many simulations: sweeps, failure what-ifs, profiling."""
