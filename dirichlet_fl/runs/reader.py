"""A run folder read back (dirichlet_fl.runs.writer writes it): its config, its checkpoint, its kept
updates and the finished run itself, with the model loaded and the split re-derived from the config.
Also what a resumed run or the pre-flight checks against it: a readable checkpoint, an unchanged accounting.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dirichlet_fl.config import RESUMABLE_KEYS, RunConfig
from dirichlet_fl.data.image_data import ImageData
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.models.run_model import build_run_model

CHECKPOINT = "checkpoint.pt"
RUN_FILES = ("config.json", "summary.json", "model.pt")
UPDATES_DIR = "updates"


def json_number(value: float) -> float | None:
    """The value as summary.json holds it: null for nan and inf (strict JSON)."""
    return value if math.isfinite(value) else None


def _refuse_constant(name: str) -> float:
    raise json.JSONDecodeError(f"{name} is not a number a run file holds", name, 0)


def read_json(path: Path) -> Any:
    """A JSON file of a run folder; raises ValueError naming the file when it is corrupt (NaN and Infinity
    included: the writer never writes them, so one there was put there by hand)."""
    try:
        return json.loads(path.read_text(), parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is corrupt ({error}); it is not a readable dirichlet-fl run file") from None


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's CSV file (rounds.csv, ledger.csv) as dicts of strings."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def read_checkpoint(directory: Path) -> dict[str, Any]:
    """The run's last checkpoint; ValueError naming the folder when there is none or it is unreadable."""
    path = directory / CHECKPOINT
    if not path.is_file():
        raise ValueError(
            f"resume-from={str(directory)!r} holds no {CHECKPOINT}: give the folder of a run that completed at "
            "least one round"
        )
    try:
        return dict(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as error:  # torch raises several types for a damaged file
        raise ValueError(f"{path} cannot be read ({type(error).__name__}); the run cannot be resumed from it") from None


def check_resumable(original: RunConfig, resumed: RunConfig) -> None:
    """Refuse a resumed config that changes the data, the split, the model or the accounting: only the
    keys in RESUMABLE_KEYS may differ. Raises ValueError naming the first changed key."""
    before, after = original.resolved_run_config(), resumed.resolved_run_config()
    for key in before:
        if key not in RESUMABLE_KEYS and before[key] != after[key]:
            raise ValueError(
                f"{key}={after[key]!r} differs from the resumed run's {key}={before[key]!r}: a resumed run must keep "
                f"every key that fixes its data, split, model and privacy accounting (only {sorted(RESUMABLE_KEYS)} "
                "may change)"
            )


@dataclass(frozen=True)
class RoundUpdates:
    """One round as the coordinator saw it: the global weights sent and each trainer's update (flattened)."""

    server_round: int
    global_weights: np.ndarray
    updates: dict[int, np.ndarray]


def load_round_updates(run_dir: str | Path) -> list[RoundUpdates]:
    """Every kept round in order; FileNotFoundError (naming the fix) when the run did not keep updates."""
    folder = Path(run_dir) / UPDATES_DIR
    files = sorted(folder.glob("round-*.npz")) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"{run_dir}: no {UPDATES_DIR}/round-*.npz; run with --run-config 'keep-updates=true' to keep the "
            "per-round client updates the update view audits"
        )
    rounds = []
    for path in files:
        with np.load(path) as stored:
            updates = {int(key.split("-", 1)[1]): stored[key] for key in stored.files if key.startswith("client-")}
            rounds.append(RoundUpdates(int(path.stem.split("-")[1]), stored["global"], updates))
    return rounds


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
    """Load results-dir/<run>/; raises FileNotFoundError naming the missing file.

    A run killed before its end has no summary.json: its last checkpoint stands in for it (status
    `interrupted`, every client's ledger as of that round, which matches model.pt's round)."""
    directory = Path(run_dir)
    interrupted = not (directory / "summary.json").is_file() and (directory / CHECKPOINT).is_file()
    for name in RUN_FILES:
        if not (directory / name).is_file() and not (interrupted and name == "summary.json"):
            raise FileNotFoundError(f"{directory}: missing {name}; is this a finished dirichlet-fl run folder?")
    stored = read_json(directory / "config.json")
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
        summary=_interrupted_summary(directory, config) if interrupted else read_summary(directory),
        model=model,
        data=split.data,
        train_parts=split.train_parts,
    )


def read_summary(directory: Path) -> dict[str, Any]:
    """summary.json, with its per-client list read back from clients.csv when the run wrote it there (more
    than run_writer.CLIENTS_IN_SUMMARY clients)."""
    summary = read_json(directory / "summary.json")
    if "clients" not in summary and "clients_file" in summary:
        summary["clients"] = [_client_entry(row) for row in read_rows(directory / str(summary["clients_file"]))]
    return summary


def _client_entry(row: dict[str, str]) -> dict[str, Any]:
    """One clients.csv row as summary.json would hold it: counts as ints, the rest floats, an empty cell None
    (a noise parameter the client's mechanism does not have is left out, as summary.json leaves it out)."""
    counts = ("id", "steps", "refused_rounds", "failed_rounds")
    return {key: None if value == "" else int(value) if key in counts else float(value)
            for key, value in row.items() if value != "" or key not in ("r", "noise_multiplier")}


def _interrupted_summary(directory: Path, config: RunConfig) -> dict[str, Any]:
    """What summary.json would hold about the clients' privacy and the model's accuracy, read from the
    last checkpoint and its round's row of rounds.csv."""
    checkpoint = read_checkpoint(directory)
    clients = {int(client): standing for client, standing in checkpoint["clients"].items()}
    last = str(int(checkpoint["round"]))
    accuracy = [float(row["central_accuracy"]) for row in read_rows(directory / "rounds.csv") if row["round"] == last]
    return {
        "status": "interrupted",
        "final_accuracy": accuracy[-1] if accuracy else None,
        "status_reason": f"the run stopped after round {int(checkpoint['round'])} without a summary",
        "rounds": int(checkpoint["round"]),
        "mechanism": config.privacy.mechanism,
        "delta": config.privacy.delta,
        "accountant_assumptions_hold": not config.network.allow_batch_norm,
        "clients": [
            {"id": client, "target_epsilon": standing["target_epsilon"], "epsilon": json_number(standing["epsilon"]),
             "delta": config.privacy.delta, "steps": standing["steps"],
             "sample_rate": json_number(standing["sample_rate"])}
            for client, standing in sorted(clients.items())
        ],
    }
