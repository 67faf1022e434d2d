"""The run folder's evaluation metrics: rounds.csv's per-class columns, summary.json's final metrics and
dead classes, and dead-class streaks that continue across a resume."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import OutputConfig
from dirichlet_fl.metrics import ClassCounts, dead_class_note
from dirichlet_fl.runs.writer import RoundRecord, RunWriter

CLASSES = 3


def central(hits: tuple[int, ...]) -> dict[str, float]:
    """The server's metrics for a model that gets `hits` of 10 examples of each class right."""
    counts = ClassCounts(hits, (10,) * CLASSES)
    return {"accuracy": sum(hits) / 30, "loss": 1.5, "macro_auc": 0.75, **counts.metrics()}


def record(server_round: int, hits: tuple[int, ...]) -> RoundRecord:
    federated = {"loss": 1.4, "accuracy": 0.5, **ClassCounts((1, 0, 1), (2, 2, 0)).metrics()}
    return RoundRecord(server_round, central=central(hits), federated=federated)


def rows(directory: Path) -> list[dict[str, str]]:
    with open(directory / "rounds.csv") as handle:
        return list(csv.DictReader(handle))


def new_writer(tmp_path: Path, dead_class_rounds: int = 2) -> RunWriter:
    config = RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="run",
                                           dead_class_rounds=dead_class_rounds))
    return RunWriter.create(config, 1, "x", num_classes=CLASSES)


def test_rounds_csv_has_the_metrics_and_one_recall_column_per_class(tmp_path: Path) -> None:
    writer = new_writer(tmp_path)
    writer.record_round(record(1, (10, 5, 0)), ArrayRecord({"w": torch.zeros(2)}), {})
    (row,) = rows(writer.directory)
    assert float(row["central_balanced_accuracy"]) == (1.0 + 0.5 + 0.0) / 3
    assert float(row["central_macro_auc"]) == 0.75 and float(row["central_min_class_recall"]) == 0.0
    assert [float(row[f"central_recall_{c}"]) for c in range(CLASSES)] == [1.0, 0.5, 0.0]
    assert row["federated_recall_0"] == "0.5" and row["federated_recall_1"] == "0.0"
    assert row["federated_recall_2"] == "nan"  # no client holds a test example of class 2
    assert float(row["federated_balanced_accuracy"]) == 0.25 and "federated_macro_auc" not in row


def test_summary_has_the_final_metrics(tmp_path: Path) -> None:
    writer = new_writer(tmp_path)
    writer.record_round(record(1, (10, 5, 0)), ArrayRecord({"w": torch.zeros(2)}), {})
    summary = writer.finish(central((9, 4, 1)), assumptions_hold=True)
    assert summary["final_balanced_accuracy"] == (0.9 + 0.4 + 0.1) / 3
    assert summary["final_per_class_recall"] == [0.9, 0.4, 0.1] and summary["final_macro_auc"] == 0.75
    assert summary["dead_classes"] == {}  # one dead round is below dead-class-rounds = 2
    assert "J(x)" in summary["epsilon_does_not_cover"]  # the default mechanism is dirichlet
    failed = new_writer(tmp_path).finish({}, assumptions_hold=True, status="failed")
    assert failed["final_per_class_recall"] == [None] * CLASSES and failed["final_balanced_accuracy"] is None


def test_dead_class_streaks_last_across_rounds_and_a_resume(tmp_path: Path) -> None:
    writer = new_writer(tmp_path)
    for server_round, hits in enumerate([(10, 5, 0), (10, 0, 0)], start=1):
        writer.record_round(record(server_round, hits), ArrayRecord({"w": torch.zeros(2)}), {})
    assert writer.dead_classes() == {2: (1, 2)}  # class 1 has been dead one round only
    killed = {**rows(writer.directory)[-1], "round": "3", "central_recall_0": "0.0"}
    with open(writer.directory / "rounds.csv", "a") as handle:  # a kill after round 3's rows, before its checkpoint
        csv.DictWriter(handle, list(killed), lineterminator="\n").writerow(killed)

    resumed = RunConfig(output=OutputConfig(results_dir=str(tmp_path), resume_from=str(writer.directory),
                                            dead_class_rounds=2))
    again, _ = RunWriter.resume(resumed, 1, "x", num_classes=CLASSES)
    assert again.dead_classes() == {2: (1, 2)}  # replayed from the kept rows; the cut round 3 does not count
    again.record_round(record(3, (10, 0, 0)), ArrayRecord({"w": torch.zeros(2)}), {})
    assert again.dead_classes() == {1: (2, 2), 2: (1, 3)}
    assert dead_class_note(again.dead_classes()) == "dead classes 2 for 3 rounds; 1 for 2 rounds"
    again.record_round(record(4, (10, 3, 0)), ArrayRecord({"w": torch.zeros(2)}), {})  # class 1 recovers
    summary = again.finish(central((10, 3, 0)), assumptions_hold=True)
    assert summary["dead_classes"] == {"2": {"first_round": 1, "rounds": 4}}
    assert json.loads((again.directory / "summary.json").read_text())["dead_classes"] == summary["dead_classes"]
    assert [row["round"] for row in rows(again.directory)] == ["1", "2", "3", "4"]
