"""Experiments: a one-way wing that the core never imports."""
