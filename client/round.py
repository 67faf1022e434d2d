"""One client's training round (Algorithm 1 on its own shard), written once for every caller.

The ClientApp (client/client_app.py) and the plain FedAvg loop of the benchmarks (sims/fedavg_loop.py)
both call `train_round`: restore or calibrate the client's mechanism, refuse a round that would
take it past its budget, train from the global weights, and say whether it can afford another round.
The caller keeps `outcome.mechanism.state_dict()` between rounds and turns the outcome into its reply.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from client.class_balance import class_weights
from client.durable.lifetime_ledger import LifetimeLedger
from client.logit_adjustment import logit_offsets
from client.rate_and_randomness import client_generator, client_learning_rate
from client.training import PoissonBatches, private_trainer
from dirichlet_fl.client_plan import mechanism_spec
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import SYNTHETIC
from dirichlet_fl.data.augmentation import augmentation
from dirichlet_fl.data.image_data import ImageData
from dirichlet_fl.data.loaders import dataset_num_classes
from dirichlet_fl.data.split import (
    ClientShard,
    cached_client_shard,
    client_shard,
    federated_split,
    site_shard,
    synthetic_client,
)
from dirichlet_fl.device import resolve_device
from dirichlet_fl.metrics import evaluate_model
from dirichlet_fl.models.run_model import build_run_model
from dirichlet_fl.protocol import (
    BUDGET_EXHAUSTED,
    CLASS_HITS,
    CLASS_TOTALS,
    SETUP_FAILED,
    TRAINING_FAILED,
    Metrics,
    UnreadableFile,
    error_reason,
    one_line,
    reading,
)
from privacy.accounting.lifetime import LifetimeBudgetSpent, calibrate_within_lifetime
from privacy.csprng import SecureRandom
from privacy.mechanisms import Mechanism
from privacy.registry import build_mechanism, restore_mechanism

WEIGHT_ROUNDING = 10
"""Example counts are sent rounded to a multiple of this (at least this): the coordinator needs a
weight for FedAvg, not the site's exact count, which add/remove-one neighbouring does not protect."""


@dataclass(frozen=True)
class Client:
    """Who is training: its partition of the split (or its own data file) and its budget."""

    partition_id: int
    num_partitions: int
    target_epsilon: float
    data_file: str = ""
    cache_dir: str = ""
    """Where the node caches its partition's shard between processes (dirichlet_fl.data.split.cached_client_shard)."""
    shard: ClientShard | None = field(default=None, compare=False, repr=False)
    """Data handed over in memory instead of the partition's (the plain loop's reference runs of an audit)."""


@dataclass
class NodeResources:
    """What a node adds to the run config (client/site.py); the defaults are a simulated client's.

    `secret` keys the node's privacy randomness (None: reproducible from the run's seed), `lifetime_ledger`
    is its lifetime ledger, which this round checks and calibrates against (the caller writes it, through
    `write_ahead` and after the round), `run_key` names this run in it, `aggregation_weight` replaces
    the example count the server would otherwise receive."""

    secret: bytes | None = None
    lifetime_ledger: LifetimeLedger | None = None
    run_key: str = ""
    aggregation_weight: float | None = None
    count_rounding: int = 1
    """A site's `count-rounding`: it samples, accounts and reports as if it held its example count rounded down
    to a multiple of this (`counted_examples`), so that nothing it sends reveals the exact count; 1: exact."""
    secure_rng: bool = False
    """The node draws its privacy randomness from the OS's CSPRNG whatever the run config says (a site)."""


class Refusal(Exception):
    """A request answered with an Error reply instead of a result: its error code (dirichlet_fl.protocol), its
    reason (one line, then the ledger summary when there is one: error_reason) and what a site sends the
    coordinator instead when the reason may quote a file's contents or an unforeseen error's text (empty:
    the reason itself). Raised where the failure is met, turned into the reply in one place."""

    def __init__(self, code: int, reason: str, public: str = "") -> None:
        super().__init__(reason)
        self.code, self.reason, self.public = code, reason, public


@dataclass
class RoundOutcome:
    """A round's result: the updated weights and metrics, or an error code (dirichlet_fl.protocol)
    with its reason (one line, then the ledger summary: dirichlet_fl.protocol.error_reason).
    `mechanism` holds the client's ledger whenever it exists, error or not."""

    mechanism: Mechanism | None
    weights: dict[str, Tensor] | None = None
    metrics: Metrics = field(default_factory=dict)
    error_code: int | None = None
    reason: str = ""
    public: str = ""
    """What a site sends the coordinator instead of `reason` when the reason may quote a file's contents or
    an unforeseen error's text (empty: `reason` itself); the site's own log has `reason`."""


def client_data(config: RunConfig, client: Client) -> tuple[ClientShard, ImageData]:
    """The client's shard on the run's device, and the data it comes from (for the model's shape): its
    own data file, or its partition of the run's split (from the node's cache when it has one). Any
    failure is an UnreadableFile: its text may quote the files read."""
    with reading("its data"):
        return _client_data(config, client)


def _client_data(config: RunConfig, client: Client) -> tuple[ClientShard, ImageData]:
    device = resolve_device(config.device)
    if client.shard is not None:
        return client.shard, federated_split(config.split_spec(client.num_partitions)).data
    if client.data_file:
        return site_shard(client.data_file, dataset_num_classes(config.data.dataset), device)
    spec = config.split_spec(client.num_partitions)
    if spec.dataset == SYNTHETIC:  # generated from (seed, client id): nothing to cache, no split to build
        return client_shard(spec, client.partition_id, device), synthetic_client(spec, client.partition_id)
    if client.cache_dir:
        return cached_client_shard(spec, client.partition_id, device, Path(client.cache_dir))
    return client_shard(spec, client.partition_id, device), federated_split(spec).data


def shard_of(config: RunConfig, client: Client) -> ClientShard:
    """The client's shard (client_data without the data's shape)."""
    return client_data(config, client)[0]


def load_weights(model: nn.Module, weights: dict[str, Tensor], config: RunConfig, client: Client) -> None:
    """Load the global weights; a site file whose images do not fit the run's model is named."""
    try:
        model.load_state_dict(weights)
    except RuntimeError:
        if not client.data_file:
            raise
        raise ValueError(
            f"data-file {client.data_file}: its images do not fit the run's model (dataset={config.data.dataset}, "
            f"model={config.network.name}): export the site's data at the run's image size and channels"
        ) from None


def _mechanism(
    config: RunConfig, client: Client, saved: dict[str, Any] | None, num_examples: int, node: NodeResources
) -> Mechanism:
    """The client's mechanism: restored with its ledger, or calibrated once for the whole run (and, with
    a lifetime ledger, for what the site's lifetime budget still allows)."""
    if saved is not None:
        return restore_mechanism(saved)
    spec = mechanism_spec(config, client.partition_id, num_examples, client.target_epsilon)
    lifetime = node.lifetime_ledger
    if lifetime is None or lifetime.lifetime is None:
        return build_mechanism(spec)
    return calibrate_within_lifetime(spec, lifetime.prior(node.run_key), lifetime.lifetime, lifetime.delta)


def accountant_summary(config: RunConfig, client: Client, mechanism: Mechanism) -> Metrics:
    """What the client has spent, with what it covers: eps at the run's delta, steps, q, target, noise.
    q is rounded to 2 significant digits: with the steps it depends on, the exact q would tell the
    coordinator the site's example count (docs/consortium.md, "What the coordinator sees")."""
    return {
        "epsilon": mechanism.epsilon(config.privacy.delta),
        "target-epsilon": client.target_epsilon,
        "delta": config.privacy.delta,
        "steps": mechanism.steps,
        "sample-rate": float(f"{mechanism.sample_rate:.2g}"),
        **mechanism.parameters(),
    }


def counted_examples(num_examples: int, node: NodeResources, label: str) -> int:
    """The example count a client's mechanism is built from: the exact one, or at a site its count rounded
    down to a multiple of its count-rounding. Sampling each example with q = batch-size / that count (a
    little above batch-size / n) is accounted exactly, and q, the steps (local-epochs / q), r, eps and the
    weight then follow from the rounded count alone. ValueError when the site holds fewer than count-rounding."""
    rounding = node.count_rounding
    if rounding <= 1:
        return num_examples
    if num_examples < rounding:
        raise ValueError(f"{label} has {num_examples} examples, fewer than its count-rounding={rounding} "
                         "(node config): it reports no count finer than that, so it does not train")
    return num_examples // rounding * rounding


def reported_weight(num_examples: int, node: NodeResources) -> float:
    """What the server weights this client's update by: the site's own aggregation-weight, else at a site its
    count rounded down to its count-rounding (the count it trains as), else its example count rounded to
    a multiple of WEIGHT_ROUNDING (the exact count is not sent)."""
    if node.aggregation_weight is not None:
        return node.aggregation_weight
    rounding = node.count_rounding
    if rounding > 1:
        return float(max(rounding, num_examples // rounding * rounding))
    return float(max(WEIGHT_ROUNDING, WEIGHT_ROUNDING * round(num_examples / WEIGHT_ROUNDING)))


def train_round(
    config: RunConfig,
    client: Client,
    saved: dict[str, Any] | None,
    weights: dict[str, Tensor],
    server_round: int,
    write_ahead: Callable[[dict[str, Any], dict[str, Any]], Callable[[int], None] | None] | None = None,
    node: NodeResources | None = None,
) -> RoundOutcome:
    """One round of local training from the global `weights`; never raises for a client-side failure.

    `write_ahead(done, planned)`, if given, durably stores the ledger with the whole round's steps already
    composed before the first step runs (`done`: the state before the round) and returns what records the
    round's progress (called with the steps composed so far, before each step); if it fails, the round is
    not trained. With a lifetime
    ledger (`node.lifetime_ledger`), a new run is calibrated for what the site's lifetime budget still allows,
    and a round that would take the site past it is refused. Each step raises a Refusal where it fails; it
    becomes the error outcome here, with the mechanism once it exists (its ledger must survive)."""
    node = node or NodeResources()
    setup: _Setup | None = None
    try:
        setup = _set_up(config, client, saved, node)
        plan = _admitted(config, client, setup.mechanism, node)
        model, learning_rate, mean_loss = _trained(config, client, node, setup, plan, weights, server_round,
                                                   write_ahead)
    except Refusal as refusal:
        mechanism = None if setup is None else setup.mechanism
        return RoundOutcome(mechanism, error_code=refusal.code, reason=refusal.reason, public=refusal.public)
    mechanism = setup.mechanism
    metrics: Metrics = {
        "num-examples": reported_weight(setup.shard.num_examples, node),
        "partition-id": client.partition_id,
        **accountant_summary(config, client, mechanism),
        "learning-rate": learning_rate,
        "can-continue": int(not mechanism.would_exceed(plan.steps, client.target_epsilon)),
        "node-secret": int(node.secret is not None),
        "secure-rng": int(config.randomness.secure_rng or node.secure_rng),
    }
    if mechanism.reports_training_loss:  # DP-SGD's loss is of the un-noised batch: its eps does not cover it
        metrics["train-loss"] = mean_loss if math.isfinite(mean_loss) else 0.0
    return RoundOutcome(mechanism, weights=model.state_dict(), metrics=metrics)


def _label(client: Client) -> str:
    return f"client {client.partition_id}"


@dataclass(frozen=True)
class _Setup:
    """The client's shard, the data it comes from (for the model's shape) and its mechanism with its ledger."""

    shard: ClientShard
    data: ImageData
    mechanism: Mechanism


def _set_up(config: RunConfig, client: Client, saved: dict[str, Any] | None, node: NodeResources) -> _Setup:
    """The client's data and mechanism. Refusal: BUDGET_EXHAUSTED when the site's lifetime budget leaves a new
    run nothing, SETUP_FAILED for data that cannot be read (its public form quotes no file) or a bad config."""
    label = _label(client)
    try:
        shard, data = client_data(config, client)
        mechanism = _mechanism(config, client, saved, counted_examples(shard.num_examples, node, label), node)
    except LifetimeBudgetSpent as error:
        raise Refusal(BUDGET_EXHAUSTED, error_reason(f"{label}: {error}", None)) from None
    except UnreadableFile as error:
        raise Refusal(SETUP_FAILED, error_reason(f"{label}: {error}", None),
                      error_reason(f"{label}: {error.public}", None)) from None
    except ValueError as error:
        raise Refusal(SETUP_FAILED, error_reason(f"{label}: {error}", None)) from None
    return _Setup(shard, data, mechanism)


@dataclass(frozen=True)
class _Plan:
    """A round the client can afford: its steps, its ledger with them composed (what is written ahead), the
    nonce of its randomness (the steps composed before it, the site's other runs' included) and the
    accountant summary before it."""

    steps: int
    planned: dict[str, Any]
    nonce: int
    summary: Metrics


def _admitted(config: RunConfig, client: Client, mechanism: Mechanism, node: NodeResources) -> _Plan:
    """The round's plan. Refusal BUDGET_EXHAUSTED when its steps would take the client past its target eps, or
    (with a lifetime ledger) the site past its lifetime budget."""
    label = _label(client)
    steps = config.local.steps_per_round(mechanism.sample_rate)
    summary = accountant_summary(config, client, mechanism)
    if mechanism.would_exceed(steps, client.target_epsilon):
        spent = mechanism.epsilon(config.privacy.delta)
        text = f"{label}: budget spent (eps {spent:.4f} of {client.target_epsilon:g} at delta={config.privacy.delta:g})"
        raise Refusal(BUDGET_EXHAUSTED, error_reason(text, summary))
    planned, lifetime, nonce = mechanism.after(steps).state_dict(), node.lifetime_ledger, mechanism.steps
    if lifetime is not None:
        if not lifetime.allows(node.run_key, planned):
            text = (
                f"{label}: lifetime budget spent (eps {lifetime.spent():.4f} of lifetime-epsilon={lifetime.lifetime:g} "
                f"at delta={lifetime.delta:g}; {steps} more steps do not fit)"
            )
            raise Refusal(BUDGET_EXHAUSTED, error_reason(text, summary))
        nonce += sum(restore_mechanism(state).steps for state in lifetime.prior(node.run_key))
    return _Plan(steps, planned, nonce, summary)


def _trained(
    config: RunConfig,
    client: Client,
    node: NodeResources,
    setup: _Setup,
    plan: _Plan,
    weights: dict[str, Tensor],
    server_round: int,
    write_ahead: Callable[[dict[str, Any], dict[str, Any]], Callable[[int], None] | None] | None,
) -> tuple[nn.Module, float, float]:
    """The plan written ahead, then the round trained from `weights`: the model, its learning rate and the mean
    loss. Refusal: BUDGET_EXHAUSTED when the write-ahead's locked re-check finds another run at the site
    trained meanwhile, TRAINING_FAILED for any other failure (the ledger survives: every step was composed
    before it ran; the site sends the error's type, not its text)."""
    label, mechanism, shard = _label(client), setup.mechanism, setup.shard
    try:
        progress = None if write_ahead is None else write_ahead(mechanism.state_dict(), plan.planned)
        model = build_run_model(config, setup.data).to(shard.train_x.device)
        load_weights(model, weights, config, client)
        learning_rate = client_learning_rate(config, mechanism, model, shard, server_round)
        trainer = private_trainer(mechanism, model, config.training.optimizer, learning_rate,
                                  proximal_mu=config.strategy.client_proximal_mu)
        generator = client_generator(
            config, client.partition_id, server_round, shard.train_x.device, node.secret, plan.nonce
        )
        privacy_rng = SecureRandom() if config.randomness.secure_rng or node.secure_rng else None
        per_class = class_weights(config.local, shard.train_y, setup.data.num_classes)
        offsets = logit_offsets(config.local, shard.train_y, setup.data.num_classes)
        batches = PoissonBatches(shard.train_x, shard.train_y, generator, augmentation(config), privacy_rng, per_class,
                                 offsets)
        return model, learning_rate, trainer.train(batches, plan.steps, on_step=progress)
    except LifetimeBudgetSpent as error:
        raise Refusal(BUDGET_EXHAUSTED, error_reason(f"{label}: {error}", plan.summary)) from None
    except Exception as error:
        text = f"{label}: training failed: {one_line(error)}"
        ran = accountant_summary(config, client, mechanism)
        public = f"{label}: training failed ({type(error).__name__}); the site's own log has the details"
        raise Refusal(TRAINING_FAILED, error_reason(text, ran), error_reason(public, ran)) from None


def evaluate_round(
    config: RunConfig, client: Client, weights: dict[str, Tensor], node: NodeResources | None = None
) -> Metrics:
    """Loss and accuracy of the global `weights` on the client's local test share (weighted like training;
    an empty share, whose loss and accuracy are nan, weighs 0), and its per-class hits and totals, which
    the server sums (strategies/federated_evaluation.py)."""
    shard, data = client_data(config, client)
    model = build_run_model(config, data).to(shard.test_x.device)
    load_weights(model, weights, config, client)
    result = evaluate_model(model, shard.test_x, shard.test_y)
    count = int(shard.test_y.shape[0])
    weight = reported_weight(count, node or NodeResources()) if count else 0.0
    return {"num-examples": weight, "eval-loss": result.loss, "eval-accuracy": result.accuracy,
            CLASS_HITS: list(result.counts.hits), CLASS_TOTALS: list(result.counts.totals)}

