"""The run configuration: read once from Flower's run config into a typed, validated dataclass.

Keys are kebab-case in pyproject.toml's [tool.flwr.app.config] and in `flwr run . --run-config`; each
field names its key (`setting`). The round-level keys are RunConfig's own; the others are grouped by
concern into sub-configs (dirichlet_fl.config_groups: network, privacy, local training, output, randomness,
data, learning rate, SecAgg+, client-level DP, strategy) while the keys themselves stay flat, and
to_run_config lists them in RunConfig's field order (config.json's). Every invalid value raises a
ValueError that names the key, the value and the valid range. Adding a key: one `setting` line in the
dataclass it belongs to, its check in that class's validate(), and its default in pyproject.toml.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any, cast

from dirichlet_fl.config_groups import (
    DEFAULT,
    SYNTHETIC,
    ClientDpConfig,
    DataConfig,
    LearningRateConfig,
    LocalTrainingConfig,
    NetworkConfig,
    OutputConfig,
    PrivacyConfig,
    RandomnessConfig,
    SecAggConfig,
    StrategyConfig,
    setting,
)
from dirichlet_fl.models.recipes import recipe
from privacy.checks import check_in_interval, check_integer
from privacy.registry import mechanism_class

RESUMABLE_KEYS = frozenset(
    {"resume-from", "results-dir", "run-name", "device", "audit", "fraction-evaluate", "max-idle-rounds",
     "dead-class-rounds"}
)
"""The keys a resumed run may change: none of them touches the data, the split, training or the accounting."""
SEED_LIMIT = 2**32
"""seed must lie in [0, 2**32): the range numpy's and flwr-datasets' shuffling seeds accept."""
MAX_CLIENTS = 10_000_000
"""num-clients must be at most this: a hundred times the largest population measured (BENCHMARKS.md)."""


def clients_per_round(population: int, fraction: float, eligible: int) -> int:
    """How many clients a round samples: max(1, int(population * fraction)) of the `eligible` ones, at
    most all of them (strategies/private.py seeded_sample; dirichlet_fl/preflight.py)."""
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
    data_path: str = ""
    synthetic: tuple[float, float, int] = (1.0, 1.0, 100)
    """dataset = "synthetic": synthetic-alpha, synthetic-beta, synthetic-examples."""


@dataclass(frozen=True)
class Training:
    """The optimizer, its rate (SGD: the effective rate, per learning-rate-mode; Adam: its own units) and the
    warm-up a run trains with: the keys given, the network's Recipe for those left at their defaults."""

    optimizer: str
    rate: float
    warmup_rounds: int

    def warmup_factor(self, server_round: int) -> float:
        """The linear warm-up's share of the rate in `server_round` (1-based): min(1, round / W), 1 without
        one (W = 0). Why: at the start every s_y is about 1/K, so the normalised Dirichlet loss weights each
        example by about kappa(s_ref) / kappa(1/K), roughly s_ref K, and its first steps are that much larger
        than the effective rate's cross-entropy step (Theorem 11); a network can die in round 1."""
        return min(1.0, server_round / self.warmup_rounds) if self.warmup_rounds else 1.0


def default_model(dataset: str) -> str:
    """model = "default": softmax regression for dataset = "synthetic" (60 features, no image), else `cnn`."""
    return "logreg" if dataset == SYNTHETIC else "cnn"


def resolve_training(lr: LearningRateConfig, model: str, norm: str) -> Training:
    """`lr` with every key left at its default (optimizer "default", learning-rate 0, warm-up -1) replaced by
    the network's Recipe (dirichlet_fl.models.recipes.recipe); an explicit optimizer gets the network's rate for it."""
    own = recipe(model, norm)
    optimizer = own.optimizer if lr.optimizer == DEFAULT else lr.optimizer
    return Training(optimizer, lr.rate or own.rate(optimizer),
                    own.warmup_rounds if lr.warmup_rounds < 0 else lr.warmup_rounds)


@dataclass(frozen=True)
class RunConfig:
    """Everything one federated run needs: the round-level keys, then one sub-config per concern (the
    field order is config.json's key order). Defaults are the embedded digits job of README.md."""

    num_server_rounds: int = setting("num-server-rounds", 5)
    calibration_rounds: int = setting("calibration-rounds", 0)
    fraction_train: float = setting("fraction-train", 1.0)
    fraction_evaluate: float = setting("fraction-evaluate", 1.0)
    seed: int = setting("seed", 0)
    num_clients: int = setting("num-clients", 0)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    local: LocalTrainingConfig = field(default_factory=LocalTrainingConfig)
    device: str = setting("device", "auto")
    output: OutputConfig = field(default_factory=OutputConfig)
    randomness: RandomnessConfig = field(default_factory=RandomnessConfig)
    data: DataConfig = field(default_factory=DataConfig)
    lr: LearningRateConfig = field(default_factory=LearningRateConfig)
    secagg: SecAggConfig = field(default_factory=SecAggConfig)
    client_level: ClientDpConfig = field(default_factory=ClientDpConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)

    def __post_init__(self) -> None:
        if self.network.name == DEFAULT:  # frozen: resolved once, so every reader and config.json see the name
            object.__setattr__(self, "network", replace(self.network, name=default_model(self.data.dataset)))

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> RunConfig:
        """Build from Flower's context.run_config (kebab-case keys); unknown keys are an error."""
        known = dict(_settings())
        unknown = sorted(set(run_config) - set(known))
        if unknown:
            raise ValueError(f"unknown run-config keys {unknown}; valid keys: {sorted(known)}")
        top: dict[str, Any] = {}
        groups: dict[str, dict[str, Any]] = {}
        for key, value in run_config.items():
            group, spec = known[key]
            (top if group is None else groups.setdefault(group, {}))[spec.name] = _coerce(key, value, str(spec.type))
        for group, values in groups.items():
            top[group] = _group_types()[group](**values)
        config = cls(**top)
        config.validate()
        return config

    def to_run_config(self) -> dict[str, Any]:
        """The kebab-case mapping (what --run-config accepts), as given."""
        return {key: getattr(self if group is None else getattr(self, group), spec.name)
                for key, (group, spec) in _settings()}

    def resolved_run_config(self) -> dict[str, Any]:
        """to_run_config with the optimizer, rate and warm-up the run trains with (RunConfig.training) in
        place of their defaults: what results/config.json stores, and what a resumed run must keep."""
        training = self.training
        return {**self.to_run_config(), "optimizer": training.optimizer, "learning-rate": training.rate,
                "learning-rate-warmup-rounds": training.warmup_rounds}

    def validate(self) -> None:
        """Raise a ValueError naming the first invalid key, its value and the valid range: the round-level
        keys, then each sub-config's own, then the checks that span two of them."""
        check_integer("num-server-rounds", self.num_server_rounds, 1)
        check_integer("calibration-rounds", self.calibration_rounds, 0)
        check_in_interval("fraction-train", self.fraction_train, 0.0, 1.0, open_low=True)
        check_in_interval("fraction-evaluate", self.fraction_evaluate, 0.0, 1.0)
        if isinstance(self.seed, bool) or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed={self.seed!r} is out of range: it must be an integer in [0, 2**32) (the range "
                             "numpy's and flwr-datasets' shuffling seeds accept)")
        self._validate_population()
        self.data.validate()
        self.network.validate()
        self._validate_network_fits()
        self.privacy.validate()
        self.local.validate()
        self.lr.validate()
        self._validate_weighting()
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"device={self.device!r} is invalid: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
        self.output.validate()
        self.secagg.validate()
        if self.output.keep_updates and self.secagg.mode != "none":
            raise ValueError(
                f"keep-updates=true with secure-aggregation={self.secagg.mode!r} is contradictory: the server "
                "never sees one client's update; turn one of them off"
            )
        self.client_level.validate()
        self.strategy.validate()

    def _validate_population(self) -> None:
        """num-clients: 0 (one client per SuperNode) or the simulated population the SuperNodes serve."""
        check_integer("num-clients", self.num_clients, 0)
        if self.num_clients > MAX_CLIENTS:
            raise ValueError(f"num-clients={self.num_clients} is out of range: at most {MAX_CLIENTS:,} (0: one "
                             "client per SuperNode)")
        if self.num_clients and self.secagg.mode != "none":
            raise ValueError(f"num-clients={self.num_clients} with secure-aggregation={self.secagg.mode!r} is not "
                             "supported: Flower's SecAgg+ workflow addresses SuperNodes, not the clients they serve; "
                             "set num-clients=0 (one client per SuperNode) or secure-aggregation='none'")

    def _validate_network_fits(self) -> None:
        """The network against the data set and the mechanism."""
        if self.data.dataset == SYNTHETIC:
            self._validate_synthetic_model()
        if self.network.allow_batch_norm and mechanism_class(self.privacy.mechanism).per_example_gradients:
            raise ValueError(
                f"allow-batch-norm=true is invalid with mechanism={self.privacy.mechanism!r}: Opacus needs per-example "
                "gradients, which BatchNorm does not have, so no client could train; set allow-batch-norm=false"
            )

    def _validate_synthetic_model(self) -> None:
        """dataset = "synthetic" holds 60 features, not images: the softmax model, no image augmentation,
        and more examples per client than a batch (q = batch-size / examples < 1)."""
        if self.network.name != "logreg":
            raise ValueError(f"model={self.network.name!r} with dataset='synthetic': its 60 features are no image; "
                             "use model='logreg' (softmax regression)")
        if self.network.augment == "on":
            raise ValueError("augment='on' with dataset='synthetic': crops and flips apply to images; set "
                             "augment='auto'")
        if self.output.audit:
            raise ValueError("audit=true with dataset='synthetic': the audit needs a stored split of members and "
                             "non-members; set audit=false")
        if self.data.synthetic_examples <= self.local.batch_size:
            raise ValueError(f"synthetic-examples={self.data.synthetic_examples} must exceed batch-size="
                             f"{self.local.batch_size} (a client's sampling rate batch-size/examples must be < 1)")

    def _validate_weighting(self) -> None:
        """The Dirichlet loss's per-example weighting (privacy/dirichlet.py) against the rate's mode."""
        if self.lr.mode == "adaptive" and self.privacy.dirichlet_weighting == "normalized":
            raise ValueError(
                "learning-rate-mode='adaptive' with dirichlet-weighting='normalized' is contradictory: the "
                "normalisation already undoes kappa(s_y) per example; use learning-rate-mode='effective', or "
                "dirichlet-weighting='paper' to adapt the rate to the measured s_y"
            )

    @property
    def training(self) -> Training:
        """The optimizer, rate and warm-up this run trains with (resolve_training: the network's own unless given)."""
        return resolve_training(self.lr, self.network.name, self.network.norm)

    @property
    def budget_rounds(self) -> int:
        """Rounds each client plans its budget for: calibration-rounds, or (0) every server round.

        A client calibrated for fewer rounds than the run has uses a larger r and refuses to
        train once its budget is spent."""
        return self.calibration_rounds or self.num_server_rounds

    def split_spec(self, num_clients: int) -> SplitSpec:
        """The part of the config that fixes the data split among `num_clients` clients."""
        return SplitSpec(
            dataset=self.data.dataset,
            data_root=self.data.root,
            download=self.data.download,
            partitioner=self.data.partitioner,
            beta=self.data.beta,
            classes_per_client=self.data.classes_per_client,
            site_file=self.data.site_file,
            seed=self.seed,
            num_clients=num_clients,
            validation_fraction=self.data.validation_fraction,
            data_path=self.data.path,
            synthetic=(self.data.synthetic_alpha, self.data.synthetic_beta, self.data.synthetic_examples),
        )


def _settings() -> Iterator[tuple[str, tuple[str | None, Field[Any]]]]:
    """Every run-config key with where it lives: (key, (sub-config attribute or None, its field))."""
    for spec in fields(RunConfig):
        if "key" in spec.metadata:
            yield spec.metadata["key"], (None, spec)
        else:
            yield from ((inner.metadata["key"], (spec.name, inner)) for inner in fields(_group_types()[spec.name]))


@functools.cache
def _group_types() -> dict[str, type]:
    """RunConfig's sub-config attributes and their dataclasses."""
    return {spec.name: cast(type, spec.default_factory) for spec in fields(RunConfig) if "key" not in spec.metadata}


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
    except (TypeError, ValueError, OverflowError):
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
