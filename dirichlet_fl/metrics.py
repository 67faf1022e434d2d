"""What medical classification studies report, computed from a model's scores on one evaluation set.

Accuracy hides a model that never predicts a rare class: on DermaMNIST one class is 67 % of the test
set. MedMNIST reports accuracy and AUC; imbalanced-data studies add balanced accuracy (the mean
per-class recall) and the per-class recalls themselves. Counts (per-class hits and totals) add up
across clients exactly, so the federated evaluation sums them (strategies/federated_evaluation.py). AUC
does not decompose into numbers the clients could sum, and a mean of the clients' own AUCs is not the AUC
of their union, so no federated AUC is reported (docs/privacy.md, "What evaluation replies reveal").
`evaluate` (loss and accuracy only, for the benchmarks and the audit) and `true_class_confidence` (for
the adaptive learning rate) are the cheap ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ClassCounts:
    """Per-class hits (correct predictions) and totals (true examples) of one evaluation set."""

    hits: tuple[int, ...]
    totals: tuple[int, ...]

    @classmethod
    def of(cls, predictions: Tensor, labels: Tensor, num_classes: int) -> ClassCounts:
        totals = torch.bincount(labels, minlength=num_classes)
        hits = torch.bincount(labels[predictions == labels], minlength=num_classes)
        return cls(tuple(int(h) for h in hits.tolist()), tuple(int(t) for t in totals.tolist()))

    def __add__(self, other: ClassCounts) -> ClassCounts:
        if len(self.hits) != len(other.hits):
            raise ValueError(f"cannot add counts of {len(self.hits)} and {len(other.hits)} classes")
        return ClassCounts(
            tuple(a + b for a, b in zip(self.hits, other.hits)),
            tuple(a + b for a, b in zip(self.totals, other.totals)),
        )

    @property
    def recalls(self) -> tuple[float, ...]:
        """Recall of each class; nan for a class with no example in the set."""
        return tuple(h / t if t else math.nan for h, t in zip(self.hits, self.totals))

    @property
    def balanced_accuracy(self) -> float:
        """Mean recall over the classes present (scikit-learn's balanced_accuracy_score); nan if none."""
        present = [recall for recall in self.recalls if not math.isnan(recall)]
        return sum(present) / len(present) if present else math.nan

    @property
    def min_recall(self) -> float:
        """The smallest recall over the classes present; nan if none."""
        present = [recall for recall in self.recalls if not math.isnan(recall)]
        return min(present) if present else math.nan

    @property
    def dead_classes(self) -> tuple[int, ...]:
        """Classes present in the set that the model never predicts correctly (recall 0)."""
        return tuple(c for c, (h, t) in enumerate(zip(self.hits, self.totals)) if t and not h)

    def metrics(self) -> dict[str, float]:
        """balanced_accuracy, min_class_recall and recall_<c> of every class (nan: absent from the set):
        the per-class columns of rounds.csv, central and federated alike."""
        recalls = {recall_key(c): recall for c, recall in enumerate(self.recalls)}
        return {"balanced_accuracy": self.balanced_accuracy, "min_class_recall": self.min_recall, **recalls}


RECALL_PREFIX = "recall_"


def recall_key(label: int) -> str:
    """The metrics key (and, prefixed, the rounds.csv column) of class `label`'s recall."""
    return f"{RECALL_PREFIX}{label}"


def recalls_of(metrics: Mapping[str, float], num_classes: int) -> list[float]:
    """Every class's recall from flat metrics (ClassCounts.metrics); nan where one is missing."""
    return [float(metrics.get(recall_key(c), math.nan)) for c in range(num_classes)]


def binary_auc(scores: Tensor, positive: Tensor) -> float:
    """Area under the ROC curve of `scores` for the boolean `positive`: the Mann-Whitney statistic with
    ties counted one half (average ranks); nan unless both positives and negatives are present."""
    num_pos = int(positive.sum())
    num_neg = int(positive.numel()) - num_pos
    if num_pos == 0 or num_neg == 0:
        return math.nan
    values, inverse, counts = torch.unique(scores.double(), return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    average_rank = (ends - (counts.double() - 1) / 2)[inverse]
    rank_sum = float(average_rank[positive].sum())
    return (rank_sum - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg)


def macro_auc(probabilities: Tensor, labels: Tensor) -> float:
    """Mean one-vs-rest AUC over the classes with both positives and negatives in the set (scikit-learn's
    roc_auc_score(multi_class="ovr", average="macro") when every class is present); nan if none."""
    aucs = [binary_auc(probabilities[:, c], labels == c) for c in range(probabilities.shape[1])]
    defined = [auc for auc in aucs if not math.isnan(auc)]
    return sum(defined) / len(defined) if defined else math.nan


PREDICTED_CLASSES = "predicted_classes"
"""The metrics key of how many distinct classes the model predicts on the set (1: collapsed)."""


def predicted_count(predictions: Tensor) -> int:
    """How many distinct classes `predictions` (one class index per example) contain."""
    return int(torch.unique(predictions).numel())


def is_collapsed(predicted_classes: float, present_classes: int) -> bool:
    """A model that predicts a single class on an evaluation set holding two or more (a constant predictor,
    whatever its accuracy: on DermaMNIST the majority class alone scores 67 %)."""
    return predicted_classes == 1 and present_classes >= 2


def collapse_note(predicted_classes: float, recalls: Sequence[float]) -> str:
    """The flag of a collapsed model (is_collapsed), naming the class it predicts, or '' when it did not
    collapse: `predicted_classes` as Evaluation.predicted_classes, `recalls` each class's (nan: absent)."""
    present = [recall for recall in recalls if not math.isnan(recall)]
    if not is_collapsed(predicted_classes, len(present)):
        return ""
    alive = [c for c, recall in enumerate(recalls) if recall > 0]
    which = f"class {alive[0]}" if len(alive) == 1 else "one class"
    return f"COLLAPSED: predicts {which} only"


@dataclass(frozen=True)
class Evaluation:
    """A model on one evaluation set: mean cross-entropy, accuracy, macro AUC, the per-class counts
    (from which balanced accuracy, per-class recall and dead classes follow) and how many distinct classes
    it predicts (1: collapsed, a constant predictor; 0: no examples)."""

    loss: float
    accuracy: float
    macro_auc: float
    counts: ClassCounts
    predicted_classes: int = 0

    @property
    def collapsed(self) -> bool:
        """It predicts one class only on a set holding two or more (is_collapsed)."""
        return is_collapsed(self.predicted_classes, sum(1 for total in self.counts.totals if total))

    @property
    def balanced_accuracy(self) -> float:
        return self.counts.balanced_accuracy

    @property
    def per_class_recall(self) -> tuple[float, ...]:
        return self.counts.recalls

    @property
    def min_class_recall(self) -> float:
        return self.counts.min_recall

    def metrics(self) -> dict[str, float]:
        """loss, accuracy, macro_auc, predicted_classes and the count metrics (ClassCounts.metrics), flat: what
        the server's central evaluation returns and rounds.csv's central_* columns hold."""
        return {"loss": self.loss, "accuracy": self.accuracy, "macro_auc": self.macro_auc,
                PREDICTED_CLASSES: self.predicted_classes, **self.counts.metrics()}


def evaluation_of(logits: Tensor, labels: Tensor) -> Evaluation:
    """Every metric above from a model's logits (examples x classes) on (its evaluation set's) labels."""
    labels = labels.long()
    count = int(labels.shape[0])
    if count == 0:
        empty = ClassCounts((0,) * logits.shape[1], (0,) * logits.shape[1])
        return Evaluation(math.nan, math.nan, math.nan, empty)
    loss = float(torch.nn.functional.cross_entropy(logits.double(), labels, reduction="mean"))
    predictions = logits.argmax(dim=1)
    counts = ClassCounts.of(predictions, labels, logits.shape[1])
    accuracy = float((predictions == labels).double().mean())
    auc = macro_auc(torch.softmax(logits.double(), dim=1), labels)
    return Evaluation(loss, accuracy, auc, counts, predicted_count(predictions))


def dead_class_streaks(dead: Sequence[int], previous: dict[int, int]) -> dict[int, int]:
    """Each class dead this round (`dead`) with its number of consecutive dead rounds, continuing
    `previous` (class -> streak up to the last round); a class alive again drops out."""
    return {c: previous.get(c, 0) + 1 for c in sorted(set(dead))}


def dead_of(recalls: Sequence[float]) -> list[int]:
    """The classes whose recall is exactly 0 (nan, a class absent from the set, is not dead)."""
    return [c for c, recall in enumerate(recalls) if recall == 0.0]


def lasting(streaks: Mapping[int, int], min_rounds: int, last_round: int) -> dict[int, tuple[int, int]]:
    """The streaks (dead_class_streaks) of at least `min_rounds` rounds up to round `last_round`:
    class -> (first round of the streak, its length)."""
    return {c: (last_round - n + 1, n) for c, n in sorted(streaks.items()) if n >= min_rounds}


def dead_class_note(dead: Mapping[int, tuple[int, int]]) -> str:
    """The round line's warning, classes grouped by streak length: `dead classes 5,6 for 3 rounds`."""
    by_length: dict[int, list[int]] = {}
    for c, (_, length) in dead.items():
        by_length.setdefault(length, []).append(c)
    parts = [f"{','.join(map(str, classes))} for {n} round{'s' * (n != 1)}"
             for n, classes in sorted(by_length.items(), reverse=True)]
    return f"dead classes {'; '.join(parts)}" if parts else ""


@torch.no_grad()
def evaluate_model(model: torch.nn.Module, inputs: Tensor, labels: Tensor, batch_size: int = 1024) -> Evaluation:
    """The model's Evaluation on (inputs, labels), forward passes in eval mode and in batches. Without
    examples (a client's empty test share) one zero-size forward pass gives the number of classes, so
    that its all-zero counts still add to the other clients'."""
    model.eval()
    logits = [model(inputs[start : start + batch_size]) for start in range(0, labels.shape[0], batch_size)]
    return evaluation_of(torch.cat(logits) if logits else model(inputs[:0]), labels)


@torch.no_grad()
def evaluate(model: torch.nn.Module, inputs: Tensor, labels: Tensor, batch_size: int = 1024) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of the model on (inputs, labels)."""
    model.eval()
    loss_sum = torch.zeros((), device=inputs.device)
    correct = torch.zeros((), device=inputs.device)
    for start in range(0, labels.shape[0], batch_size):
        logits = model(inputs[start : start + batch_size])
        target = labels[start : start + batch_size]
        loss_sum += torch.nn.functional.cross_entropy(logits, target, reduction="sum")
        correct += (logits.argmax(dim=1) == target).sum()
    count = max(labels.shape[0], 1)
    return float(loss_sum) / count, float(correct) / count


@torch.no_grad()
def true_class_confidence(model: torch.nn.Module, inputs: Tensor, labels: Tensor) -> float:
    """Mean softmax probability the model gives the true class (nan without examples)."""
    if labels.numel() == 0:
        return math.nan
    model.eval()
    probabilities = torch.softmax(model(inputs), dim=-1)
    return float(probabilities.gather(1, labels.view(-1, 1)).mean())
