"""Benchmarks and experiments around the federated app: speed, memory and accuracy, measured side by side.

The benchmarks run through `dirichlet-fl bench <what>` (cli/bench.py); each writes its
results, with the configuration that produced them, to a folder of its own (see BENCHMARKS.md).
"""
