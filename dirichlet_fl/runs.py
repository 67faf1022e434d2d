"""Read a finished run's folder back: its config, its clients' data split, its final model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dirichlet_fl.config import RunConfig
from dirichlet_fl.data import ImageData
from dirichlet_fl.task import build_run_model, federated_split

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
    split = federated_split(config, num_clients)
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
