"""`bench client-dp`: test accuracy against the client-level eps of DP-FedAvg, with the per-example
mechanism of every client on as well.

Each cell is one run of sims.fedavg_loop whose aggregation is the client-level DP wrapper's step
(strategies.client_dp.noised_mean_update) and whose client-level eps comes from privacy.accounting.client_level,
composed round by round; noise multiplier 0 is the plain FedAvg. One seed fixes everything else, so
cells differ by the client-level noise only. With --clipping adaptive, C follows a quantile of the
update norms. Each cell also reports the median update norm before clipping (choose C near it) and the
last round's C. BENCHMARKS.md, section 9.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import torch
from flwr.app import RecordDict
from flwr.supercore.differential_privacy import get_norm
from torch import Tensor

from dirichlet_fl.config import RunConfig
from privacy.accounting.client_level import (
    AdaptiveClipping,
    ClientLevelAccountant,
    ClientLevelRound,
    update_noise_multiplier,
)
from sims.fedavg_loop import FedAvgLoop, LoopRound
from strategies.client_dp import noised_mean_update, noised_unclipped_count


class ClientDPLoop(FedAvgLoop):
    """FedAvgLoop with DP-FedAvg's aggregation and the client-level ledger."""

    def __init__(self, config: RunConfig, num_clients: int) -> None:
        super().__init__(config, num_clients)
        self.accountant = ClientLevelAccountant(config.privacy.delta)
        self.update_norms: list[float] = []
        self.eligible = num_clients
        self.adaptive: AdaptiveClipping | None = None
        self.clipping_norms: list[float] = []

    def aggregate(self, updates: list[RecordDict], sampled: int) -> dict[str, Tensor]:
        state = self.model.state_dict()
        current = [tensor.cpu().numpy() for tensor in state.values()]
        weights = [update.array_records["arrays"].to_numpy_ndarrays() for update in updates]
        norms = [get_norm([new - old for new, old in zip(w, current)]) for w in weights]
        self.update_norms += norms
        z = self.config.client_level.noise_multiplier
        self.accountant.compose(ClientLevelRound(self.eligible, sampled, z))
        client_level = self.config.client_level
        if client_level.mode == "adaptive" and self.adaptive is None:
            self.adaptive = client_level.adaptive_clipping(client_level.count_stddev(sampled))
        clipping_norm = client_level.clipping_norm if self.adaptive is None else self.adaptive.clipping_norm
        self.clipping_norms.append(clipping_norm)
        if self.adaptive is not None:
            z = update_noise_multiplier(z, self.adaptive.count_stddev)
            clipped = [int(norm > clipping_norm) for norm in norms]
            self.adaptive.update(noised_unclipped_count(clipped, self.adaptive.count_stddev) / len(norms))
        mean = noised_mean_update(current, weights, clipping_norm, z)
        return {name: tensor + torch.as_tensor(delta, dtype=tensor.dtype, device=tensor.device)
                for (name, tensor), delta in zip(state.items(), mean)}

    def run_round(self, server_round: int) -> LoopRound | None:
        """FedAvgLoop's round; the clients able to train are counted before it samples (the population)."""
        self.eligible = sum(client not in self.exhausted for client in range(self.num_clients))
        return super().run_round(server_round)


def run_cell(config: RunConfig, clients: int) -> dict[str, Any]:
    """One run; with client-noise-multiplier 0, the plain FedAvgLoop."""
    private = config.client_level.noise_multiplier > 0
    loop: FedAvgLoop = ClientDPLoop(config, clients) if private else FedAvgLoop(config, clients)
    rounds = [r for r in (loop.run_round(i) for i in range(1, config.num_server_rounds + 1)) if r is not None]
    cell: dict[str, Any] = {
        "noise_multiplier": config.client_level.noise_multiplier,
        "clipping_norm": config.client_level.clipping_norm,
        "final_accuracy": rounds[-1].central_accuracy if rounds else float("nan"),
        "max_example_epsilon": loop.max_epsilon(),
        "rounds": len(rounds),
        "seconds": sum(r.seconds for r in rounds),
    }
    if isinstance(loop, ClientDPLoop):
        cell["client_level_epsilon"] = loop.accountant.epsilon()
        cell["client_level_sample_rate"] = loop.accountant.max_sample_rate
        cell["median_update_norm"] = statistics.median(loop.update_norms)
        cell["last_clipping_norm"] = loop.clipping_norms[-1]
    return cell


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    multipliers = [float(z) for z in args.noise_multipliers.split(",")]
    cells = []
    for z in multipliers:
        overrides = {"dataset": args.dataset, "data-root": args.data_root, "num-server-rounds": args.rounds,
                     "fraction-train": args.fraction_train, "fraction-evaluate": 0.0, "seed": args.seed,
                     "client-dp": args.clipping_mode if z > 0 else "none", "client-clipping-norm": args.clipping_norm,
                     "client-noise-multiplier": z, "mechanism": args.mechanism, "partitioner": "iid",
                     "local-steps": args.local_steps, "local-epochs": args.local_epochs, "model": args.model,
                     "learning-rate": args.learning_rate, "batch-size": args.batch_size,
                     "target-epsilon": args.target_epsilon, "client-clip-target-quantile": args.target_quantile}
        config = RunConfig.from_run_config(overrides)
        cells.append(run_cell(config, args.clients))
    return {"cells": cells, "config": vars(args), "delta": RunConfig().privacy.delta}


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = ["noise z  client-level eps (delta 1e-5)  accuracy  max per-example eps  median update norm  last C"]
    for cell in report["cells"]:
        lines.append(f"{cell['noise_multiplier']:7g}  {cell.get('client_level_epsilon', float('inf')):30.3f}  "
                     f"{cell['final_accuracy']:8.4f}  {cell['max_example_epsilon']:19.4f}  "
                     f"{cell.get('median_update_norm', float('nan')):18.3f}  "
                     f"{cell.get('last_clipping_norm', float('nan')):.4g}")
    return lines
