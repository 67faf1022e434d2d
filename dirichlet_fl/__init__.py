"""The foundation under the app, the experiments and the command line: what spans them all.

config / client_plan   the run configuration (`RunConfig`, every run-config key) and each client's plan
preflight / simulation / paths / device
                       checking a run before it starts, and launching `flwr run`
protocol               the messages between the ServerApp and the ClientApp
metrics / files        the medical metrics, and the one atomic write
data/                  loaders, partitions, the federated split, augmentation, .npz data files
models/                the networks, their norm layers and per-network training recipes
runs/                  the run folder: writer, reader, plots, and the membership audit of a finished run

The Dirichlet mechanism itself and every privacy number live in `privacy/`.
"""
