"""The run folder, written by the server as a run goes and read back by the tools.

results-dir/<run>/ holds config.json (the resolved run config and the number of clients),
rounds.csv (one row per round), ledger.csv (one row per round and client), model.pt (the global
weights of the last complete round) and summary.json (written at the end). Files are appended or
replaced atomically after every round, so a run that fails midway leaves a consistent record of
every round it completed.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn

from dirichlet_fl.config import RunConfig
from dirichlet_fl.data import ImageData
from dirichlet_fl.task import build_run_model, federated_split

ROUND_COLUMNS = [
    "round", "central_accuracy", "central_loss", "federated_accuracy", "federated_loss", "train_loss",
    "trained", "refused", "failed", "max_epsilon", "seconds",
]
LEDGER_COLUMNS = [
    "round", "client", "status", "epsilon", "delta", "steps", "target_epsilon", "sample_rate", "noise_parameter",
    "reason",
]


@dataclass
class RoundRecord:
    """What happened in one round: who trained, who refused, who failed, and each trainer's metrics."""

    server_round: int
    trained: dict[int, dict[str, float]] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    central: dict[str, float] = field(default_factory=dict)
    federated: dict[str, float] = field(default_factory=dict)

    @property
    def max_epsilon(self) -> float:
        return max((m["epsilon"] for m in self.trained.values()), default=math.nan)

    @property
    def train_loss(self) -> float:
        """Mean local training loss, weighted by the trainers' example counts."""
        total = sum(m["num-examples"] for m in self.trained.values())
        if not total:
            return math.nan
        return sum(m["train-loss"] * m["num-examples"] for m in self.trained.values()) / total


@dataclass
class ClientLedger:
    """The latest known privacy position of one client."""

    target_epsilon: float
    epsilon: float = 0.0
    steps: int = 0
    sample_rate: float = math.nan
    noise: dict[str, float] = field(default_factory=dict)
    refused_rounds: int = 0
    failed_rounds: int = 0


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _write_json(path: Path, payload: object) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    os.replace(temporary, path)


class RunWriter:
    """Writes a run's folder as the run goes."""

    def __init__(self, directory: Path, config: RunConfig, num_clients: int, covers: str) -> None:
        self.directory = directory
        self.config = config
        self.covers = covers
        self.clients = {c: ClientLedger(config.target_epsilon_for(c, num_clients)) for c in range(num_clients)}
        self.rounds: list[dict[str, Any]] = []
        self.started = time.monotonic()
        directory.mkdir(parents=True, exist_ok=False)
        _write_json(directory / "config.json", {"run_config": config.to_run_config(), "num_clients": num_clients})
        for name, columns in (("rounds.csv", ROUND_COLUMNS), ("ledger.csv", LEDGER_COLUMNS)):
            with open(directory / name, "w", newline="") as handle:
                csv.writer(handle).writerow(columns)

    @classmethod
    def create(cls, config: RunConfig, num_clients: int, covers: str) -> RunWriter:
        """A new folder under results-dir named by run-name, or by time, data set, mechanism and eps."""
        name = config.run_name or (
            f"{time.strftime('%Y%m%d-%H%M%S')}-{config.dataset}-{config.mechanism}-eps{config.target_epsilon:g}"
        )
        directory = Path(config.results_dir) / name
        suffix = 1
        while directory.exists():
            suffix += 1
            directory = Path(config.results_dir) / f"{name}-{suffix}"
        return cls(directory, config, num_clients, covers)

    def record_round(self, record: RoundRecord, arrays: ArrayRecord) -> dict[str, Any]:
        """Checkpoint the global weights, then append the round to rounds.csv and ledger.csv (weights
        first: the rows never run ahead of model.pt)."""
        self.save_weights(arrays)
        row = {
            "round": record.server_round,
            "central_accuracy": record.central.get("accuracy", math.nan),
            "central_loss": record.central.get("loss", math.nan),
            "federated_accuracy": record.federated.get("eval-accuracy", math.nan),
            "federated_loss": record.federated.get("eval-loss", math.nan),
            "train_loss": record.train_loss,
            "trained": len(record.trained),
            "refused": len(record.refused),
            "failed": len(record.failed),
            "max_epsilon": record.max_epsilon,
            "seconds": round(time.monotonic() - self.started, 3),
        }
        self.rounds.append(row)
        with open(self.directory / "rounds.csv", "a", newline="") as handle:
            csv.DictWriter(handle, ROUND_COLUMNS).writerow(row)
        with open(self.directory / "ledger.csv", "a", newline="") as handle:
            writer = csv.DictWriter(handle, LEDGER_COLUMNS)
            for client, entry in self._update_ledger(record).items():
                writer.writerow({"round": record.server_round, "client": client, **entry})
        return row

    def _update_ledger(self, record: RoundRecord) -> dict[int, dict[str, Any]]:
        rows = {}
        for client, ledger in self.clients.items():
            status, reason = "idle", ""
            if client in record.trained:
                metrics = record.trained[client]
                status = "trained"
                ledger.epsilon, ledger.steps = metrics["epsilon"], int(metrics["steps"])
                ledger.target_epsilon, ledger.sample_rate = metrics["target-epsilon"], metrics["sample-rate"]
                ledger.noise = {k: metrics[k] for k in ("r", "noise_multiplier") if k in metrics}
            elif client in record.refused:
                status, reason = "refused", record.refused[client]
                ledger.refused_rounds += 1
            elif client in record.failed:
                status, reason = "failed", record.failed[client]
                ledger.failed_rounds += 1
            rows[client] = {
                "status": status,
                "epsilon": ledger.epsilon,
                "delta": self.config.delta,
                "steps": ledger.steps,
                "target_epsilon": ledger.target_epsilon,
                "sample_rate": ledger.sample_rate,
                "noise_parameter": ";".join(f"{k}={v:.10g}" for k, v in ledger.noise.items()),
                "reason": reason,
            }
        return rows

    def save_weights(self, arrays: ArrayRecord) -> None:
        temporary = self.directory / "model.pt.tmp"
        torch.save(arrays.to_torch_state_dict(), temporary)
        os.replace(temporary, self.directory / "model.pt")

    def finish(self, final_accuracy: float, final_loss: float, assumptions_hold: bool) -> dict[str, Any]:
        """Write summary.json: final accuracy, rounds run and every client's privacy position."""
        summary = {
            "final_accuracy": final_accuracy,
            "final_loss": final_loss,
            "rounds": len(self.rounds),
            "mechanism": self.config.mechanism,
            "delta": self.config.delta,
            "epsilon_covers": self.covers,
            "accountant_assumptions_hold": assumptions_hold,
            "max_epsilon": _json_number(max((c.epsilon for c in self.clients.values()), default=0.0)),
            "seconds": round(time.monotonic() - self.started, 3),
            "clients": [
                {
                    "id": client,
                    "target_epsilon": ledger.target_epsilon,
                    "epsilon": _json_number(ledger.epsilon),
                    "delta": self.config.delta,
                    "steps": ledger.steps,
                    "sample_rate": _json_number(ledger.sample_rate),
                    **{key.replace("-", "_"): value for key, value in ledger.noise.items()},
                    "refused_rounds": ledger.refused_rounds,
                    "failed_rounds": ledger.failed_rounds,
                }
                for client, ledger in self.clients.items()
            ],
        }
        _write_json(self.directory / "summary.json", summary)
        return summary


RUN_FILES = ("config.json", "summary.json", "model.pt")


@dataclass(frozen=True)
class FinishedRun:
    """Everything an analysis of a finished run needs; the split is re-derived from the config."""

    directory: Path
    config: RunConfig
    num_clients: int
    summary: dict
    model: nn.Module
    data: ImageData
    train_parts: list[np.ndarray]


def load_run(run_dir: str | Path) -> FinishedRun:
    """Load results-dir/<run>/; raises FileNotFoundError naming the missing file."""
    directory = Path(run_dir)
    for name in RUN_FILES:
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory}: missing {name}; is this a finished dirichlet-fl run folder?")
    stored = json.loads((directory / "config.json").read_text())
    config = RunConfig.from_run_config(stored["run_config"])
    num_clients = int(stored["num_clients"])
    split = federated_split(config.split_spec(num_clients))
    model = build_run_model(config, split.data)
    model.load_state_dict(torch.load(directory / "model.pt", map_location="cpu", weights_only=True))
    model.eval()
    return FinishedRun(
        directory=directory,
        config=config,
        num_clients=num_clients,
        summary=json.loads((directory / "summary.json").read_text()),
        model=model,
        data=split.data,
        train_parts=split.train_parts,
    )
