"""The run folder under client-dp: the client-level eps beside the per-example one, each labelled."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import ClientDpConfig, OutputConfig
from dirichlet_fl.runs.writer import RoundRecord, RunWriter


def test_the_run_folder_labels_the_client_level_eps(tmp_path: Path) -> None:
    config = RunConfig(client_level=ClientDpConfig(mode="central"),
                       output=OutputConfig(results_dir=str(tmp_path), run_name="dp"))
    writer = RunWriter.create(config, 2, "per example")
    record = RoundRecord(1, trained={0: {"epsilon": 0.5, "steps": 3, "target-epsilon": 1.0, "sample-rate": 0.1,
                                         "num-examples": 10, "train-loss": 1.0}},
                         client_level={"epsilon": 2.5, "delta": 1e-5, "sample_rate": 0.5, "rounds": 1,
                                       "clipping_norm": 1.0})
    writer.record_round(record, ArrayRecord({"w": Array(np.zeros(2, np.float32))}), strategy_state={})
    with open(tmp_path / "dp" / "rounds.csv") as handle:
        row = next(csv.DictReader(handle))
    columns = ("epsilon", "delta", "sample_rate", "rounds", "clipping_norm", "unclipped_fraction")
    assert [row[f"client_level_{key}"] for key in columns] == ["2.5", "1e-05", "0.5", "1", "1.0", "nan"]  # fixed C
    summary = writer.finish({"accuracy": 0.5, "loss": 1.0}, assumptions_hold=True)
    assert summary["client_level"]["epsilon"] == 2.5 and "whole client" in summary["client_level"]["covers"]
    assert summary["client_level"]["clipping"] == "fixed" and summary["client_level"]["initial_clipping_norm"] == 1.0
    assert [c["client_level_epsilon"] for c in summary["clients"]] == [2.5, 2.5]
    assert [c["epsilon"] for c in summary["clients"]] == [0.5, 0.0]
