"""The run folder, written by the server as a run goes (dirichlet_fl.runs.reader reads it back).

results-dir/<run>/ holds config.json (the resolved run config and the number of clients),
rounds.csv (one row per round: central and federated metrics, per-class recalls included, clients,
eps), ledger.csv (one row per client event: trained, refused or failed in a
round, and, every round, clients whose budget is spent or whose setup failed; at round 0 one `skipped`
row per client too small to train; a client that was merely not sampled gets no row, so 10,000 clients
sampled 10 at a time write about 10 rows a round, not 10,000), model.pt (the global
weights of the last complete round), checkpoint.pt (everything a resumed run needs: the round, the
weights, the strategy's state and every client's standing), ledgers/ (each simulated client's run
state file, client/durable/run_state_file.py), curves.png (accuracy, loss and every
client's eps against its target, redrawn after a round at most every plots.CURVES_EVERY_S seconds and when the
run finishes; dirichlet_fl.runs.plots) and summary.json
(written at the end, with the run's `status`: completed, stopped-no-client-can-train or failed; above
CLIENTS_IN_SUMMARY clients its per-client list goes to clients.csv instead, one row per client that was
ever sampled or skipped). The writer holds a standing only for clients that were sampled or skipped (a
100,000-client run that trains 10 a round holds tens), never one per client of the population.
After every round the weights are written first, then the rows, then the checkpoint, each atomically
(dirichlet_fl.files), so a run killed at any point leaves a consistent record of every round it
completed, and a resumed run (RunWriter.resume) cuts any rows past its checkpoint and appends from there.

With keep-updates=true it also keeps what the coordinator sees in every round, for the update-view
audit (`dirichlet-fl audit RUN_DIR --view updates`): updates/round-NNNN.npz holds `global`, the weights
the server sent, and `client-<id>`, each trainer's returned weights minus those sent, every one flattened
in state_dict order to float32 and compressed (about 4 bytes per parameter per trainer and round).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from dirichlet_fl.config import RunConfig
from dirichlet_fl.files import append_atomically, write_atomically
from dirichlet_fl.metrics import (
    PREDICTED_CLASSES,
    dead_class_streaks,
    dead_of,
    is_collapsed,
    lasting,
    recall_key,
    recalls_of,
)
from dirichlet_fl.protocol import NOISE_FROM_SECRET, NOISE_FROM_SEED, NOISE_SECURE
from dirichlet_fl.runs.plots import RunCurvesFile
from dirichlet_fl.runs.reader import (
    CHECKPOINT,
    UPDATES_DIR,
    check_resumable,
    json_number,
    read_checkpoint,
    read_json,
    read_rows,
)
from privacy.accounting.client_level import COVERS as CLIENT_LEVEL_COVERS
from privacy.registry import does_not_cover

ROUND_COLUMNS = [
    "round", "central_accuracy", "central_loss", "federated_accuracy", "federated_loss", "train_loss",
    "trained", "refused", "failed", "max_epsilon", "seconds",
    "client_level_epsilon", "client_level_delta", "client_level_sample_rate", "client_level_rounds",
    "client_level_clipping_norm", "client_level_unclipped_fraction",
    "central_balanced_accuracy", "central_macro_auc", "central_min_class_recall",
    "federated_balanced_accuracy", "federated_min_class_recall", "central_predicted_classes",
]
"""rounds.csv's columns before the per-class ones (round_columns adds central_recall_<c> and
federated_recall_<c> for each class c). There is no federated macro AUC: AUC does not decompose into
what the clients could sum (dirichlet_fl.metrics)."""
CENTRAL_KEYS = ("accuracy", "loss", "balanced_accuracy", "macro_auc", "min_class_recall", "predicted_classes")
FEDERATED_KEYS = ("accuracy", "loss", "balanced_accuracy", "min_class_recall")
"""RoundRecord.central's and .federated's keys written as central_<key> / federated_<key> (nan if absent)."""
CLIENT_LEVEL_KEYS = ("epsilon", "delta", "sample_rate", "rounds", "clipping_norm", "unclipped_fraction")
"""RoundRecord.client_level's keys, written as client_level_<key> (nan without client-dp): the eps so far
and what it is at, the round's clipping norm C and (client-dp = "adaptive") the noised fraction of
updates that C left unclipped, which sets the next round's C."""
LEDGER_COLUMNS = [
    "round", "client", "status", "epsilon", "delta", "steps", "target_epsilon", "sample_rate", "noise_parameter",
    "learning_rate",
    "reason",
]


CLIENTS_IN_SUMMARY = 1000
"""Up to this many clients summary.json lists every client; above, clients.csv lists those with a standing."""
CLIENTS_FILE = "clients.csv"
CLIENT_COLUMNS = ["id", "target_epsilon", "epsilon", "delta", "steps", "sample_rate", "learning_rate", "r",
                  "noise_multiplier", "refused_rounds", "failed_rounds", "client_level_epsilon"]
"""clients.csv's columns: summary.json's per-client fields (r or noise_multiplier empty when not the mechanism's)."""

COMPLETED = "completed"
"""Every round ran, or every client that can train has spent its budget."""
STOPPED_NO_CLIENT = "stopped-no-client-can-train"
"""No client was left to train, or none trained for max-idle-rounds consecutive rounds."""
FAILED = "failed"
"""The server stopped on an error (summary.json's `status_reason` says which)."""


@dataclass
class RoundRecord:
    """What happened in one round: who trained (with its metrics), who refused, who failed (with the
    reason, one line), the ledger summaries refusing and failing clients reported, and which clients
    were not asked because their budget is spent or their setup failed."""

    server_round: int
    trained: dict[int, dict[str, float]] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    reported: dict[int, dict[str, float]] = field(default_factory=dict)
    spent: set[int] = field(default_factory=set)
    excluded: set[int] = field(default_factory=set)
    central: dict[str, float] = field(default_factory=dict)
    """The server's evaluation of the round's model: dirichlet_fl.metrics.Evaluation.metrics()."""
    federated: dict[str, float] = field(default_factory=dict)
    """The clients' evaluation: loss and accuracy (weighted means) and the count metrics of their summed
    per-class counts (strategies/federated_evaluation.py)."""
    sent: ArrayRecord | None = None
    """The global weights sent for training; with `returned`, kept only when the run keeps updates."""
    returned: dict[int, ArrayRecord] = field(default_factory=dict)
    client_level: dict[str, float] = field(default_factory=dict)
    """Client-level DP of the aggregate (privacy/accounting/client_level.py): epsilon, delta, sample_rate, rounds."""

    @property
    def max_epsilon(self) -> float:
        return max((m["epsilon"] for m in self.trained.values()), default=math.nan)

    @property
    def train_loss(self) -> float:
        """Mean local training loss of the trainers that report one (DP-SGD clients do not), weighted by
        their reported weights; nan when the clients withheld their weights (secure-aggregation:
        dirichlet_fl.protocol.WITHHELD_METRICS)."""
        if any("num-examples" not in m for m in self.trained.values()):
            return math.nan
        reporting = [m for m in self.trained.values() if "train-loss" in m]
        total = sum(m["num-examples"] for m in reporting)
        if not total:
            return math.nan
        return sum(m["train-loss"] * m["num-examples"] for m in reporting) / total

    @property
    def noise(self) -> set[str]:
        """How the trainers keyed their privacy randomness (dirichlet_fl.protocol's labels)."""
        return {_noise_label(m) for m in self.trained.values()}


@dataclass
class ClientStanding:
    """The server's standing of one client: its latest known privacy position, refusals and failures
    (checkpointed under `clients`; each change is a row of ledger.csv)."""

    target_epsilon: float
    epsilon: float = 0.0
    steps: int = 0
    sample_rate: float = math.nan
    noise: dict[str, float] = field(default_factory=dict)
    learning_rate: float = math.nan
    """The SGD rate of its last trained round (client.rate_and_randomness.client_learning_rate)."""
    refused_rounds: int = 0
    failed_rounds: int = 0

    def absorb(self, values: dict[str, float]) -> None:
        """Take a client's reported position (training metrics or an error's ledger summary)."""
        self.epsilon, self.steps = values["epsilon"], int(values["steps"])
        self.target_epsilon, self.sample_rate = values["target-epsilon"], values["sample-rate"]
        self.noise = {k: values[k] for k in ("r", "noise_multiplier") if k in values}
        self.learning_rate = values.get("learning-rate", self.learning_rate)  # errors report no rate


def _noise_label(metrics: dict[str, Any]) -> str:
    """Where one trainer's privacy randomness came from: its CSPRNG, its node secret, or the run's seed."""
    if metrics.get("secure-rng"):
        return NOISE_SECURE
    return NOISE_FROM_SECRET if metrics.get("node-secret") else NOISE_FROM_SEED


def _write_json(path: Path, payload: object) -> None:
    write_atomically(path, (json.dumps(payload, indent=2, allow_nan=False) + "\n").encode())


def round_columns(num_classes: int) -> list[str]:
    """rounds.csv's header: ROUND_COLUMNS, then every class's central recall, then its federated one."""
    return ROUND_COLUMNS + [f"{side}_{recall_key(c)}" for side in ("central", "federated") for c in range(num_classes)]


def _number(value: Any) -> float:
    """A rounds.csv cell read back as a float; nan for an empty one (a column an older run lacks)."""
    return float(value) if value not in ("", None) else math.nan


def _csv_text(columns: list[str], rows: list[dict[str, Any]], header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


class RunWriter:
    """Writes a run's folder as the run goes (create() for a new run, resume() to continue one)."""

    def __init__(self, directory: Path, config: RunConfig, num_clients: int, covers: str, num_classes: int = 0) -> None:
        self.directory = directory
        self.config = config
        self.covers = covers
        self.num_classes = num_classes
        """How many per-class recall columns rounds.csv has (0: none)."""
        self.columns = round_columns(num_classes)
        self.dead_streaks: dict[int, int] = {}
        """Class -> consecutive rounds up to the last one in which its central recall was 0."""
        self.num_clients = num_clients
        self.clients: dict[int, ClientStanding] = {}
        """The standing of every client that was sampled or skipped (see standing())."""
        self.rounds: list[dict[str, Any]] = []
        self.noise: set[str] = set()
        self.client_level: dict[str, float] = {}
        self.started = time.monotonic()
        self.curves = RunCurvesFile(directory)

    @classmethod
    def create(cls, config: RunConfig, num_clients: int, covers: str, num_classes: int = 0) -> RunWriter:
        """A new folder under results-dir named by run-name, or by time, data set, mechanism and eps;
        rounds.csv gets a recall column per class of `num_classes`."""
        name = config.output.run_name or (
            f"{time.strftime('%Y%m%d-%H%M%S')}-{config.data.dataset}-{config.privacy.mechanism}-eps{config.privacy.target_epsilon:g}"
        )
        directory = Path(config.output.results_dir) / name
        suffix = 1
        while directory.exists():
            suffix += 1
            directory = Path(config.output.results_dir) / f"{name}-{suffix}"
        writer = cls(directory, config, num_clients, covers, num_classes)
        directory.mkdir(parents=True, exist_ok=False)
        _write_json(directory / "config.json", {"run_config": config.resolved_run_config(), "num_clients": num_clients})
        write_atomically(directory / "rounds.csv", _csv_text(writer.columns, [], header=True).encode())
        write_atomically(directory / "ledger.csv", _csv_text(LEDGER_COLUMNS, [], header=True).encode())
        return writer

    @classmethod
    def resume(
        cls, config: RunConfig, num_clients: int, covers: str, num_classes: int = 0
    ) -> tuple[RunWriter, dict[str, Any]]:
        """Continue the run in config.output.resume_from from its last checkpoint: refuse a config that changes
        the accounting (ValueError naming the key), cut rows past the checkpoint, restore every client's
        ledger and, from the rows kept, the dead-class streaks. Returns the writer and the checkpoint
        (round, weights, strategy state)."""
        directory = Path(config.output.resume_from)
        checkpoint = read_checkpoint(directory)
        stored = read_json(directory / "config.json")
        check_resumable(RunConfig.from_run_config(stored["run_config"]), config)
        if int(stored["num_clients"]) != num_clients:
            raise ValueError(
                f"resume-from={config.output.resume_from!r}: the run had {stored['num_clients']} clients but this "
                "federation "
                f"has {num_clients}; resume it with the same number of clients"
            )
        writer = cls(directory, config, num_clients, covers, num_classes)
        writer.clients = {int(c): ClientStanding(**standing) for c, standing in checkpoint["clients"].items()}
        writer.started -= float(checkpoint["seconds"])
        writer.noise = set(checkpoint.get("noise", []))
        last = int(checkpoint["round"])
        writer.rounds = [row for row in read_rows(directory / "rounds.csv") if int(row["round"]) <= last]
        ledger_rows = [row for row in read_rows(directory / "ledger.csv") if int(row["round"]) <= last]
        write_atomically(directory / "rounds.csv", _csv_text(writer.columns, writer.rounds, header=True).encode())
        for row in writer.rounds:
            writer._watch_dead([_number(row.get(f"central_{recall_key(c)}")) for c in range(num_classes)])
        write_atomically(directory / "ledger.csv", _csv_text(LEDGER_COLUMNS, ledger_rows, header=True).encode())
        writer.save_weights_dict(checkpoint["weights"])
        return writer, checkpoint

    def record_round(self, record: RoundRecord, arrays: ArrayRecord, strategy_state: dict[str, Any]) -> dict[str, Any]:
        """Save the global weights (and, with keep-updates, the round's updates), append the round to
        rounds.csv and ledger.csv, then checkpoint (files first: the rows never run ahead of model.pt; the
        checkpoint never ahead of the rows)."""
        if self.config.output.keep_updates and record.sent is not None and record.returned:
            save_round_updates(self.directory, record.server_round, record.sent, record.returned)
        weights = arrays.to_torch_state_dict()
        self.save_weights_dict(weights)
        central = recalls_of(record.central, self.num_classes)
        row = {
            "round": record.server_round,
            **{f"central_{key}": record.central.get(key, math.nan) for key in CENTRAL_KEYS},
            **{f"federated_{key}": record.federated.get(key, math.nan) for key in FEDERATED_KEYS},
            **{f"central_{recall_key(c)}": recall for c, recall in enumerate(central)},
            **{f"federated_{recall_key(c)}": recall
               for c, recall in enumerate(recalls_of(record.federated, self.num_classes))},
            "train_loss": record.train_loss,
            "trained": len(record.trained),
            "refused": len(record.refused),
            "failed": len(record.failed),
            "max_epsilon": record.max_epsilon,
            "seconds": round(time.monotonic() - self.started, 3),
            **{f"client_level_{key}": record.client_level.get(key, math.nan) for key in CLIENT_LEVEL_KEYS},
        }
        self.client_level = record.client_level or self.client_level
        changed = self._update_standings(record)
        ledger_rows = [{"round": record.server_round, "client": c, **entry} for c, entry in changed.items()]
        append_atomically(self.directory / "rounds.csv", _csv_text(self.columns, [row]))
        append_atomically(self.directory / "ledger.csv", _csv_text(LEDGER_COLUMNS, ledger_rows))
        self.rounds.append(row)
        self._watch_dead(central)
        self.noise |= record.noise
        checkpoint = {
            "round": record.server_round,
            "weights": weights,
            "strategy": strategy_state,
            "clients": {str(c): asdict(standing) for c, standing in self.clients.items()},
            "seconds": row["seconds"],
            "noise": sorted(self.noise),
        }
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_atomically(self.directory / CHECKPOINT, buffer.getvalue())
        self.curves.round_written()
        return row

    def _watch_dead(self, central_recalls: list[float]) -> None:
        """Continue the dead-class streaks with one more round's central recalls (rounds run in order)."""
        self.dead_streaks = dead_class_streaks(dead_of(central_recalls), self.dead_streaks)

    def dead_classes(self) -> dict[int, tuple[int, int]]:
        """The classes whose central recall has been 0 for at least dead-class-rounds consecutive rounds
        up to the last one: class -> (first round of the streak, its length)."""
        last = int(self.rounds[-1]["round"]) if self.rounds else 0
        return lasting(self.dead_streaks, self.config.output.dead_class_rounds, last)

    def standing(self, client: int) -> ClientStanding:
        """The client's standing; a client never heard of gets its own, at its target, on first use."""
        if client not in self.clients:
            self.clients[client] = ClientStanding(self.config.privacy.target_epsilon_for(client, self.num_clients))
        return self.clients[client]

    def _update_standings(self, record: RoundRecord) -> dict[int, dict[str, Any]]:
        rows = {}
        named = set(record.trained) | set(record.refused) | set(record.failed) | record.spent | record.excluded
        for client in sorted(named):
            standing, status, reason = self.standing(client), "", ""
            if client in record.trained:
                status = "trained"
                standing.absorb(record.trained[client])
            elif client in record.refused or client in record.failed:
                refused = client in record.refused
                status, reason = ("refused", record.refused[client]) if refused else ("failed", record.failed[client])
                if client in record.reported:
                    standing.absorb(record.reported[client])
                elif not refused:
                    reason += " (the client reported no ledger: eps is the last it reported)"
                standing.refused_rounds += refused
                standing.failed_rounds += not refused
            elif client in record.spent:
                status = "spent"
                reason = (f"budget spent: eps {standing.epsilon:.4f} of {standing.target_epsilon:g} "
                          f"at delta={self.config.privacy.delta:g}")
                standing.refused_rounds += 1
            else:
                status, reason = "excluded", "its setup failed (see its failed row); not sampled again"
            rows[client] = {
                "status": status,
                "epsilon": standing.epsilon,
                "delta": self.config.privacy.delta,
                "steps": standing.steps,
                "target_epsilon": standing.target_epsilon,
                "sample_rate": standing.sample_rate,
                "noise_parameter": ";".join(f"{k}={v:.10g}" for k, v in standing.noise.items()),
                "learning_rate": standing.learning_rate,
                "reason": reason,
            }
        return rows

    def record_skipped(self, reasons: dict[int, str]) -> None:
        """Ledger rows (round 0, status `skipped`, with the reason) for clients that sit out the whole run."""
        rows = [{"round": 0, "client": client, "status": "skipped", "epsilon": 0.0, "delta": self.config.privacy.delta,
                 "steps": 0, "target_epsilon": self.standing(client).target_epsilon, "sample_rate": math.nan,
                 "noise_parameter": "", "reason": reason} for client, reason in sorted(reasons.items())]
        append_atomically(self.directory / "ledger.csv", _csv_text(LEDGER_COLUMNS, rows))

    def _client_level_summary(self) -> dict[str, Any] | None:
        """What the client-level eps covers and its parameters; None without client-dp."""
        if self.config.client_level.mode == "none":
            return None
        return {
            **{key: json_number(self.client_level.get(key, math.nan)) for key in CLIENT_LEVEL_KEYS},
            "noise_multiplier": self.config.client_level.noise_multiplier,
            "clipping": "adaptive" if self.config.client_level.mode == "adaptive" else "fixed",
            "initial_clipping_norm": self.config.client_level.clipping_norm,
            "covers": CLIENT_LEVEL_COVERS,
        }

    def save_weights(self, arrays: ArrayRecord) -> None:
        self.save_weights_dict(arrays.to_torch_state_dict())

    def save_weights_dict(self, weights: dict[str, torch.Tensor]) -> None:
        buffer = io.BytesIO()
        torch.save(weights, buffer)
        write_atomically(self.directory / "model.pt", buffer.getvalue())

    def finish(
        self, final: dict[str, float], assumptions_hold: bool, status: str = COMPLETED, reason: str = ""
    ) -> dict[str, Any]:
        """Write summary.json: the run's status, the final model's metrics (`final`: as RoundRecord.central;
        missing ones are null), rounds run, dead classes, whether it collapsed (final_collapse) and every
        client's privacy position (clients.csv above CLIENTS_IN_SUMMARY clients); then bring curves.png up to
        the last round."""
        summary: dict[str, Any] = {
            "status": status,
            "status_reason": reason,
            "final_accuracy": json_number(final.get("accuracy", math.nan)),
            "final_loss": json_number(final.get("loss", math.nan)),
            "final_balanced_accuracy": json_number(final.get("balanced_accuracy", math.nan)),
            "final_macro_auc": json_number(final.get("macro_auc", math.nan)),
            "final_per_class_recall": [json_number(recall) for recall in recalls_of(final, self.num_classes)],
            "dead_classes": {str(c): {"first_round": first, "rounds": length}
                             for c, (first, length) in self.dead_classes().items()},
            **final_collapse(final, self.num_classes),
            "rounds": len(self.rounds),
            "mechanism": self.config.privacy.mechanism,
            "delta": self.config.privacy.delta,
            "epsilon_covers": self.covers,
            "epsilon_does_not_cover": does_not_cover(self.config.privacy.mechanism),
            "noise": " and ".join(sorted(self.noise)) or "no client trained",
            "accountant_assumptions_hold": assumptions_hold,
            "max_epsilon": json_number(max((c.epsilon for c in self.clients.values()), default=0.0)),
            "secure_aggregation": self.config.secagg.mode,
            "client_dp": self.config.client_level.mode,
            "client_level": self._client_level_summary(),
            "seconds": round(time.monotonic() - self.started, 3),
            "num_clients": self.num_clients,
        }
        listed = range(self.num_clients) if self.num_clients <= CLIENTS_IN_SUMMARY else sorted(self.clients)
        entries = [self._client_entry(client, self.standing(client)) for client in listed]
        if self.num_clients <= CLIENTS_IN_SUMMARY:
            summary["clients"] = entries
        else:  # a readable summary at 100,000 clients: the list of those with a standing goes to clients.csv
            rows = [{key: "" if value is None else value for key, value in entry.items()} for entry in entries]
            write_atomically(self.directory / CLIENTS_FILE, _csv_text(CLIENT_COLUMNS, rows, header=True).encode())
            summary |= {"clients_file": CLIENTS_FILE, "clients_listed": len(entries),
                        "clients_not_listed": "never sampled: eps 0 of their target, no steps"}
        _write_json(self.directory / "summary.json", summary)
        self.curves.draw()
        return summary | {"clients": entries}

    def _client_entry(self, client: int, standing: ClientStanding) -> dict[str, Any]:
        """One client's final privacy position, as summary.json and clients.csv give it."""
        return {
            "id": client,
            "target_epsilon": standing.target_epsilon,
            "epsilon": json_number(standing.epsilon),
            "delta": self.config.privacy.delta,
            "steps": standing.steps,
            "sample_rate": json_number(standing.sample_rate),
            "learning_rate": json_number(standing.learning_rate),
            **{key.replace("-", "_"): value for key, value in standing.noise.items()},
            "refused_rounds": standing.refused_rounds,
            "failed_rounds": standing.failed_rounds,
            "client_level_epsilon": json_number(self.client_level.get("epsilon", math.nan)),
        }


def final_collapse(final: dict[str, float], num_classes: int) -> dict[str, Any]:
    """summary.json's two distinct facts about the final model (null when it was not evaluated):
    `collapsed`, it predicts one class only on the test set; `final_dead_classes`, how many classes present
    there it never predicts correctly (recall 0); and `predicted_classes`, how many distinct classes it predicts."""
    recalls = [recall for recall in recalls_of(final, num_classes) if not math.isnan(recall)]
    predicted = final.get(PREDICTED_CLASSES, math.nan)
    if not recalls or math.isnan(predicted):
        return {"collapsed": None, "final_dead_classes": None, "predicted_classes": None}
    return {"collapsed": is_collapsed(predicted, len(recalls)), "final_dead_classes": len(dead_of(recalls)),
            "predicted_classes": int(predicted)}


def flatten_state(state: dict[str, torch.Tensor]) -> np.ndarray:
    """Every tensor of a state_dict, in its order, flattened into one float32 vector."""
    return np.concatenate([tensor.detach().cpu().reshape(-1).float().numpy() for tensor in state.values()])


def save_round_updates(directory: Path, server_round: int, sent: ArrayRecord, returned: dict[int, ArrayRecord]) -> Path:
    """Write updates/round-NNNN.npz (atomically): the sent global weights and each client's update."""
    folder = directory / UPDATES_DIR
    folder.mkdir(exist_ok=True)
    base = flatten_state(sent.to_torch_state_dict())
    arrays: dict[str, Any] = {"global": base}
    for client, weights in sorted(returned.items()):
        arrays[f"client-{client}"] = flatten_state(weights.to_torch_state_dict()) - base
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    target = folder / f"round-{server_round:04d}.npz"
    write_atomically(target, buffer.getvalue())
    return target
