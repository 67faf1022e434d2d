"""Data sets, non-IID partitions, models and command-line tools for Dirichlet-mechanism federated learning."""
