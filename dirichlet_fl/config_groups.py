"""RunConfig's sub-configs: each groups the run-config keys of one concern and validates them on its own.

Every field names its kebab-case key (`setting`); the keys stay flat in pyproject.toml's [tool.flwr.app.config],
in `flwr run . --run-config` and in config.json, and dirichlet_fl.config.RunConfig reads them into these groups.
Checks that span two groups (a mechanism that refuses BatchNorm, ...) are RunConfig.validate's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from dirichlet_fl.data.partition import PARTITIONERS
from dirichlet_fl.models.norms import MODELS, check_norm
from privacy.accounting.analysis import PAPER_DELTA
from privacy.accounting.client_level import AdaptiveClipping, update_noise_multiplier
from privacy.attenuation import S_Y_FOR_LEARNING_RATE
from privacy.checks import check_choice, check_in_interval, check_in_open_interval, check_integer, check_positive
from privacy.mechanisms import LOSS_WEIGHTINGS
from privacy.registry import MECHANISMS

OPTIMIZERS = ("sgd", "adam")
DEFAULT = "default"
"""optimizer = "default" (and learning-rate 0, learning-rate-warmup-rounds -1): the network's own (Recipe)."""
LEARNING_RATE_MODES = ("effective", "adaptive", "raw")
DIRICHLET_WEIGHTINGS = LOSS_WEIGHTINGS
"""dirichlet-weighting's values: normalized, each example's NLL times kappa(reference-confidence)/kappa(s_y),
capped (privacy/dirichlet.py); paper: Algorithm 1 as published."""
CLASS_WEIGHTINGS = ("none", "balanced")
"""class-weighting's values: none, every example weighs 1; balanced, each example of class k weighs n / (K n_k)
over the K classes its client holds, capped at class-weight-cap (client/class_balance.py)."""
MAX_LOGIT_ADJUSTMENT = 10.0
"""logit-adjustment's largest tau (the usual values are 0.5 to 2)."""
AUGMENT_CHOICES = ("auto", "on", "off")
SECURE_AGGREGATION = ("none", "secaggplus")
"""none: the server sees every update; secaggplus: Flower's SecAgg+, the server sees only the sum."""
CLIENT_DP = ("none", "central", "adaptive")
"""Client-level DP on the aggregate (DP-FedAvg): none, central (fixed clipping norm, Gaussian noise) or
adaptive (the clipping norm follows a quantile of the update norms)."""
COUNT_STDDEV_DIVISOR = 20
"""Adaptive clipping's default count noise: sigma_b = m / 20 for m sampled clients (Andrew et al. 2021)."""
MAX_DELTA = 0.1
"""delta must lie below this. A delta is meaningful only far below 1/n for n examples: a mechanism that
publishes each example with probability delta is (0, delta)-DP and still leaks delta * n of them; every
client holds more than batch-size >= 1 examples, and the pre-flight checks delta < 1/n per client."""
MAX_LOCAL_STEPS = 1_000_000
"""local-steps must be at most this: 18,000 times the default job's 54 steps a round, and half an hour
per client per round at the default model's 2 ms step (BENCHMARKS.md); a larger value is a typo."""
SYNTHETIC = "synthetic"
"""dataset = "synthetic": every client's examples generated from (seed, client id) (dirichlet_fl.data.synthetic)."""


def setting(key: str, default: Any) -> Any:
    """A config field bound to its run-config key (kebab-case, as in pyproject.toml)."""
    return field(default=default, metadata={"key": key})


@dataclass(frozen=True)
class DataConfig:
    """Which data set, where it lives, and how it is split among the clients."""

    dataset: str = setting("dataset", "digits")
    root: str = setting("data-root", "data")
    path: str = setting("data-path", "")
    download: bool = setting("data-download", False)
    validation_fraction: float = setting("validation-fraction", 0.0)
    partitioner: str = setting("partitioner", "dirichlet")
    beta: float = setting("beta", 0.5)
    classes_per_client: int = setting("classes-per-client", 2)
    site_file: str = setting("site-file", "")
    synthetic_alpha: float = setting("synthetic-alpha", 1.0)
    synthetic_beta: float = setting("synthetic-beta", 1.0)
    synthetic_examples: int = setting("synthetic-examples", 100)

    def validate(self) -> None:
        check_in_interval("validation-fraction", self.validation_fraction, 0.0, 0.5)
        self._validate_synthetic()
        if (self.dataset == "npz") != bool(self.path):
            raise ValueError(
                f"data-path={self.path!r} with dataset={self.dataset!r}: dataset='npz' needs data-path (an .npz in "
                "medmnist's layout) and data-path is read only with dataset='npz'; set both or neither"
            )
        check_choice("partitioner", self.partitioner, PARTITIONERS)
        check_positive("beta", self.beta)
        check_integer("classes-per-client", self.classes_per_client, 1)
        if self.partitioner == "natural" and not self.site_file:
            raise ValueError("partitioner='natural' needs site-file: a CSV with columns index,site")

    def _validate_synthetic(self) -> None:
        """The non-IID knobs of dataset = "synthetic" (model and feature heterogeneity) and its shard size."""
        for key, value in (("synthetic-alpha", self.synthetic_alpha), ("synthetic-beta", self.synthetic_beta)):
            if not 0 <= value <= 100:
                raise ValueError(f"{key}={value!r} is out of range: it must lie in [0, 100] (larger: clients differ "
                                 "more; 1: FedProx's Synthetic(1,1))")
        check_integer("synthetic-examples", self.synthetic_examples, 2)
        if self.synthetic_examples > 1_000_000:
            raise ValueError(f"synthetic-examples={self.synthetic_examples} is out of range: at most 1,000,000 "
                             "training examples per client")
        if self.dataset == SYNTHETIC and self.validation_fraction > 0:
            raise ValueError("validation-fraction applies to stored data sets, not dataset='synthetic' (its held-out "
                             "test clients are generated apart from every training client); set it to 0")


@dataclass(frozen=True)
class LearningRateConfig:
    """The optimizer and how each client sets its rate (client setup's client_learning_rate). optimizer
    "default", learning-rate 0 and learning-rate-warmup-rounds -1 mean the network's own (its Recipe in
    dirichlet_fl.models.recipes, chosen by measurement); RunConfig.training resolves them."""

    optimizer: str = setting("optimizer", DEFAULT)
    rate: float = setting("learning-rate", 0.0)
    mode: str = setting("learning-rate-mode", "effective")
    reference_confidence: float = setting("reference-confidence", S_Y_FOR_LEARNING_RATE)
    warmup_rounds: int = setting("learning-rate-warmup-rounds", -1)

    def validate(self) -> None:
        check_choice("optimizer", self.optimizer, (DEFAULT, *OPTIMIZERS))
        if not (self.rate >= 0 and math.isfinite(self.rate)):
            raise ValueError(f"learning-rate={self.rate!r} is out of range: give a rate > 0 in the optimizer's "
                             "units, or 0 for the network's own")
        check_choice("learning-rate-mode", self.mode, LEARNING_RATE_MODES)
        check_in_interval("reference-confidence", self.reference_confidence, 0.0, 1.0, open_low=True)
        check_integer("learning-rate-warmup-rounds", self.warmup_rounds, -1)



@dataclass(frozen=True)
class SecAggConfig:
    """Flower's SecAgg+ (secure-aggregation = "secaggplus"): shares, threshold and quantization."""

    mode: str = setting("secure-aggregation", "none")
    num_shares: float = setting("secagg-num-shares", 1.0)
    reconstruction_threshold: float = setting("secagg-reconstruction-threshold", 0.5)
    clipping_range: float = setting("secagg-clipping-range", 8.0)
    quantization_range: int = setting("secagg-quantization-range", 4194304)
    max_weight: float = setting("secagg-max-weight", 1000.0)

    def validate(self) -> None:
        check_choice("secure-aggregation", self.mode, SECURE_AGGREGATION)
        for key, value in (("secagg-num-shares", self.num_shares),
                           ("secagg-reconstruction-threshold", self.reconstruction_threshold)):
            check_positive(key, value)
            if value > 1 and (value != int(value) or value < 2):
                raise ValueError(f"{key}={value!r} is invalid: give a fraction in (0, 1] or a whole count >= 2")
        if 1 < self.num_shares <= 2:
            raise ValueError(f"secagg-num-shares={self.num_shares!r} is invalid: a count must be > 2")
        if 1 < self.num_shares <= self.reconstruction_threshold:
            raise ValueError(
                f"secagg-reconstruction-threshold={self.reconstruction_threshold!r} must be below "
                f"secagg-num-shares={self.num_shares!r}"
            )
        check_positive("secagg-clipping-range", self.clipping_range)
        check_integer("secagg-quantization-range", self.quantization_range, 2)
        if self.quantization_range >= 2**32:
            raise ValueError(f"secagg-quantization-range={self.quantization_range} is out of range: it must be below "
                             "2**32 (the masks' modulus)")
        check_positive("secagg-max-weight", self.max_weight)


@dataclass(frozen=True)
class ClientDpConfig:
    """The client-dp keys: client-level DP on the aggregate (privacy/accounting/client_level.py,
    strategies/client_dp.py)."""

    mode: str = setting("client-dp", "none")
    clipping_norm: float = setting("client-clipping-norm", 1.0)
    noise_multiplier: float = setting("client-noise-multiplier", 1.0)
    clip_target_quantile: float = setting("client-clip-target-quantile", 0.5)
    clip_learning_rate: float = setting("client-clip-learning-rate", 0.2)
    clipped_count_stddev: float = setting("client-clipped-count-stddev", 0.0)

    def validate(self) -> None:
        check_choice("client-dp", self.mode, CLIENT_DP)
        check_positive("client-clipping-norm", self.clipping_norm)
        if not self.noise_multiplier >= 0:
            raise ValueError(f"client-noise-multiplier={self.noise_multiplier!r} is out of range: it must be >= 0")
        check_in_open_interval("client-clip-target-quantile", self.clip_target_quantile, 0.0, 1.0)
        check_positive("client-clip-learning-rate", self.clip_learning_rate)
        if not self.clipped_count_stddev >= 0:
            raise ValueError(f"client-clipped-count-stddev={self.clipped_count_stddev!r} is out of range: it "
                             "must be >= 0 (0: the first round's number of sampled clients / 20)")
        if self.mode == "adaptive" and self.clipped_count_stddev > 0:
            update_noise_multiplier(self.noise_multiplier, self.clipped_count_stddev)

    def count_stddev(self, sample_size: int) -> float:
        """sigma_b of client-dp = "adaptive": client-clipped-count-stddev, or (0) the number of clients
        sampled in the first round / 20, Andrew et al.'s suggestion; fixed for the run."""
        return self.clipped_count_stddev or sample_size / COUNT_STDDEV_DIVISOR

    def adaptive_clipping(self, count_stddev: float) -> AdaptiveClipping:
        """client-dp = "adaptive"'s clipping with count noise sigma_b = `count_stddev` (see count_stddev),
        after checking that it leaves room for z (update_noise_multiplier refuses)."""
        update_noise_multiplier(self.noise_multiplier, count_stddev)
        return AdaptiveClipping(self.clipping_norm, self.clip_target_quantile, self.clip_learning_rate, count_stddev)


_ADAPTIVE = {"server-learning-rate": "eta", "adaptivity": "tau"}
STRATEGY_ARGUMENTS: dict[str, dict[str, str]] = {
    "fedavg": {},
    "fedavgm": {"server-learning-rate": "server_learning_rate", "server-momentum": "server_momentum"},
    "fedprox": {"proximal-mu": "proximal_mu"},
    "fedadam": _ADAPTIVE | {"server-beta-1": "beta_1", "server-beta-2": "beta_2"},
    "fedyogi": _ADAPTIVE | {"server-beta-1": "beta_1", "server-beta-2": "beta_2"},
    "fedadagrad": _ADAPTIVE,
}
"""Each `strategy` (Flower's class of that name in flwr.serverapp.strategy, strategies/flower_strategies.py) and
the keys it reads, with the constructor argument each becomes."""
STRATEGIES = tuple(STRATEGY_ARGUMENTS)


@dataclass(frozen=True)
class StrategyConfig:
    """The server strategy that aggregates the accepted updates, and its parameters (each read only by the
    strategies of STRATEGY_ARGUMENTS; a key moved from its default under another strategy is refused)."""

    name: str = setting("strategy", "fedavg")
    server_learning_rate: float = setting("server-learning-rate", 0.0)
    """0: Flower's own default for the strategy (fedavgm 1, fedadam 0.1, fedyogi 0.01, fedadagrad 0.1)."""
    server_momentum: float = setting("server-momentum", 0.9)
    proximal_mu: float = setting("proximal-mu", 0.01)
    adaptivity: float = setting("adaptivity", 1e-3)
    server_beta_1: float = setting("server-beta-1", 0.9)
    server_beta_2: float = setting("server-beta-2", 0.99)

    def validate(self) -> None:
        check_choice("strategy", self.name, STRATEGIES)
        if not (math.isfinite(self.server_learning_rate) and self.server_learning_rate >= 0):
            raise ValueError(f"server-learning-rate={self.server_learning_rate!r} is out of range: it must be a finite "
                             "number >= 0 (0: Flower's default for the strategy)")
        if not (math.isfinite(self.proximal_mu) and self.proximal_mu >= 0):
            raise ValueError(f"proximal-mu={self.proximal_mu!r} is out of range: it must be a finite number >= 0")
        check_positive("adaptivity", self.adaptivity)
        for key, value in (("server-momentum", self.server_momentum), ("server-beta-1", self.server_beta_1),
                           ("server-beta-2", self.server_beta_2)):
            if not 0 <= value < 1:
                raise ValueError(f"{key}={value!r} is out of range: it must lie in [0, 1)")
        self._refuse_unread()

    def _refuse_unread(self) -> None:
        """A key moved from its default under a strategy that never reads it would silently do nothing."""
        read = STRATEGY_ARGUMENTS[self.name]
        for spec in fields(self):
            key, value = spec.metadata["key"], getattr(self, spec.name)
            if key == "strategy" or key in read or value == spec.default:
                continue
            readers = ", ".join(name for name, keys in STRATEGY_ARGUMENTS.items() if key in keys)
            raise ValueError(f"{key}={value!r} has no effect with strategy={self.name!r}: it is read only by "
                             f"{readers}; choose one of those strategies, or leave {key} at its default "
                             f"{spec.default!r}")

    def arguments(self) -> dict[str, float]:
        """The strategy's constructor arguments from its keys (server-learning-rate 0: left to Flower)."""
        values = {spec.metadata["key"]: getattr(self, spec.name) for spec in fields(self)}
        return {argument: float(values[key]) for key, argument in STRATEGY_ARGUMENTS[self.name].items()
                if key != "server-learning-rate" or values[key] > 0}

    @property
    def client_proximal_mu(self) -> float:
        """mu of FedProx's proximal term (mu/2)||w - w_global||^2 on every client's local objective; 0 unless
        the strategy is fedprox (client/proximal.py)."""
        return self.proximal_mu if self.name == "fedprox" else 0.0


@dataclass(frozen=True)
class NetworkConfig:
    """The network every client trains: its architecture, normalisation layer and augmentation."""

    name: str = setting("model", DEFAULT)
    """'default': the data set's own network (dirichlet_fl.config.default_model), resolved when RunConfig is built."""
    norm: str = setting("norm", "default")
    allow_batch_norm: bool = setting("allow-batch-norm", False)
    augment: str = setting("augment", "auto")

    def validate(self) -> None:
        check_choice("model", self.name, MODELS)
        check_choice("augment", self.augment, AUGMENT_CHOICES)
        if self.norm != "default":
            check_norm(self.norm)
            if self.norm == "batch":
                raise ValueError("norm='batch' is refused: BatchNorm mixes the examples of a batch; set "
                                 "allow-batch-norm=true instead, which marks the run as outside the accountant")


@dataclass(frozen=True)
class PrivacyConfig:
    """The example-level mechanism and its budget: each client's (epsilon, delta), the Dirichlet mechanism's
    alpha, DP-SGD's clipping norm, and how the Dirichlet loss weights each example (privacy/dirichlet.py)."""

    mechanism: str = setting("mechanism", "dirichlet")
    target_epsilon: float = setting("target-epsilon", 1.0)
    client_epsilons: str = setting("client-epsilons", "")
    delta: float = setting("delta", PAPER_DELTA)
    alpha: float = setting("alpha", 3.0)
    max_grad_norm: float = setting("max-grad-norm", 1.0)
    dirichlet_weighting: str = setting("dirichlet-weighting", "normalized")
    dirichlet_weight_cap: float = setting("dirichlet-weight-cap", 20.0)

    def validate(self) -> None:
        check_choice("mechanism", self.mechanism, MECHANISMS)
        check_positive("target-epsilon", self.target_epsilon)
        self.client_epsilon_list()
        if not 0 < self.delta < MAX_DELTA:
            raise ValueError(f"delta={self.delta!r} is out of range: it must lie in (0, {MAX_DELTA:g}); a meaningful "
                             "delta lies far below 1/n for a client of n examples (the paper uses 1e-5)")
        check_positive("alpha", self.alpha)
        check_positive("max-grad-norm", self.max_grad_norm)
        check_choice("dirichlet-weighting", self.dirichlet_weighting, DIRICHLET_WEIGHTINGS)
        check_in_interval("dirichlet-weight-cap", self.dirichlet_weight_cap, 1.0, 1e6)

    def client_epsilon_list(self) -> list[float]:
        """Per-client targets from client-epsilons ("1.0,2.0,..."; entry i is partition i), or []."""
        if not self.client_epsilons.strip():
            return []
        try:
            values = [float(item) for item in self.client_epsilons.split(",")]
        except ValueError:
            raise ValueError(
                f"client-epsilons={self.client_epsilons!r} is invalid: give comma-separated numbers, one per client"
            ) from None
        for i, value in enumerate(values):
            check_positive(f"client-epsilons[{i}]", value)
        return values

    def target_epsilon_for(self, partition_id: int, num_partitions: int) -> float:
        """This client's budget: its entry of client-epsilons if given, else target-epsilon."""
        per_client = self.client_epsilon_list()
        if not per_client:
            return self.target_epsilon
        if len(per_client) != num_partitions:
            raise ValueError(
                f"client-epsilons has {len(per_client)} entries but the federation has {num_partitions} "
                f"clients: give exactly one target per client"
            )
        return per_client[partition_id]


@dataclass(frozen=True)
class LocalTrainingConfig:
    """What each client does in a round: its expected batch size (Poisson sampling, q = batch-size / n) and
    how many steps it takes (local-steps, or local-epochs / q), how its loss weighs each class, and the
    logit adjustment tau of its loss (client/logit_adjustment.py; 0: none)."""

    batch_size: int = setting("batch-size", 8)
    epochs: float = setting("local-epochs", 3.0)
    steps: int = setting("local-steps", 0)
    class_weighting: str = setting("class-weighting", "none")
    class_weight_cap: float = setting("class-weight-cap", 10.0)
    logit_adjustment: float = setting("logit-adjustment", 0.0)

    def validate(self) -> None:
        check_integer("batch-size", self.batch_size, 1)
        check_positive("local-epochs", self.epochs)
        check_integer("local-steps", self.steps, 0)
        check_choice("class-weighting", self.class_weighting, CLASS_WEIGHTINGS)
        check_in_interval("class-weight-cap", self.class_weight_cap, 1.0, 1e6)
        check_in_interval("logit-adjustment", self.logit_adjustment, 0.0, MAX_LOGIT_ADJUSTMENT)
        if self.steps > MAX_LOCAL_STEPS:
            raise ValueError(f"local-steps={self.steps} is out of range: at most {MAX_LOCAL_STEPS:,} steps a "
                             "round (0: local-epochs / q); lower it, or set local-epochs instead")

    def steps_per_round(self, sample_rate: float) -> int:
        """local-steps if set, else local-epochs / q (an epoch of Poisson sampling is 1/q steps)."""
        return self.steps if self.steps > 0 else max(1, round(self.epochs / sample_rate))


@dataclass(frozen=True)
class OutputConfig:
    """Where the run writes and what it records and watches: its folder, the audit, the kept updates, the
    idle and dead-class watches, and the run folder it resumes. None of them touches the data, the split,
    training or the accounting (every one but keep-updates may change on resume)."""

    results_dir: str = setting("results-dir", "results")
    run_name: str = setting("run-name", "")
    audit: bool = setting("audit", False)
    max_idle_rounds: int = setting("max-idle-rounds", 2)
    dead_class_rounds: int = setting("dead-class-rounds", 3)
    """Warn (round line, summary.json's dead_classes) when a class's central recall has been 0 this many
    consecutive rounds."""
    resume_from: str = setting("resume-from", "")
    keep_updates: bool = setting("keep-updates", False)

    def validate(self) -> None:
        if self.run_name in (".", "..") or any(mark in self.run_name for mark in ("/", "\\", "\0")):
            raise ValueError(
                f"run-name={self.run_name!r} is invalid: give a plain folder name (no '/', '..'); "
                "the run's folder is always created inside results-dir"
            )
        check_integer("max-idle-rounds", self.max_idle_rounds, 1)
        check_integer("dead-class-rounds", self.dead_class_rounds, 1)


@dataclass(frozen=True)
class RandomnessConfig:
    """Where every client's privacy randomness comes from (docs/privacy.md#secure-randomness): keys from
    `seed` or fresh OS entropy (secure-noise), draws from a seeded generator or the OS's CSPRNG (secure-rng)."""

    secure_noise: bool = setting("secure-noise", False)
    secure_rng: bool = setting("secure-rng", False)
