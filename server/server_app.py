"""The ServerApp: FedAvg over privately trained client updates, evaluated centrally each round.

It builds the model, runs PrivateFedAvg for num-server-rounds (fewer if every client's budget is
spent), evaluates the global model on the held-out test set each round, and writes the run's
folder (server/results.py). It prints one line per round and, at the end, what the eps covers.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from dirichlet_fl.config import RunConfig
from dirichlet_fl.protocol import code_fingerprint
from dirichlet_fl.runs import RoundRecord, RunWriter
from dirichlet_fl.task import build_run_model, evaluate, federated_split, initial_model, resolve_device
from privacy.registry import covers
from strategies.private_fedavg import PrivateFedAvg

app = ServerApp()
APP_DIR = Path(__file__).resolve().parent.parent
"""The app this ServerApp was loaded from (the submitted bundle, under Flower)."""


def _central_evaluator(config: RunConfig, num_clients: int):
    """evaluate_fn(round, arrays) on the full test split, on the server's device."""
    data = federated_split(config.split_spec(num_clients)).data
    device = resolve_device(config.device)
    test_x, test_y = data.test_x.to(device), data.test_y.to(device)
    model = build_run_model(config, data).to(device)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, test_x, test_y)
        return {"loss": loss, "accuracy": accuracy}

    return evaluate_fn


def _round_line(config: RunConfig, row: dict[str, Any]) -> str:
    eps = row["max_epsilon"]
    privacy = "" if config.mechanism == "none" else f"  max eps {eps:.4f} (delta={config.delta:g})"
    return (
        f"round {row['round']}/{config.num_server_rounds}  accuracy {row['central_accuracy']:.4f}  "
        f"loss {row['central_loss']:.4f}  trained {row['trained']}  refused {row['refused']}  "
        f"failed {row['failed']}{privacy}  [{row['seconds']:.1f} s]"
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the federation and write results-dir/<run>/."""
    config = RunConfig.from_run_config(context.run_config)
    strategy = PrivateFedAvg(
        seed=config.seed, fraction_train=config.fraction_train, fraction_evaluate=config.fraction_evaluate
    )
    num_clients = strategy.discover(grid, code_fingerprint(APP_DIR))
    data = federated_split(config.split_spec(num_clients)).data
    model = initial_model(config, data)
    writer = RunWriter.create(config, num_clients, covers(config.mechanism))
    evaluate_fn = _central_evaluator(config, num_clients)
    initial_arrays = ArrayRecord(model.state_dict())
    start = evaluate_fn(0, initial_arrays)
    log(INFO, "dirichlet-fl: %s, %d clients, writing %s", config.mechanism, num_clients, writer.directory)
    log(INFO, "round 0  accuracy %.4f  loss %.4f", start["accuracy"], start["loss"])

    def on_round(record: RoundRecord, arrays: ArrayRecord) -> None:
        log(INFO, "%s", _round_line(config, writer.record_round(record, arrays)))

    final_arrays = strategy.run(grid, initial_arrays, config.num_server_rounds, evaluate_fn, on_round)
    writer.save_weights(final_arrays)
    final = evaluate_fn(config.num_server_rounds, final_arrays)
    summary = writer.finish(final["accuracy"], final["loss"], assumptions_hold=not config.allow_batch_norm)
    for line in _summary_lines(config, summary, writer.directory):
        log(INFO, "%s", line)
    if config.audit:
        from dirichlet_fl.run_audit import audit_run

        report = audit_run(writer.directory)
        log(INFO, "audit: AUC %.3f, empirical eps >= %.3f vs claimed %.4f (delta=%g)%s; see %s/audit.json",
            report.auc, report.eps_lower_bound, report.claimed_eps, config.delta,
            "  VIOLATION" if report.violation else "", writer.directory)


def _summary_lines(config: RunConfig, summary: dict[str, Any], directory: Path) -> list[str]:
    lines = [f"final accuracy {summary['final_accuracy']:.4f} after {summary['rounds']} rounds; results in {directory}"]
    if config.mechanism == "none":
        return lines + ["mechanism none: training is not private"]
    for client in summary["clients"]:
        if not client["steps"]:
            lines.append(f"client {client['id']}: never trained (eps 0 of {client['target_epsilon']:g})")
            continue
        lines.append(
            f"client {client['id']}: eps {client['epsilon']:.4f} of {client['target_epsilon']:g} "
            f"(delta={client['delta']:g}, q={client['sample_rate']:.4g}, {client['steps']} steps, "
            f"refused {client['refused_rounds']} rounds)"
        )
    lines.append(f"each eps covers {summary['epsilon_covers']}")
    if config.mechanism == "dirichlet":
        lines.append("the weights can leak more than eps: measure it with `dirichlet-fl audit <run folder>`")
    if not summary["accountant_assumptions_hold"]:
        lines.append("WARNING: allow-batch-norm=true: BatchNorm mixes examples; the eps above does not apply")
    return lines
