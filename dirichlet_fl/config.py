"""The run configuration: read once from Flower's run config into a typed, validated dataclass.

Keys are kebab-case in pyproject.toml's [tool.flwr.app.config] and in `flwr run . --run-config`;
fields here are their snake_case twins. Every invalid value raises a ValueError that names the key,
the value and the valid range.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from dirichlet_fl.norms import check_norm
from dirichlet_fl.partition import PARTITIONERS
from privacy.analysis import PAPER_DELTA, S_Y_FOR_LEARNING_RATE
from privacy.checks import check_choice, check_in_interval, check_in_open_interval, check_integer, check_positive
from privacy.client_level import AdaptiveClipping, update_noise_multiplier
from privacy.registry import MECHANISMS

OPTIMIZERS = ("sgd", "adam")
RESUMABLE_KEYS = frozenset(
    {"resume-from", "results-dir", "run-name", "device", "audit", "fraction-evaluate", "max-idle-rounds"}
)
"""The keys a resumed run may change: none of them touches the data, the split, training or the accounting."""
LEARNING_RATE_MODES = ("effective", "adaptive", "raw")
DIRICHLET_WEIGHTINGS = ("normalized", "paper")
"""normalized: each example's NLL times kappa(reference-confidence)/kappa(s_y), capped (privacy/dirichlet.py);
paper: Algorithm 1 as published."""
AUGMENT_CHOICES = ("auto", "on", "off")
SECURE_AGGREGATION = ("none", "secaggplus")
"""none: the server sees every update; secaggplus: Flower's SecAgg+, the server sees only the sum."""
CLIENT_DP = ("none", "central", "adaptive")
COUNT_STDDEV_DIVISOR = 20
"""Adaptive clipping's default count noise: sigma_b = m / 20 for m sampled clients (Andrew et al. 2021)."""
"""Client-level DP on the aggregate (DP-FedAvg): none, or central (fixed clipping norm, Gaussian noise)."""


def clients_per_round(population: int, fraction: float, eligible: int) -> int:
    """How many clients a round samples: max(1, int(population * fraction)) of the `eligible` ones, at
    most all of them (strategies/private_fedavg.py seeded_sample; dirichlet_fl/preflight.py)."""
    return min(eligible, max(1, int(population * fraction)))


@dataclass(frozen=True)
class SplitSpec:
    """What fixes a run's data split: the data set, where it lives, the partitioner and its
    parameters, the seed and the number of clients. The cache key of the split and every shard."""

    dataset: str
    data_root: str
    download: bool
    partitioner: str
    beta: float
    classes_per_client: int
    site_file: str
    seed: int
    num_clients: int
    validation_fraction: float = 0.0


@dataclass(frozen=True)
class RunConfig:
    """Everything one federated run needs. Defaults are the embedded digits job of README.md."""

    num_server_rounds: int = 5
    calibration_rounds: int = 0
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    seed: int = 0
    dataset: str = "digits"
    data_root: str = "data"
    data_download: bool = False
    validation_fraction: float = 0.0
    partitioner: str = "dirichlet"
    beta: float = 0.5
    classes_per_client: int = 2
    site_file: str = ""
    model: str = "cnn"
    norm: str = "default"
    allow_batch_norm: bool = False
    augment: str = "auto"
    mechanism: str = "dirichlet"
    target_epsilon: float = 1.0
    client_epsilons: str = ""
    delta: float = PAPER_DELTA
    alpha: float = 3.0
    max_grad_norm: float = 1.0
    batch_size: int = 8
    local_epochs: float = 3.0
    local_steps: int = 0
    optimizer: str = "sgd"
    learning_rate: float = 0.05
    learning_rate_mode: str = "effective"
    reference_confidence: float = S_Y_FOR_LEARNING_RATE
    dirichlet_weighting: str = "normalized"
    dirichlet_weight_cap: float = 5.0
    device: str = "auto"
    results_dir: str = "results"
    run_name: str = ""
    audit: bool = False
    max_idle_rounds: int = 2
    resume_from: str = ""
    keep_updates: bool = False
    secure_noise: bool = False
    secure_rng: bool = False
    secure_aggregation: str = "none"
    secagg_num_shares: float = 1.0
    secagg_reconstruction_threshold: float = 0.5
    secagg_clipping_range: float = 8.0
    secagg_quantization_range: int = 4194304
    secagg_max_weight: float = 1000.0
    client_dp: str = "none"
    client_clipping_norm: float = 1.0
    client_noise_multiplier: float = 1.0
    client_clip_target_quantile: float = 0.5
    client_clip_learning_rate: float = 0.2
    client_clipped_count_stddev: float = 0.0

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> RunConfig:
        """Build from Flower's context.run_config (kebab-case keys); unknown keys are an error."""
        known = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = sorted(set(run_config) - set(known))
        if unknown:
            raise ValueError(f"unknown run-config keys {unknown}; valid keys: {sorted(known)}")
        values = {known[key].name: _coerce(key, value, str(known[key].type)) for key, value in run_config.items()}
        config = cls(**values)
        config.validate()
        return config

    def to_run_config(self) -> dict[str, Any]:
        """The kebab-case mapping (what results/config.json stores and --run-config accepts)."""
        return {key.replace("_", "-"): value for key, value in asdict(self).items()}

    def validate(self) -> None:
        """Raise a ValueError naming the first invalid key, its value and the valid range."""
        check_integer("num-server-rounds", self.num_server_rounds, 1)
        check_integer("calibration-rounds", self.calibration_rounds, 0)
        check_in_interval("fraction-train", self.fraction_train, 0.0, 1.0, open_low=True)
        check_in_interval("fraction-evaluate", self.fraction_evaluate, 0.0, 1.0)
        check_in_interval("validation-fraction", self.validation_fraction, 0.0, 0.5)
        check_choice("partitioner", self.partitioner, PARTITIONERS)
        check_positive("beta", self.beta)
        check_integer("classes-per-client", self.classes_per_client, 1)
        if self.partitioner == "natural" and not self.site_file:
            raise ValueError("partitioner='natural' needs site-file: a CSV with columns index,site")
        check_choice("augment", self.augment, AUGMENT_CHOICES)
        if self.norm != "default":
            check_norm(self.norm)
            if self.norm == "batch":
                raise ValueError("norm='batch' is refused: BatchNorm mixes the examples of a batch; set "
                                 "allow-batch-norm=true instead, which marks the run as outside the accountant")
        check_choice("mechanism", self.mechanism, MECHANISMS)
        check_positive("target-epsilon", self.target_epsilon)
        self.client_epsilon_list()
        check_in_open_interval("delta", self.delta, 0.0, 1.0)
        check_positive("alpha", self.alpha)
        check_positive("max-grad-norm", self.max_grad_norm)
        check_integer("batch-size", self.batch_size, 1)
        check_positive("local-epochs", self.local_epochs)
        check_integer("local-steps", self.local_steps, 0)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_positive("learning-rate", self.learning_rate)
        check_choice("learning-rate-mode", self.learning_rate_mode, LEARNING_RATE_MODES)
        check_in_interval("reference-confidence", self.reference_confidence, 0.0, 1.0, open_low=True)
        check_choice("dirichlet-weighting", self.dirichlet_weighting, DIRICHLET_WEIGHTINGS)
        check_in_interval("dirichlet-weight-cap", self.dirichlet_weight_cap, 1.0, 1e6)
        if self.learning_rate_mode == "adaptive" and self.dirichlet_weighting == "normalized":
            raise ValueError(
                "learning-rate-mode='adaptive' with dirichlet-weighting='normalized' is contradictory: the "
                "normalisation already undoes kappa(s_y) per example; use learning-rate-mode='effective', or "
                "dirichlet-weighting='paper' to adapt the rate to the measured s_y"
            )
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"device={self.device!r} is invalid: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
        if self.run_name in (".", "..") or any(mark in self.run_name for mark in ("/", "\\", "\0")):
            raise ValueError(
                f"run-name={self.run_name!r} is invalid: give a plain folder name (no '/', '..'); "
                "the run's folder is always created inside results-dir"
            )
        check_integer("max-idle-rounds", self.max_idle_rounds, 1)
        self._validate_aggregation()

    def _validate_aggregation(self) -> None:
        """The secure-aggregation and client-dp keys (README.md, "Secure aggregation and client-level DP")."""
        check_choice("secure-aggregation", self.secure_aggregation, SECURE_AGGREGATION)
        if self.keep_updates and self.secure_aggregation != "none":
            raise ValueError(
                f"keep-updates=true with secure-aggregation={self.secure_aggregation!r} is contradictory: the server "
                "never sees one client's update; turn one of them off"
            )
        for key, value in (("secagg-num-shares", self.secagg_num_shares),
                           ("secagg-reconstruction-threshold", self.secagg_reconstruction_threshold)):
            check_positive(key, value)
            if value > 1 and (value != int(value) or value < 2):
                raise ValueError(f"{key}={value!r} is invalid: give a fraction in (0, 1] or a whole count >= 2")
        if self.secagg_num_shares > 1 and self.secagg_num_shares <= 2:
            raise ValueError(f"secagg-num-shares={self.secagg_num_shares!r} is invalid: a count must be > 2")
        if 1 < self.secagg_num_shares <= self.secagg_reconstruction_threshold:
            raise ValueError(
                f"secagg-reconstruction-threshold={self.secagg_reconstruction_threshold!r} must be below "
                f"secagg-num-shares={self.secagg_num_shares!r}"
            )
        check_positive("secagg-clipping-range", self.secagg_clipping_range)
        check_integer("secagg-quantization-range", self.secagg_quantization_range, 2)
        if self.secagg_quantization_range >= 2**32:
            raise ValueError(
                f"secagg-quantization-range={self.secagg_quantization_range} is out of range: it must be below 2**32 "
                "(the masks' modulus)"
            )
        check_positive("secagg-max-weight", self.secagg_max_weight)
        check_choice("client-dp", self.client_dp, CLIENT_DP)
        check_positive("client-clipping-norm", self.client_clipping_norm)
        if not self.client_noise_multiplier >= 0:
            raise ValueError(f"client-noise-multiplier={self.client_noise_multiplier!r} is out of range: it must be >= 0")
        check_in_open_interval("client-clip-target-quantile", self.client_clip_target_quantile, 0.0, 1.0)
        check_positive("client-clip-learning-rate", self.client_clip_learning_rate)
        if not self.client_clipped_count_stddev >= 0:
            raise ValueError(f"client-clipped-count-stddev={self.client_clipped_count_stddev!r} is out of range: it "
                             "must be >= 0 (0: the first round's number of sampled clients / 20)")
        if self.client_dp == "adaptive" and self.client_clipped_count_stddev > 0:
            update_noise_multiplier(self.client_noise_multiplier, self.client_clipped_count_stddev)

    def clipped_count_stddev(self, sample_size: int) -> float:
        """sigma_b of client-dp = "adaptive": client-clipped-count-stddev, or (0) the number of clients
        sampled in the first round / 20, Andrew et al.'s suggestion; fixed for the run."""
        return self.client_clipped_count_stddev or sample_size / COUNT_STDDEV_DIVISOR

    def adaptive_clipping(self, count_stddev: float) -> AdaptiveClipping:
        """client-dp = "adaptive"'s clipping with count noise sigma_b = `count_stddev` (see
        clipped_count_stddev), after checking that it leaves room for z (update_noise_multiplier refuses)."""
        update_noise_multiplier(self.client_noise_multiplier, count_stddev)
        return AdaptiveClipping(self.client_clipping_norm, self.client_clip_target_quantile,
                                self.client_clip_learning_rate, count_stddev)

    @property
    def budget_rounds(self) -> int:
        """Rounds each client plans its budget for: calibration-rounds, or (0) every server round.

        A client calibrated for fewer rounds than the run has uses a larger r and refuses to
        train once its budget is spent."""
        return self.calibration_rounds or self.num_server_rounds

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

    def split_spec(self, num_clients: int) -> SplitSpec:
        """The part of the config that fixes the data split among `num_clients` clients."""
        return SplitSpec(
            dataset=self.dataset,
            data_root=self.data_root,
            download=self.data_download,
            partitioner=self.partitioner,
            beta=self.beta,
            classes_per_client=self.classes_per_client,
            site_file=self.site_file,
            seed=self.seed,
            num_clients=num_clients,
            validation_fraction=self.validation_fraction,
        )

    def local_steps_per_round(self, sample_rate: float) -> int:
        """local-steps if set, else local-epochs / q (an epoch of Poisson sampling is 1/q steps)."""
        return self.local_steps if self.local_steps > 0 else max(1, round(self.local_epochs / sample_rate))


def _coerce(key: str, value: Any, annotation: str) -> Any:
    """Convert a TOML / --run-config value to the field's type, naming the key when it cannot."""
    kind = {"int": int, "float": float, "bool": bool, "str": str}[annotation]
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"{key}={value!r} is invalid: use true or false")
    if kind is str:
        return str(value)
    if isinstance(value, bool):
        raise ValueError(f"{key}={value!r} is invalid: expected a number")
    try:
        converted = kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}={value!r} is invalid: expected {annotation}") from None
    if kind is int and converted != float(value):
        raise ValueError(f"{key}={value!r} is invalid: expected an integer")
    return converted


def parse_run_config(run_config: Mapping[str, Any]) -> RunConfig:
    """RunConfig.from_run_config, parsed once per process for each distinct run config (a client
    process serves many messages of the same run)."""
    return _parse(tuple(sorted(run_config.items())))


@functools.lru_cache(maxsize=8)
def _parse(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    return RunConfig.from_run_config(dict(items))
