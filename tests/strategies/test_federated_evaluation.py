"""The federated evaluation: per-class counts from the clients' replies summed by the server give the
same balanced accuracy and recalls as one evaluation of the pooled test shares."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from sklearn.metrics import balanced_accuracy_score

from dirichlet_fl.config import RunConfig
from dirichlet_fl.metrics import evaluation_of
from dirichlet_fl.protocol import CLASS_HITS, CLASS_TOTALS
from strategies.federated_evaluation import aggregate_evaluation, federated_metrics
from strategies.private import PrivateStrategy
from tests.helpers import set_task_identity

set_task_identity()
SIZES = (40, 7, 120, 25)
"""Unequal test shares; the second is too small to hold every class."""


def _test_set(classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(4)
    labels = rng.choice(classes, size=sum(SIZES), p=[0.6, 0.2, 0.1, 0.07, 0.03])
    logits = rng.normal(size=(labels.size, classes))
    logits[np.arange(labels.size), labels] += rng.uniform(0, 2, size=labels.size)
    return torch.as_tensor(logits), torch.as_tensor(labels)


def _evaluate_replies(strategy: PrivateStrategy, logits: torch.Tensor, labels: torch.Tensor) -> list[Message]:
    """Each node's evaluate reply on its share, as client/round.py evaluate_round builds it."""
    messages = list(strategy.configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid=None))
    bounds = np.cumsum((0, *SIZES))
    replies = []
    for message in messages:
        part = strategy.partition_of[message.metadata.dst_node_id]
        share = slice(int(bounds[part]), int(bounds[part + 1]))
        result = evaluation_of(logits[share], labels[share])
        metrics = MetricRecord({"num-examples": 10.0 * (part + 1), "eval-loss": result.loss,
                                "eval-accuracy": result.accuracy, CLASS_HITS: list(result.counts.hits),
                                CLASS_TOTALS: list(result.counts.totals)})
        replies.append(Message(RecordDict({"metrics": metrics}), reply_to=message))
    return replies[::-1]  # arrival order is not partition order


def test_summed_counts_equal_the_central_computation_on_the_same_data() -> None:
    strategy = PrivateStrategy(RunConfig(fraction_evaluate=1.0))
    strategy.partition_of = {node: part for part, node in enumerate([31, 7, 4242, 9001])}
    strategy.num_partitions = len(SIZES)
    logits, labels = _test_set()
    federated = federated_metrics(strategy.aggregate_evaluate(1, _evaluate_replies(strategy, logits, labels)))
    pooled = evaluation_of(logits, labels)
    assert {key: federated[key] for key in pooled.counts.metrics()} == pooled.counts.metrics()  # exact
    predictions = logits.argmax(1)
    for c in range(5):  # recall computed independently: a wrong per-class formula fails here
        assert federated[f"recall_{c}"] == float((predictions[labels == c] == c).double().mean())
    assert federated["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, predictions), abs=1e-12)
    assert federated["min_class_recall"] == min(federated[f"recall_{c}"] for c in range(5))
    assert "macro_auc" not in federated  # AUC does not decompose: none is reported federated


def test_loss_and_accuracy_stay_fedavgs_weighted_means() -> None:
    records = [RecordDict({"metrics": MetricRecord({"num-examples": w, "eval-loss": loss, "eval-accuracy": acc,
                                                    CLASS_HITS: [h, 0], CLASS_TOTALS: [4, 2]})})
               for w, loss, acc, h in ((10.0, 1.0, 0.5, 1), (30.0, 2.0, 0.9, 3))]
    aggregate = aggregate_evaluation(records, "num-examples")
    assert aggregate["eval-loss"] == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)
    assert aggregate["eval-accuracy"] == pytest.approx((10 * 0.5 + 30 * 0.9) / 40)
    assert aggregate[CLASS_HITS] == [4, 0] and aggregate[CLASS_TOTALS] == [8, 4]  # summed, not averaged
    assert federated_metrics(aggregate)["recall_1"] == 0.0


def test_replies_without_counts_give_loss_and_accuracy_only() -> None:
    records = [RecordDict({"metrics": MetricRecord({"num-examples": 10.0, "eval-loss": 1.0, "eval-accuracy": 0.5})})]
    federated = federated_metrics(aggregate_evaluation(records, "num-examples"))
    assert federated == {"loss": 1.0, "accuracy": 0.5}
    assert federated_metrics(None) == {}
    assert math.isnan(federated_metrics(MetricRecord({"eval-accuracy": 0.5}))["loss"])


def test_a_client_with_an_empty_test_share_adds_zero_counts_and_no_weight() -> None:
    """10,000 clients share a test split of a few thousand: many evaluating clients hold no test example."""
    empty = evaluation_of(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))
    replies = [(10.0, 1.0, 0.5, [1, 0], [4, 2]),
               (0.0, empty.loss, empty.accuracy, list(empty.counts.hits), list(empty.counts.totals))]
    records = [RecordDict({"metrics": MetricRecord({"num-examples": w, "eval-loss": loss, "eval-accuracy": acc,
                                                    CLASS_HITS: hits, CLASS_TOTALS: totals})})
               for w, loss, acc, hits, totals in replies]
    federated = federated_metrics(aggregate_evaluation(records, "num-examples"))
    assert (federated["loss"], federated["accuracy"], federated["recall_0"]) == (1.0, 0.5, 0.25)
    alone = federated_metrics(aggregate_evaluation(records[1:], "num-examples"))
    assert math.isnan(alone["loss"]) and math.isnan(alone["balanced_accuracy"])  # nothing to evaluate: nan
