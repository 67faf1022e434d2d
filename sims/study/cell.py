"""One cell of the study: a federated run in the plain loop (sims.fedavg_loop, tested against the app)
and its table.csv row.

How the clients fare: client i's accuracy is the global model's accuracy on a test set drawn like
client i's own training data, sum_c p_i(c) recall_c, with p_i(c) its share of class c and recall_c the
final model's recall of class c on the (central) test set. Under label skew a client that holds mostly
a class the model neglects scores low; with an IID split every client scores about the accuracy.
Classes absent from the test set are left out and the shares of the others renormalised.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from dirichlet_fl.data.split import federated_split
from dirichlet_fl.metrics import is_collapsed
from privacy.accounting.analysis import PAPER_DELTA
from privacy.registry import mechanism_class
from sims.fedavg_loop import LoopRound, run_fedavg
from sims.study.plan import Cell, Study, client_floor, clients_of, run_config

COLUMNS = ["beta", "epsilon", "mechanism", "seed", "status", "accuracy", "balanced_accuracy", "macro_auc",
           "worst_client_accuracy", "median_client_accuracy", "max_client_epsilon", "delta", "learning_rate",
           "rate_source", "floor", "min_class_recall", "dead_classes", "noise", "failed_clients",
           "client_accuracies", "seconds", "cpu_seconds", "collapsed", "predicted_classes", "optimizer", "strategy",
           "server_learning_rate"]
"""table.csv: `beta` holds the partition (a beta, iid, central, classes=K or natural); `rate_source` is
`flag` (a rate flag gave it) or `validation` (tuned, tuning.csv), in the units of the row's `optimizer`
(sgd or adam; a study folder from before the column ran sgd); `strategy` is the server's strategy
(fedavg when absent: a folder from before the column) and `server_learning_rate` its tuned server rate
(empty for fedavg and fedprox); `collapsed` is 1 when the final model
predicts one class only on the evaluation set (a constant predictor, whatever its accuracy), else 0, and
`dead_classes` counts the classes whose recall is 0: two distinct facts (a study folder from before they
existed has no `collapsed`)."""


def client_accuracies(parts: list[np.ndarray], labels: np.ndarray, recalls: tuple[float, ...]) -> list[float]:
    """Each client's accuracy on a test set with its own label mix (module docstring)."""
    present = np.array([not math.isnan(r) for r in recalls])
    recall = np.nan_to_num(np.array(recalls, dtype=float))
    result = []
    for part in parts:
        counts = np.bincount(labels[part], minlength=len(recalls)).astype(float) * present
        result.append(float(counts @ recall / counts.sum()) if counts.sum() else math.nan)
    return result


def final_metrics(final: LoopRound) -> dict[str, object]:
    """The global model's metrics after the last round: accuracy, balanced accuracy, macro AUC, the
    smallest per-class recall, the dead classes (recall 0), classes absent from the evaluation left out, and
    whether it collapsed to one class (1 or 0) with how many classes it predicts."""
    recalls = [r for r in final.central_per_class_recall if not math.isnan(r)]
    return {"accuracy": final.central_accuracy, "balanced_accuracy": final.central_balanced_accuracy,
            "macro_auc": final.central_macro_auc, "min_class_recall": min(recalls, default=math.nan),
            "dead_classes": sum(1 for r in recalls if r == 0.0),
            "collapsed": int(is_collapsed(final.central_predicted_classes, len(recalls))),
            "predicted_classes": final.central_predicted_classes}


def noise_range(parameters: dict[int, dict[str, float]]) -> str:
    """The clients' noise parameter as 'name=min..max' (r for Dirichlet, the noise multiplier for DP-SGD)."""
    for name in ("r", "noise_multiplier"):
        values = [p[name] for p in parameters.values() if name in p]
        if values:
            return f"{name}={min(values):.4g}..{max(values):.4g}"
    return ""


def run_cell(study: Study, cell: Cell, rate: float, source: str, server_rate: float = 0.0) -> dict[str, object]:
    """Run one cell at its optimizer's rate `rate` (from `source`: flag or validation) and its strategy's server
    rate `server_rate` (0: none); its table.csv row (COLUMNS; CPU seconds: what the cell costs on an idle core)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    config = run_config(study, cell, rate, server_rate=server_rate)
    clients = clients_of(study, cell.partition)
    mechanism = mechanism_class(cell.mechanism)
    row: dict[str, object] = {"beta": cell.partition, "epsilon": cell.epsilon, "mechanism": cell.mechanism,
                              "seed": cell.seed, "optimizer": cell.optimizer, "strategy": cell.strategy,
                              "server_learning_rate": server_rate or "", "delta": PAPER_DELTA,
                              "learning_rate": rate, "rate_source": source,
                              "floor": client_floor(config, clients) if mechanism.has_epsilon_floor else ""}
    result = run_fedavg(config, clients)
    final = result.rounds[-1] if result.rounds else None
    if final is None:
        return {**row, "status": "no-rounds", "seconds": time.perf_counter() - start,
                "cpu_seconds": time.process_time() - cpu_start}
    split = federated_split(config.split_spec(clients))
    per_client = client_accuracies(split.train_parts, split.data.train_y.numpy(), final.central_per_class_recall)
    defined = [a for a in per_client if not math.isnan(a)]
    return {**row, "status": "ok", **final_metrics(final),
            "worst_client_accuracy": min(defined, default=math.nan),
            "median_client_accuracy": statistics.median(defined) if defined else math.nan,
            "max_client_epsilon": max(result.client_epsilons.values()) if mechanism.private else math.inf,
            "noise": noise_range(result.client_parameters),
            "failed_clients": len(result.failures), "client_accuracies": ";".join(f"{a:.6g}" for a in per_client),
            "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu_start}
