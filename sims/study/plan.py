"""The study's grid and what it holds fixed, and the checks that run before any training.

A partition is one value of the non-IID axis: a Dirichlet label skew `beta` (Hsu et al. 2019; smaller
is more skewed), `iid`, `central` (one client with all the training data, the centralized reference),
`classes=K` (pathological: K classes per client) or `natural` (sites from a CSV). A cell is a
partition x mechanism x eps x seed x optimizer x strategy; mechanism `none` has one eps, infinity. A
mechanism's rate is either given (a rate flag) or None: tuned on the validation split first
(sims/study/tuning.py); a strategy's server rate (SERVER_RATE_STRATEGIES) is always tuned.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dirichlet_fl.client_plan import mechanism_spec, too_small_to_train
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import (
    STRATEGY_ARGUMENTS,
    DataConfig,
    LearningRateConfig,
    LocalTrainingConfig,
    NetworkConfig,
    OutputConfig,
    PrivacyConfig,
    StrategyConfig,
)
from dirichlet_fl.data.loaders import NPZ, load_dataset
from dirichlet_fl.data.split import FederatedSplit, federated_split
from dirichlet_fl.models.recipes import DEFAULT_WARMUP_ROUNDS
from privacy.accounting.analysis import PAPER_DELTA, epsilon_floor
from privacy.registry import BASELINE_FIRST, mechanism_class
from privacy.registry import MECHANISMS as MECHANISMS_BY_NAME
from sims.study.data_file import linked_root

MECHANISMS = BASELINE_FIRST
PRIORITY_EPSILONS = (1.0, 4.0)
VALIDATION_FRACTION = 0.2
PARTITION_WORDS = ("iid", "central", "natural")
SERVER_RATE_STRATEGIES = tuple(name for name, keys in STRATEGY_ARGUMENTS.items() if "server-learning-rate" in keys)
"""The strategies with a server learning rate (FedAvgM's and the adaptive ones'): tuned over --server-rate-grid."""
DEFAULT_PROXIMAL_MU = StrategyConfig().proximal_mu
"""FedProx's mu when --proximal-mu is not given: the app's default (dirichlet_fl.config)."""
RATE_FLAGS = {name: cls.rate_flag() for name, cls in MECHANISMS_BY_NAME.items()}


@dataclass(frozen=True)
class Study:
    """Everything the study holds fixed across cells, and its axes (saved as study.json; --resume needs
    an identical one). Paths are the user's (data_root, data_path), never a derived folder."""

    dataset: str = "dermamnist"
    data_root: str = ""
    data_path: str = ""
    num_clients: int = 10
    partitions: tuple[str, ...] = ("0.3", "iid")
    site_file: str = ""
    epsilons: tuple[float, ...] = (1.0, 4.0)
    mechanisms: tuple[str, ...] = MECHANISMS
    seeds: tuple[int, ...] = (0, 1, 2)
    model: str = "lenet"
    rounds: int = 20
    local_epochs: float = 1.0
    batch_size: int = 10
    learning_rate: float | None = None
    """The rate of mechanism none (in the one optimizer's units; SGD: a plain rate); None: tuned on the
    validation split."""
    dirichlet_learning_rate: float | None = None
    """The Dirichlet clients' rate (SGD: the effective rate, each client runs SGD at this / kappa_i(s_ref) at its
    own r*; Adam: Adam's own rate); None: tuned."""
    dpsgd_learning_rate: float | None = None
    rate_grid: str = ""
    """SGD's rates tried for each tuned mechanism, canonical 'none=0.02/0.05/0.1,...' (sims/study/tuning.py);
    empty when SGD is not among the optimizers."""
    optimizers: tuple[str, ...] = ("sgd",)
    """The optimizer axis (dirichlet_fl.config_groups.OPTIMIZERS): every cell runs once per optimizer, each at its own
    rate, tuned over its own grid. A study.json from before the axis existed ran SGD only."""
    adam_rate_grid: str = ""
    """Adam's rates tried for each tuned mechanism (Adam's own units), as rate_grid; empty without Adam."""
    strategies: tuple[str, ...] = ("fedavg",)
    """The strategy axis (dirichlet_fl.config.STRATEGIES, each Flower's own class aggregating in the plain loop):
    every cell runs once per strategy, each at its own tuned rates. A study.json from before the axis ran fedavg."""
    server_rate_grid: str = ""
    """The server learning rates tried per strategy of SERVER_RATE_STRATEGIES in the study, canonical
    'fedavgm=0.1/0.3/1,...' (sims/study/tuning.py); empty when the study has none of them."""
    proximal_mu: float = DEFAULT_PROXIMAL_MU
    """FedProx's mu (fixed, not tuned: the app's proximal-mu)."""
    rate_extension_steps: int = 2
    """When the rate chosen is the only good one and at an end of the rates tried, the tuner tries one more
    geometric step beyond that end, up to this many each way (sims/study/tuning.py); 0: never. A study.json
    from before it existed never extended."""
    server_rate_extension_steps: int = 2
    """As rate_extension_steps, for the server rate of a strategy with one: one more server step beyond an end of
    --server-rate-grid at the client rate chosen (sims/study/tuning.py). A study.json from before it never
    extended the server grid."""
    learning_rate_mode: str = "effective"
    max_grad_norm: float = 1.0
    alpha: float = 3.0
    validation: bool = False
    """Evaluate the cells on a stratified 20 % of the training data instead of the test set."""
    norm: str = "default"
    dirichlet_weighting: str = "normalized"
    dirichlet_weight_cap: float = 20.0
    """normalized, cap 20: at batch 32 it kept every class alive where the paper's loss collapsed
    (BENCHMARKS.md, section 11)."""
    class_weighting: str = "none"
    class_weight_cap: float = 10.0
    """The app's class-weighting and class-weight-cap (client/class_balance.py): balanced weighs each
    client's classes by n / (K n_k), capped; a study.json from before they existed ran none."""
    logit_adjustment: float = 0.0
    """The app's logit-adjustment tau (client/logit_adjustment.py): each client's loss on its logits plus tau times
    the log of its own class frequencies; 0, and a study.json from before it existed: none."""
    warmup_rounds: int = DEFAULT_WARMUP_ROUNDS
    """The app's learning-rate-warmup-rounds: the rate rises linearly over this many rounds (0: none)."""
    device: str = "cpu"


@dataclass(frozen=True)
class Cell:
    """One run: a partition, a mechanism, a target eps (inf for none), a seed, an optimizer and a strategy."""

    partition: str
    mechanism: str
    epsilon: float
    seed: int
    optimizer: str = "sgd"
    strategy: str = "fedavg"

    @property
    def key(self) -> tuple[str, str, float, int, str, str]:
        return (self.partition, self.mechanism, self.epsilon, self.seed, self.optimizer, self.strategy)


def parse_partition(word: str) -> str:
    """A --betas item in its canonical spelling: a beta > 0 as written by %g, or a partition word."""
    if word in PARTITION_WORDS or word.startswith("classes="):
        return word
    try:
        beta = float(word)
    except ValueError:
        raise ValueError(f"--betas: {word!r} is not a beta; give numbers > 0, or the words "
                         f"{', '.join(PARTITION_WORDS[:2])}") from None
    if not beta > 0 or not math.isfinite(beta):
        raise ValueError(f"--betas: beta={word} is out of range; the Dirichlet concentration must be > 0 and finite")
    return f"{beta:g}"


def cells(study: Study) -> list[Cell]:
    """Every cell, in an order that makes a stopped study useful: the baselines and eps 1 and 4 first,
    then seed by seed, and within a seed Dirichlet, then none, then DP-SGD (the slowest); so a study
    stopped part-way holds every partition at the headline eps for one seed before it adds seeds; every
    optimizer and strategy of a cell runs next to the others."""
    order = sorted(study.mechanisms, key=("dirichlet", "none", "dpsgd").index)
    every = [Cell(partition, mechanism, epsilon, seed, optimizer, strategy)
             for mechanism in order for partition in study.partitions
             for epsilon in (study.epsilons if mechanism_class(mechanism).private else (math.inf,))
             for seed in study.seeds for optimizer in study.optimizers for strategy in study.strategies]
    return sorted(every, key=lambda c: (not (math.isinf(c.epsilon) or c.epsilon in PRIORITY_EPSILONS), c.seed))


def clients_of(study: Study, partition: str) -> int:
    return 1 if partition == "central" else study.num_clients


def given_rate(study: Study, mechanism: str) -> float | None:
    """The mechanism's rate from its flag (in the units of the study's one optimizer: options.py refuses a
    rate flag with two), or None: tuned on the validation split."""
    rate: float | None = getattr(study, mechanism_class(mechanism).rate_key)
    return rate


def tuned_mechanisms(study: Study) -> tuple[str, ...]:
    """The study's mechanisms whose rate no flag gives."""
    return tuple(m for m in study.mechanisms if given_rate(study, m) is None)


def data_source(study: Study) -> tuple[str, str, str]:
    """The app's (dataset, data-root, data-path). A --data-path file read as a medmnist flag is linked as
    `<flag>.npz` into a folder derived from its path under the system's temporary folder (medmnist's
    reader reads `<root>/<flag>.npz`); that folder is derived, so study.json never records it."""
    if study.data_path and study.dataset != NPZ:
        digest = hashlib.sha256(str(Path(study.data_path).resolve()).encode()).hexdigest()[:16]
        folder = Path(tempfile.gettempdir()) / "dirichlet-fl-study-data" / digest
        return study.dataset, str(linked_root(Path(study.data_path), study.dataset, folder)), ""
    return study.dataset, study.data_root, study.data_path


def strategy_config(study: Study, strategy: str, server_rate: float = 0.0) -> StrategyConfig:
    """The app's strategy keys of a cell: its strategy at server rate `server_rate` (0: none, for a strategy
    without one), FedProx at the study's mu."""
    mu = study.proximal_mu if strategy == "fedprox" else DEFAULT_PROXIMAL_MU
    return StrategyConfig(name=strategy, server_learning_rate=server_rate, proximal_mu=mu)


def run_config(study: Study, cell: Cell, rate: float, validation: bool | None = None,
               server_rate: float = 0.0) -> RunConfig:
    """The app's run config of a cell at its optimizer's rate `rate` and its strategy's server rate
    `server_rate` (0: a strategy without one), evaluated on the validation split when `validation` (default:
    the study's --validation); client evaluation off: the study evaluates the global model."""
    partition = cell.partition
    partitioner = ("iid" if partition in ("iid", "central") else "natural" if partition == "natural"
                   else "pathological" if partition.startswith("classes=") else "dirichlet")
    dataset, root, path = data_source(study)
    held_out = study.validation if validation is None else validation
    data = DataConfig(
        dataset=dataset, root=root, path=path, partitioner=partitioner,
        beta=float(partition) if partitioner == "dirichlet" else 0.5,
        classes_per_client=int(partition.split("=")[1]) if partitioner == "pathological" else 2,
        site_file=study.site_file if partitioner == "natural" else "",
        validation_fraction=VALIDATION_FRACTION if held_out else 0.0,
    )
    config = RunConfig(
        num_server_rounds=study.rounds, seed=cell.seed, device=study.device, fraction_evaluate=0.0,
        network=NetworkConfig(name=study.model, norm=study.norm),
        privacy=PrivacyConfig(
            mechanism=cell.mechanism, target_epsilon=cell.epsilon if math.isfinite(cell.epsilon) else 1.0,
            delta=PAPER_DELTA, alpha=study.alpha, max_grad_norm=study.max_grad_norm,
            dirichlet_weighting=study.dirichlet_weighting, dirichlet_weight_cap=study.dirichlet_weight_cap,
        ),
        local=LocalTrainingConfig(batch_size=study.batch_size, epochs=study.local_epochs,
                                  class_weighting=study.class_weighting, class_weight_cap=study.class_weight_cap,
                                  logit_adjustment=study.logit_adjustment),
        output=OutputConfig(results_dir=""), data=data,
        lr=LearningRateConfig(optimizer=cell.optimizer, rate=rate, mode=study.learning_rate_mode,
                              warmup_rounds=study.warmup_rounds),
        strategy=strategy_config(study, cell.strategy, server_rate),
    )
    config.validate()
    return config


def client_floor(config: RunConfig, clients: int) -> float:
    """The largest Theorem 10 floor over the run's clients that can train (each has its own q and T); a
    client whose shard is not larger than the batch sits out, as in the app (too_small_to_train)."""
    split = federated_split(config.split_spec(clients))
    sitting_out = too_small_to_train(config, split)
    floors = []
    for partition_id, part in enumerate(split.train_parts):
        if partition_id in sitting_out:
            continue
        spec = mechanism_spec(config, partition_id, len(part), config.privacy.target_epsilon_for(partition_id, clients))
        floors.append(epsilon_floor(spec.sample_rate, spec.planned_steps, PAPER_DELTA).epsilon)
    if not floors:
        raise ValueError(f"--batch-size={config.local.batch_size}: no client of this partition holds more "
                         "examples than a batch, so none can train; lower --batch-size or --num-clients")
    return max(floors)


def check(study: Study) -> None:
    """Raise a one-line ValueError, before any training, for a grid that cannot run: more clients than
    training examples, a partition that cannot be drawn, or a Dirichlet eps at or below some client's
    Theorem 10 floor for the planned steps (each client's q and T; the largest floor is named). Tuning
    runs train on the 80 % left by the validation split, so that split is checked too when a rate is tuned."""
    dataset, root, path = data_source(study)
    data = load_dataset(dataset, root or None, data_path=path or None)
    held_out = study.validation or bool(tuned_mechanisms(study))
    examples = int(data.train_y.shape[0] * (1 - VALIDATION_FRACTION if held_out else 1))
    if study.num_clients > examples:
        raise ValueError(f"--num-clients={study.num_clients} is above the {examples} training examples of "
                         f"{data.name}; give at most {examples}")
    for validation in sorted({study.validation, held_out}):
        for partition in study.partitions:
            for seed in study.seeds:
                _check_cell(study, Cell(partition, "dirichlet", max(study.epsilons, default=1.0), seed), validation)


def _check_cell(study: Study, cell: Cell, validation: bool) -> None:
    config = run_config(study, cell, 1.0, validation)
    clients = clients_of(study, cell.partition)
    _split(config, clients)
    if any(mechanism_class(mechanism).has_epsilon_floor for mechanism in study.mechanisms):
        floor = client_floor(config, clients)
        low = min(study.epsilons)
        if low <= floor:
            raise ValueError(f"--epsilons: eps={low:g} is at or below the Theorem 10 floor {floor:.6g} "
                             f"(delta={PAPER_DELTA:g}) of partition {cell.partition}, seed {cell.seed}, for "
                             f"{study.rounds} rounds x {study.local_epochs:g} local epochs; give eps > "
                             f"{floor:.6g} or plan fewer steps")


def _split(config: RunConfig, clients: int) -> FederatedSplit:
    """The cell's federated split; a partition that cannot be drawn is a ValueError naming --betas."""
    try:
        return federated_split(config.split_spec(clients))
    except ValueError as error:
        raise ValueError(f"--betas/--num-clients: partition {config.data.partitioner} cannot be drawn "
                         f"({' '.join(str(error).split())})") from None
