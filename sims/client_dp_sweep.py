"""`bench client-dp`: test accuracy against the client-level eps of DP-FedAvg, with the per-example
mechanism of every client on as well.

Each cell is one run of sims.fedavg_loop whose strategy (--strategy, Flower's class) is wrapped by the
app's client-level DP wrapper (strategies.client_dp.ClientLevelDp): the clipped, noised mean update goes to the
strategy, and the client-level eps comes from the wrapper's ledger (privacy.accounting.client_level), composed
round by round; noise multiplier 0 is the plain strategy. One seed fixes everything else, so
cells differ by the client-level noise only. With --clipping adaptive, C follows a quantile of the
update norms. Each cell also reports the median update norm before clipping (choose C near it) and the
last round's C. BENCHMARKS.md, section 9.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from flwr.app import RecordDict
from flwr.supercore.differential_privacy import KEY_NORM_BIT, get_norm
from torch import Tensor

from dirichlet_fl.config import RunConfig
from sims.fedavg_loop import FedAvgLoop
from strategies.client_dp import ClientLevelDp
from strategies.wrapped import ARRAYS


class ClientDPLoop(FedAvgLoop):
    """FedAvgLoop whose strategy is wrapped by the app's client-level DP wrapper (strategies/client_dp.py), so
    that the run's own Flower strategy aggregates the noised mean and the wrapper keeps the client-level
    ledger, exactly as in the app; it also records each update's norm and each round's C."""

    def __init__(self, config: RunConfig, num_clients: int) -> None:
        super().__init__(config, num_clients)
        self.client_dp = ClientLevelDp(self.strategy, config.client_level, config.privacy.delta,
                                       adaptive=config.client_level.mode == "adaptive")
        self.strategy = self.client_dp
        self.update_norms: list[float] = []
        self.clipping_norms: list[float] = []

    def aggregate(self, updates: list[RecordDict], sampled: int) -> dict[str, Tensor]:
        """The wrapper's aggregate of the updates, each reporting whether C clipped it (the bit Flower's
        `adaptiveclipping_mod` sends from a client in the app: 1 = clipped)."""
        clipping_norm = self.client_dp.clipping_norm
        current = self.sent.to_numpy_ndarrays()
        for update in updates:
            weights = update.array_records[ARRAYS].to_numpy_ndarrays()
            norm = get_norm([new - old for new, old in zip(weights, current)])
            self.update_norms.append(norm)
            update.metric_records["metrics"][KEY_NORM_BIT] = int(norm > clipping_norm)
        self.clipping_norms.append(clipping_norm)
        return super().aggregate(updates, sampled)


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
        cell["client_level_epsilon"] = loop.client_dp.client_level.epsilon()
        cell["client_level_sample_rate"] = loop.client_dp.client_level.max_sample_rate
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
                     "target-epsilon": args.target_epsilon, "client-clip-target-quantile": args.target_quantile,
                     "strategy": args.strategy}
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
