"""The ServerApp's own parts in-process: the central evaluator's metrics, the round line and the
end-of-run lines (what each eps covers and what it does not)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from sklearn.metrics import balanced_accuracy_score, roc_auc_score

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import OutputConfig, PrivacyConfig
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.metrics import ClassCounts
from dirichlet_fl.models.run_model import initial_model
from dirichlet_fl.runs.writer import RoundRecord, RunWriter
from privacy.registry import MECHANISMS
from server.server_app import _central_evaluator, _round_line, _summary_lines


def test_the_central_evaluator_returns_balanced_accuracy_macro_auc_and_every_recall() -> None:
    config = RunConfig.from_run_config({"partitioner": "iid", "device": "cpu"})
    data = federated_split(config.split_spec(2)).data
    model = initial_model(config, data)
    metrics = _central_evaluator(config, 2)(1, ArrayRecord(model.state_dict()))
    with torch.no_grad():
        logits = model.eval()(data.test_x)
    predictions, labels = logits.argmax(1).numpy(), data.test_y.numpy()
    for c in range(10):  # recall of class c, computed independently
        assert metrics[f"recall_{c}"] == pytest.approx(float(np.mean(predictions[labels == c] == c)), abs=1e-12)
    assert metrics["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, predictions), abs=1e-12)
    probabilities = torch.softmax(logits.double(), 1).numpy()
    assert metrics["macro_auc"] == pytest.approx(roc_auc_score(labels, probabilities, multi_class="ovr"), abs=1e-6)
    assert metrics["min_class_recall"] == min(metrics[f"recall_{c}"] for c in range(10))
    assert metrics["accuracy"] == pytest.approx(float(np.mean(predictions == labels)), abs=1e-12)


def _finished(tmp_path: Path, mechanism: str, hits: tuple[int, ...],
              predicted: int = 3) -> tuple[RunConfig, dict, dict, RunWriter]:
    config = RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name=mechanism, dead_class_rounds=1),
                       privacy=PrivacyConfig(mechanism=mechanism))
    writer = RunWriter.create(config, 1, MECHANISMS[mechanism].covers, num_classes=len(hits))
    metrics = {"accuracy": 0.7, "loss": 0.9, "macro_auc": 0.8, "predicted_classes": predicted,
               **ClassCounts(hits, (10,) * len(hits)).metrics()}
    trained = {0: {"epsilon": 0.5, "target-epsilon": 1.0, "delta": 1e-5, "steps": 4, "sample-rate": 0.1}}
    row = writer.record_round(RoundRecord(1, trained=trained, central=metrics), ArrayRecord({"w": torch.zeros(1)}), {})
    return config, row, writer.finish(metrics, assumptions_hold=True), writer


def test_the_round_line_shows_balanced_accuracy_macro_auc_and_dead_classes(tmp_path: Path) -> None:
    config, row, _, writer = _finished(tmp_path, "dirichlet", (10, 0, 7, 0))
    line = _round_line(config, row, writer.dead_classes())
    assert "accuracy 0.7000  balanced accuracy 0.4250  macro AUC 0.8000  loss 0.9000" in line
    assert "dead classes 1,3 for 1 round" in line and "max eps 0.5000" in line
    assert "dead classes" not in _round_line(config, row, {})


@pytest.mark.parametrize("mechanism", ["dirichlet", "dpsgd"])
def test_the_end_of_run_lines_say_what_each_eps_does_not_cover(tmp_path: Path, mechanism: str) -> None:
    config, _, summary, writer = _finished(tmp_path, mechanism, (10, 0))
    lines = _summary_lines(config, summary, writer.directory)
    assert lines[0].startswith("final accuracy 0.7000  balanced accuracy 0.5000  macro AUC 0.8000")
    assert "dead classes 1 for 1 round at the end (summary.json: dead_classes)" in lines
    not_covered = [line for line in lines if "does NOT cover" in line]
    if MECHANISMS[mechanism].does_not_cover is None:  # DP-SGD: its eps covers the weights and every update
        assert not_covered == [] and summary["epsilon_does_not_cover"] is None
    else:
        assert summary["epsilon_does_not_cover"] == MECHANISMS[mechanism].does_not_cover
        assert not_covered == [f"each eps does NOT cover {summary['epsilon_does_not_cover']}; audit this run: "
                               "`dirichlet-fl audit <run folder>`"]
        assert "trained weights" in not_covered[0] and "docs/audit.md" in not_covered[0]


def test_a_collapsed_model_is_reported_as_collapsed_never_as_a_plain_accuracy(tmp_path: Path) -> None:
    """A model that predicts one class: the round line and the final line say so before any accuracy, and
    summary.json holds the two distinct facts, collapsed and the count of dead classes (recall 0)."""
    config, row, summary, writer = _finished(tmp_path, "dirichlet", (10, 0, 0, 0), predicted=1)
    assert row["central_predicted_classes"] == 1
    line = _round_line(config, row, writer.dead_classes())
    assert line.startswith("round 1/5  COLLAPSED: predicts class 0 only: accuracy 0.7000")
    assert _summary_lines(config, summary, writer.directory)[0].startswith(
        "final COLLAPSED: predicts class 0 only: accuracy 0.7000")
    assert (summary["collapsed"], summary["final_dead_classes"], summary["predicted_classes"]) == (True, 3, 1)

    config, row, summary, writer = _finished(tmp_path / "alive", "dirichlet", (10, 0, 7, 0), predicted=3)
    assert "COLLAPSED" not in _round_line(config, row, {})
    assert (summary["collapsed"], summary["final_dead_classes"], summary["predicted_classes"]) == (False, 2, 3)
