"""Balanced accuracy, macro AUC, per-class recall and dead classes, against scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, recall_score, roc_auc_score

from dirichlet_fl.metrics import (
    ClassCounts,
    binary_auc,
    dead_class_note,
    dead_class_streaks,
    dead_of,
    evaluate_model,
    evaluation_of,
    lasting,
    macro_auc,
)


def _imbalanced(seed: int, n: int = 600, classes: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """DermaMNIST-like class proportions, logits that are informative but imperfect, with ties."""
    rng = np.random.default_rng(seed)
    labels = rng.choice(classes, size=n, p=[0.67, 0.11, 0.11, 0.05, 0.03, 0.02, 0.01])
    logits = rng.normal(size=(n, classes)).round(1)  # rounding makes ties, which AUC must count as halves
    logits[np.arange(n), labels] += rng.uniform(0, 2.5, size=n)
    return torch.as_tensor(logits), torch.as_tensor(labels)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_scikit_learn(seed: int) -> None:
    logits, labels = _imbalanced(seed)
    result = evaluation_of(logits, labels)
    predictions = logits.argmax(1).numpy()
    probabilities = torch.softmax(logits, 1).numpy()
    present = np.unique(labels.numpy())
    assert result.balanced_accuracy == pytest.approx(balanced_accuracy_score(labels.numpy(), predictions))
    recalls = recall_score(labels.numpy(), predictions, labels=present, average=None, zero_division=0)
    assert [result.per_class_recall[c] for c in present] == pytest.approx(list(recalls))
    if len(present) == logits.shape[1]:
        expected = roc_auc_score(labels.numpy(), probabilities, multi_class="ovr", average="macro")
        assert result.macro_auc == pytest.approx(expected, abs=1e-9)
    assert result.accuracy == pytest.approx(float((predictions == labels.numpy()).mean()))


def test_binary_auc_counts_ties_as_halves_and_needs_both_classes() -> None:
    scores = torch.tensor([0.1, 0.5, 0.5, 0.9])
    positive = torch.tensor([False, True, False, True])
    assert binary_auc(scores, positive) == pytest.approx(roc_auc_score(positive.numpy(), scores.numpy()))
    assert math.isnan(binary_auc(scores, torch.ones(4, dtype=torch.bool)))


def test_a_majority_predictor_has_high_accuracy_and_dead_classes() -> None:
    """The failure accuracy hides: always predicting class 0 on a 67 % majority set."""
    _, labels = _imbalanced(0)
    logits = torch.zeros(labels.shape[0], 7)
    logits[:, 0] = 1.0
    result = evaluation_of(logits, labels)
    assert result.accuracy > 0.6
    assert result.balanced_accuracy == pytest.approx(1 / 7)
    assert result.counts.dead_classes == (1, 2, 3, 4, 5, 6)
    assert result.min_class_recall == 0.0
    assert macro_auc(torch.softmax(logits, 1), labels) == pytest.approx(0.5)


def test_counts_add_up_across_clients_to_the_pooled_counts() -> None:
    logits, labels = _imbalanced(3)
    pooled = evaluation_of(logits, labels).counts
    parts = [evaluation_of(logits[i::3], labels[i::3]).counts for i in range(3)]
    assert parts[0] + parts[1] + parts[2] == pooled
    with pytest.raises(ValueError, match="classes"):
        _ = pooled + ClassCounts((1,), (1,))


def test_absent_classes_are_nan_and_left_out_of_balanced_accuracy() -> None:
    counts = ClassCounts(hits=(3, 0, 1), totals=(4, 0, 2))
    assert counts.recalls[0] == 0.75 and math.isnan(counts.recalls[1])
    assert counts.balanced_accuracy == pytest.approx((0.75 + 0.5) / 2)
    assert counts.dead_classes == ()


def test_an_empty_set_gives_nan_not_an_error() -> None:
    result = evaluation_of(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    assert math.isnan(result.accuracy) and math.isnan(result.balanced_accuracy)


def test_dead_class_streaks_continue_and_reset() -> None:
    streaks = dead_class_streaks([5, 6], {})
    streaks = dead_class_streaks([6], streaks)
    assert streaks == {6: 2}
    assert dead_class_streaks([5, 6], streaks) == {5: 1, 6: 3}


def test_only_a_zero_recall_is_dead_and_only_long_streaks_are_reported() -> None:
    assert dead_of([0.5, 0.0, math.nan, 0.0]) == [1, 3]  # nan: the class is absent, not dead
    assert lasting({1: 3, 3: 1, 4: 4}, 3, last_round=7) == {1: (5, 3), 4: (4, 4)}
    assert dead_class_note({5: (2, 3), 6: (2, 3), 1: (1, 4)}) == "dead classes 1 for 4 rounds; 5,6 for 3 rounds"
    assert dead_class_note({}) == ""


def test_count_metrics_are_flat_and_per_class() -> None:
    metrics = ClassCounts(hits=(3, 0, 1), totals=(4, 0, 2)).metrics()
    assert metrics["recall_0"] == 0.75 and math.isnan(metrics["recall_1"]) and metrics["recall_2"] == 0.5
    assert metrics["min_class_recall"] == 0.5 and metrics["balanced_accuracy"] == pytest.approx(0.625)


def test_a_model_on_no_examples_gives_all_zero_counts_of_every_class() -> None:
    result = evaluate_model(torch.nn.Linear(4, 6), torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))
    assert result.counts == ClassCounts((0,) * 6, (0,) * 6) and math.isnan(result.loss)


def test_a_constant_predictor_is_collapsed_and_its_other_classes_dead() -> None:
    from dirichlet_fl.metrics import collapse_note

    labels = torch.tensor([0, 0, 0, 1, 2, 2])
    constant = torch.tensor([[5.0, 0.0, 0.0]]).repeat(6, 1)
    evaluation = evaluation_of(constant, labels)
    assert evaluation.predicted_classes == 1 and evaluation.collapsed
    assert evaluation.counts.dead_classes == (1, 2) and evaluation.accuracy == 0.5
    assert evaluation.metrics()["predicted_classes"] == 1
    assert collapse_note(1, evaluation.per_class_recall) == "COLLAPSED: predicts class 0 only"
    mixed = evaluation_of(torch.eye(3)[torch.tensor([0, 0, 1, 1, 0, 0])] * 5, labels)
    assert mixed.predicted_classes == 2 and not mixed.collapsed and mixed.counts.dead_classes == (2,)
    assert collapse_note(2, mixed.per_class_recall) == ""
    one_class_set = evaluation_of(constant[:3], labels[:3])  # a set of one class: nothing to collapse from
    assert one_class_set.predicted_classes == 1 and not one_class_set.collapsed
