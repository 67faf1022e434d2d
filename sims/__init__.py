"""Benchmarks and experiments around the federated app: speed, memory and accuracy, measured side by side.

Each module is run through `dirichlet-fl bench <what>` (dirichlet_fl/commands/bench.py) and writes its
results, with the configuration that produced them, to a folder of its own.
"""
