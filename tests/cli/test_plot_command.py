"""`dirichlet-fl plot`: overlays run folders; one line and exit code 2 for a folder that is not a run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord

from cli.main import main
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import OutputConfig, PrivacyConfig
from dirichlet_fl.runs.plots import read_curves
from dirichlet_fl.runs.writer import RoundRecord, RunWriter


def make_run(root: Path, name: str, target: float) -> Path:
    config = RunConfig(output=OutputConfig(results_dir=str(root), run_name=name),
                       privacy=PrivacyConfig(target_epsilon=target))
    writer = RunWriter.create(config, 2, "x")
    metrics = {"num-examples": 10, "train-loss": 1.0, "target-epsilon": target, "delta": 1e-5, "sample-rate": 0.1,
               "r": 0.1, "learning-rate": 5.0}
    for server_round in (1, 2):
        trained = {0: {**metrics, "partition-id": 0, "epsilon": target * server_round / 2, "steps": 10 * server_round}}
        refused = {1: "budget spent"} if server_round == 2 else {}
        if server_round == 1:
            trained[1] = {**metrics, "partition-id": 1, "epsilon": target, "steps": 10}
        record = RoundRecord(server_round, trained=trained, refused=refused,
                             central={"accuracy": 0.3 * server_round, "loss": 2.0 / server_round})
        writer.record_round(record, ArrayRecord({"w": torch.zeros(1)}), {})
    return writer.directory


def test_overlay_of_two_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [make_run(tmp_path, f"eps{eps:g}", eps) for eps in (1.0, 4.0)]
    out = tmp_path / "overlay.png"
    assert main(["plot", *map(str, runs), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000 and "2 run(s)" in capsys.readouterr().out
    curves = read_curves(runs[1])
    assert curves.accuracy == [0.3, 0.6] and curves.refusals == {1: [(2, 4.0)]}
    assert curves.epsilon[0] == [(1, 2.0), (2, 4.0)] and curves.target == {0: 4.0, 1: 4.0}


def test_a_folder_without_rounds_is_refused_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plot", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "RUN_DIR=" in error and "rounds.csv" in error
