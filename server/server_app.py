"""The ServerApp: the run's Flower strategy over privately trained client updates, evaluated centrally each round.

It builds the model, runs the run's strategy (strategies/build.py: Flower's FedAvg, FedAdam, ... inside the
private wrapper) for num-server-rounds (fewer if every client's budget is
spent, or no client can train), evaluates the global model on the held-out test set each round, and
writes the run's folder (dirichlet_fl/runs/writer.py) with a checkpoint after every round, from which
`resume-from` continues a killed run. It prints one line per round, at the end what the eps covers,
and last the run's status line (STATUS_LINE), which scripts/run.sh reads.
"""

from __future__ import annotations

import math
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid import InMemoryGrid

from dirichlet_fl.client_plan import too_small_to_train
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import SYNTHETIC
from dirichlet_fl.data.split import federated_split, run_data
from dirichlet_fl.device import resolve_device
from dirichlet_fl.metrics import RECALL_PREFIX, collapse_note, dead_class_note, evaluate_model
from dirichlet_fl.models.run_model import build_run_model, initial_model
from dirichlet_fl.paths import APP_DIR
from dirichlet_fl.protocol import RUN_DIR_KEY, code_fingerprint, one_line
from dirichlet_fl.runs.writer import COMPLETED, FAILED, RoundRecord, RunWriter
from privacy.registry import covers, mechanism_class
from strategies.build import build_strategy
from strategies.private import PrivateStrategy

app = ServerApp()
CLIENT_LINES = 20
"""The final report prints one line per client up to this many clients; above, the ten with the largest
eps (summary.json has every client)."""


def _central_evaluator(config: RunConfig, num_clients: int):
    """evaluate_fn(round, arrays) on the full test split (synthetic: the held-out clients), on the server's
    device: loss, accuracy, balanced accuracy, macro AUC, the smallest and every class's recall
    (Evaluation.metrics())."""
    data = run_data(config.split_spec(num_clients))
    device = resolve_device(config.device)
    test_x, test_y = data.test_x.to(device), data.test_y.to(device)
    model = build_run_model(config, data).to(device)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        model.load_state_dict(arrays.to_torch_state_dict())
        return evaluate_model(model, test_x, test_y).metrics()

    return evaluate_fn


def _metrics_part(accuracy: float, balanced: float, auc: float, loss: float) -> str:
    return f"accuracy {accuracy:.4f}  balanced accuracy {balanced:.4f}  macro AUC {auc:.4f}  loss {loss:.4f}"


def _round_line(config: RunConfig, row: dict[str, Any], dead: dict[int, tuple[int, int]]) -> str:
    """One round: the central metrics, who trained, the largest eps, and the classes dead for
    dead-class-rounds rounds or more (`dead`: RunWriter.dead_classes)."""
    eps = row["max_epsilon"]
    private = mechanism_class(config.privacy.mechanism).private
    privacy = f"  max eps {eps:.4f} (delta={config.privacy.delta:g}, per example)" if private else ""
    metrics = _metrics_part(row["central_accuracy"], row["central_balanced_accuracy"], row["central_macro_auc"],
                            row["central_loss"])
    warning = f"  {dead_class_note(dead)}" if dead else ""
    recalls = [float(value) for key, value in row.items() if key.startswith(f"central_{RECALL_PREFIX}")]
    collapsed = collapse_note(row.get("central_predicted_classes", math.nan), recalls)
    return (
        f"round {row['round']}/{config.num_server_rounds}  {collapsed + ': ' if collapsed else ''}{metrics}  "
        f"trained {row['trained']}  "
        f"refused {row['refused']}  failed {row['failed']}{privacy}{_client_level_part(config, row)}{warning}  "
        f"[{row['seconds']:.1f} s]"
    )


def _client_level_part(config: RunConfig, row: dict[str, Any]) -> str:
    """The client-level eps of the aggregate (client-dp), labelled: it covers a whole client's data."""
    if config.client_level.mode == "none":
        return ""
    clipping = f", C={row['client_level_clipping_norm']:.4g}" if config.client_level.mode == "adaptive" else ""
    return (
        f"  client-level eps {row['client_level_epsilon']:.4f} (delta={row['client_level_delta']:g}, "
        f"q<={row['client_level_sample_rate']:.4g}, {row['client_level_rounds']:g} rounds, per client{clipping})"
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the federation and write results-dir/<run>/ (or continue the run in resume-from)."""
    try:  # before any folder exists: a bad key or a missing GPU leaves nothing behind, and one line
        config = RunConfig.from_run_config(context.run_config)
        resolve_device(config.device)
    except ValueError as error:
        log(ERROR, "%s %s (%s)", STATUS_LINE, BAD_INPUT, " ".join(str(error).split()))
        return
    strategy = build_strategy(config)
    try:
        num_clients = _connect(strategy, grid, config)
    except ValueError as error:
        log(ERROR, "%s %s (%s)", STATUS_LINE, BAD_INPUT, " ".join(str(error).split()))
        return
    evaluate_fn = _central_evaluator(config, num_clients)
    try:
        writer, arrays, first_round = _start(config, num_clients, strategy)
    except OSError as error:  # a read-only or full results-dir: one line, nothing half written
        log(ERROR, "%s %s (cannot write the run folder: %s)", STATUS_LINE, FAILED, one_line(error))
        return
    training = config.training
    log(INFO, "dirichlet-fl: %s, strategy %s, %d clients, %s at %g (%s), warm-up %d rounds, writing %s",
        config.privacy.mechanism, config.strategy.name, num_clients, training.optimizer, training.rate,
        "Adam's own units" if training.optimizer == "adam" else f"SGD, learning-rate-mode {config.lr.mode}",
        training.warmup_rounds, writer.directory)
    skipped = {} if config.data.dataset == SYNTHETIC else too_small_to_train(  # synthetic: checked by the config
        config, federated_split(config.split_spec(num_clients)))
    strategy.skip(set(skipped))
    if first_round == 1:
        writer.record_skipped(skipped)
    if skipped:
        log(INFO, "dirichlet-fl: %d of %d clients hold <= batch-size=%d examples and sit out (ledger.csv: skipped)",
            len(skipped), num_clients, config.local.batch_size)
    if first_round == 1:
        start = evaluate_fn(0, arrays)
        log(INFO, "round 0  %s", _metrics_part(start["accuracy"], start["balanced_accuracy"], start["macro_auc"],
                                               start["loss"]))
    else:
        log(INFO, "resuming after round %d of %d", first_round - 1, config.num_server_rounds)

    def on_round(record: RoundRecord, arrays: ArrayRecord) -> None:
        record.central = evaluate_fn(record.server_round, arrays)
        row = writer.record_round(record, arrays, strategy.state_dict())
        log(INFO, "%s", _round_line(config, row, writer.dead_classes()))

    train_config = ConfigRecord({RUN_DIR_KEY: str(writer.directory.resolve())})
    rounds = range(first_round, config.num_server_rounds + 1)
    try:
        outcome = strategy.run(grid=grid, arrays=arrays, rounds=rounds, train_config=train_config, on_round=on_round)
        final = evaluate_fn(config.num_server_rounds, outcome.arrays)
    except OSError as error:  # a full disk, a folder made read-only: one line, no traceback
        _finish_failed(writer, config, one_line(error))
        return
    except Exception as error:  # record the failure (every completed round stays on disk), then stop
        _finish_failed(writer, config, one_line(error))
        raise
    status = outcome.status
    summary = writer.finish(final, assumptions_hold=not config.network.allow_batch_norm, status=status,
                            reason=outcome.reason)
    for line in _summary_lines(config, summary, writer.directory):
        log(INFO, "%s", line)
    if config.output.audit and status == COMPLETED:
        from dirichlet_fl.runs.audit import audit_run

        result = audit_run(writer.directory)
        strongest = result.strongest()
        log(INFO, "audit: strongest attack %s (%s): AUC %.3f, empirical eps >= %.3f vs claimed %.4f (delta=%g); %s; "
            "see %s/audit.json", strongest.name, strongest.view, strongest.report.auc, strongest.eps_lower_bound,
            strongest.report.claimed_eps, config.privacy.delta, result.verdict().reason, writer.directory)
    log(INFO if status == COMPLETED else ERROR, "%s %s (%s); results in %s", STATUS_LINE, status, outcome.reason,
        writer.directory)


def _connect(strategy: PrivateStrategy, grid: Grid, config: RunConfig) -> int:
    """The run's clients: num-clients virtual clients served by the simulation's SuperNodes, else one per
    node (the discovery query). On the Deployment Engine a num-clients other than the sites' is refused."""
    code = code_fingerprint(APP_DIR)
    if config.num_clients and isinstance(grid, InMemoryGrid):
        return strategy.serve_virtual(grid, config.num_clients, code)
    num_clients = strategy.discover(grid, code)
    if config.num_clients and config.num_clients != num_clients:
        raise ValueError(f"num-clients={config.num_clients} is for simulation only: on the Deployment Engine each "
                         f"SuperNode is one site, and this federation has {num_clients}; set num-clients=0")
    return num_clients


STATUS_LINE = "dirichlet-fl run status:"
"""The server's last line starts with this; scripts/run.sh reads the status from it (flwr run exits 0 anyway)."""
BAD_INPUT = "bad-input"
"""The status of a run refused before it started: an invalid run-config key (the line names it and the fix)."""


def _start(config: RunConfig, num_clients: int, strategy: PrivateStrategy) -> tuple[RunWriter, ArrayRecord, int]:
    """A new run folder with the seeded initial model, or the resumed run's folder, strategy state and
    checkpointed weights. Returns the writer, the global weights and the first round to run."""
    data = run_data(config.split_spec(num_clients))
    if config.output.resume_from:
        writer, checkpoint = RunWriter.resume(config, num_clients, covers(config.privacy.mechanism), data.num_classes)
        strategy.load_state_dict(checkpoint["strategy"])
        return writer, ArrayRecord(checkpoint["weights"]), int(checkpoint["round"]) + 1
    model = initial_model(config, data)
    writer = RunWriter.create(config, num_clients, covers(config.privacy.mechanism), data.num_classes)
    return writer, ArrayRecord(model.state_dict()), 1


def _finish_failed(writer: RunWriter, config: RunConfig, reason: str) -> None:
    """summary.json with status failed, so that the folder says what happened; a full disk may prevent
    even that, which is logged (the rows and the checkpoint of every completed round stay consistent)."""
    try:
        writer.finish({}, assumptions_hold=not config.network.allow_batch_norm, status=FAILED, reason=reason)
    except OSError as error:
        log(ERROR, "dirichlet-fl: cannot write %s/summary.json: %s", writer.directory, one_line(error))
    log(ERROR, "%s %s (%s); results in %s", STATUS_LINE, FAILED, reason, writer.directory)


def _summary_lines(config: RunConfig, summary: dict[str, Any], directory: Path) -> list[str]:
    """The end-of-run lines: the final metrics, dead classes, every client's eps, what it covers and what not."""
    lines = [f"final {_final_part(summary)} after {summary['rounds']} rounds; results in {directory}"]
    if summary["dead_classes"]:
        dead = {int(c): (streak["first_round"], streak["rounds"]) for c, streak in summary["dead_classes"].items()}
        lines.append(f"{dead_class_note(dead)} at the end (summary.json: dead_classes)")
    if not mechanism_class(config.privacy.mechanism).private:
        not_private = f"mechanism {config.privacy.mechanism}: training is not private per example"
        return lines + [not_private] + _aggregation_lines(config, summary)
    clients = summary["clients"]
    if summary["num_clients"] > CLIENT_LINES:
        trained = [client for client in clients if client["steps"]]
        lines.append(f"{len(trained)} of {summary['num_clients']} clients trained; the {CLIENT_LINES // 2} with the "
                     "largest eps:")
        clients = sorted(trained, key=lambda client: -(client["epsilon"] or 0.0))[: CLIENT_LINES // 2]
    for client in clients:
        if not client["steps"]:
            lines.append(f"client {client['id']}: never trained (eps 0 of {client['target_epsilon']:g})")
            continue
        lines.append(
            f"client {client['id']}: eps {client['epsilon']:.4f} of {client['target_epsilon']:g} "
            f"(delta={client['delta']:g}, q={client['sample_rate']:.4g}, {client['steps']} steps, "
            f"refused {client['refused_rounds']} rounds)"
        )
    lines.append(f"each eps covers {summary['epsilon_covers']}; noise keyed by: {summary['noise']}")
    if summary["epsilon_does_not_cover"]:
        lines.append(f"each eps does NOT cover {summary['epsilon_does_not_cover']}; audit this run: "
                     "`dirichlet-fl audit <run folder>`")
    lines += _aggregation_lines(config, summary)
    if not summary["accountant_assumptions_hold"]:
        lines.append("WARNING: allow-batch-norm=true: BatchNorm mixes examples; the eps above does not apply")
    return lines


def _final_part(summary: dict[str, Any]) -> str:
    """The final model's metrics as the summary holds them (null, a failed evaluation, shown as nan)."""
    values = [summary[key] for key in ("final_accuracy", "final_balanced_accuracy", "final_macro_auc")]
    accuracy, balanced, auc = (math.nan if value is None else value for value in values)
    recalls = [recall for recall in summary["final_per_class_recall"] if recall is not None]
    smallest = f"  min class recall {min(recalls):.4f}" if recalls else ""
    every = [math.nan if recall is None else recall for recall in summary["final_per_class_recall"]]
    predicted = summary.get("predicted_classes")
    collapsed = collapse_note(math.nan if predicted is None else predicted, every)
    return (f"{collapsed + ': ' if collapsed else ''}accuracy {accuracy:.4f}  balanced accuracy {balanced:.4f}  "
            f"macro AUC {auc:.4f}{smallest}")


def _aggregation_lines(config: RunConfig, summary: dict[str, Any]) -> list[str]:
    """The client-level eps and what it covers (client-dp), and what secure aggregation hid."""
    lines = []
    level = summary["client_level"]
    if level is not None and level["rounds"]:
        eps = "inf (a round without noise)" if level["epsilon"] is None else f"{level['epsilon']:.4f}"
        lines.append(f"client-level eps {eps} (delta={level['delta']:g}, q<={level['sample_rate']:.4g}, "
                     f"{level['rounds']:g} rounds) covers {level['covers']}")
    if config.secagg.mode != "none":
        lines.append(f"secure aggregation {config.secagg.mode}: the server saw sums of updates, not one")
    return lines
