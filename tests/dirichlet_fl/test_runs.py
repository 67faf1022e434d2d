"""The run folder: written round by round, consistent after every round."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from flwr.app import ArrayRecord

from dirichlet_fl.config import RunConfig
from dirichlet_fl.runs import RoundRecord, RunWriter


def trained(partition: int, eps: float, steps: int) -> dict[str, float]:
    return {
        "num-examples": 10 * (partition + 1), "partition-id": partition, "train-loss": 1.0 + partition,
        "epsilon": eps, "target-epsilon": 1.0, "delta": 1e-5, "steps": steps, "sample-rate": 0.1, "r": 0.3,
    }


def weights(value: float) -> ArrayRecord:
    return ArrayRecord({"w": torch.full((2,), value)})


def test_each_round_is_on_disk_before_the_next(tmp_path) -> None:
    config = RunConfig(results_dir=str(tmp_path), run_name="run")
    writer = RunWriter.create(config, num_clients=2, covers="the outputs")
    first = RoundRecord(1, trained={0: trained(0, 0.5, 10), 1: trained(1, 0.4, 5)}, central={"accuracy": 0.5, "loss": 1.0})
    writer.record_round(first, weights(1.0), {})
    # a crash here leaves round 1 complete
    with open(tmp_path / "run" / "rounds.csv") as handle:
        rounds = list(csv.DictReader(handle))
    assert [row["round"] for row in rounds] == ["1"]
    assert float(rounds[0]["train_loss"]) == pytest.approx((1.0 * 10 + 2.0 * 20) / 30)
    assert float(rounds[0]["max_epsilon"]) == 0.5
    assert torch.equal(torch.load(tmp_path / "run" / "model.pt")["w"], torch.full((2,), 1.0))
    assert json.loads((tmp_path / "run" / "config.json").read_text())["run_config"]["run-name"] == "run"

    second = RoundRecord(2, trained={0: trained(0, 0.9, 20)}, refused={1: "budget spent"}, central={"accuracy": 0.6})
    writer.record_round(second, weights(2.0), {})
    summary = writer.finish(0.6, 0.9, assumptions_hold=True)
    with open(tmp_path / "run" / "ledger.csv") as handle:
        ledger = [(row["round"], row["client"], row["status"], row["epsilon"]) for row in csv.DictReader(handle)]
    assert ledger == [("1", "0", "trained", "0.5"), ("1", "1", "trained", "0.4"),
                      ("2", "0", "trained", "0.9"), ("2", "1", "refused", "0.4")]
    clients = {client["id"]: client for client in summary["clients"]}
    assert clients[0]["epsilon"] == 0.9 and clients[0]["steps"] == 20
    assert clients[1]["refused_rounds"] == 1 and clients[1]["epsilon"] == 0.4
    assert summary["max_epsilon"] == 0.9 and summary["rounds"] == 2
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary


def test_a_second_run_with_the_same_name_gets_its_own_folder(tmp_path) -> None:
    config = RunConfig(results_dir=str(tmp_path), run_name="same")
    first = RunWriter.create(config, 1, "x").directory
    second = RunWriter.create(config, 1, "x").directory
    assert first != second and first.is_dir() and second.is_dir()


def test_clients_that_never_trained_report_zero_and_no_rate(tmp_path) -> None:
    writer = RunWriter.create(RunConfig(results_dir=str(tmp_path)), 1, "x")
    summary = writer.finish(0.1, 2.3, assumptions_hold=False)
    assert summary["clients"][0]["epsilon"] == 0.0 and summary["clients"][0]["sample_rate"] is None
    assert summary["accountant_assumptions_hold"] is False
