"""Benchmarks: decision-time micro-benchmark today; workloads, the discrete-event
simulation and the load driver join it here."""
