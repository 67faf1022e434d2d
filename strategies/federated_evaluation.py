"""The federated evaluation's aggregate: FedAvg's weighted mean for loss and accuracy, exact sums for
the per-class counts.

Each evaluating client replies with its loss and accuracy on its local test share, its rounded example
count (the weight), and its per-class hits and totals (dirichlet_fl.protocol.CLASS_HITS, CLASS_TOTALS).
A weighted mean of counts would be meaningless, so they are summed: the federated balanced accuracy
and per-class recall are then exactly those of the union of the clients' test shares, as if one party
had evaluated them all (dirichlet_fl.metrics.ClassCounts). Macro AUC has no such decomposition and is
not reported federated (docs/privacy.md says what the replies reveal).
"""

from __future__ import annotations

import math
from typing import cast

from flwr.app import MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from dirichlet_fl.metrics import ClassCounts
from dirichlet_fl.protocol import CLASS_HITS, CLASS_TOTALS

COUNT_KEYS = (CLASS_HITS, CLASS_TOTALS)


def counts_of(metrics: MetricRecord) -> ClassCounts | None:
    """One reply's (or the aggregate's) per-class counts; None when it carries none."""
    if CLASS_HITS not in metrics or CLASS_TOTALS not in metrics:
        return None
    hits, totals = (tuple(int(v) for v in cast(list[int], metrics[key])) for key in COUNT_KEYS)
    return ClassCounts(hits, totals)


def aggregate_evaluation(records: list[RecordDict], weighting_key: str) -> MetricRecord:
    """FedAvg's evaluate_metrics_aggr_fn: the weighted mean of every other metric (Flower's
    aggregate_metricrecords) over the replies of positive weight (a client with an empty test share
    weighs 0; none left: nan), and the per-class counts of all of them summed, in the order of `records`."""
    scalars = []
    counts: ClassCounts | None = None
    for record in records:
        metrics = next(iter(record.metric_records.values()))
        own = counts_of(metrics)  # Flower checked that every reply has the same keys
        if own is not None:
            counts = own if counts is None else counts + own
        if float(cast(float, metrics[weighting_key])) > 0:
            kept = MetricRecord({k: v for k, v in metrics.items() if k not in COUNT_KEYS})
            scalars.append(RecordDict({"metrics": kept}))
    aggregate = aggregate_metricrecords(scalars, weighting_key) if scalars else MetricRecord(
        {"eval-loss": math.nan, "eval-accuracy": math.nan})
    if counts is not None:
        aggregate[CLASS_HITS], aggregate[CLASS_TOTALS] = list(counts.hits), list(counts.totals)
    return aggregate


def federated_metrics(aggregate: MetricRecord | None) -> dict[str, float]:
    """RoundRecord.federated: loss and accuracy, and the count metrics of the summed counts
    (ClassCounts.metrics); empty when no client evaluated."""
    if aggregate is None:
        return {}
    metrics = {name: float(cast(float, aggregate.get(key, math.nan)))
               for name, key in (("loss", "eval-loss"), ("accuracy", "eval-accuracy"))}
    counts = counts_of(aggregate)
    return metrics if counts is None else metrics | counts.metrics()
