"""The audit experiment's models (sims/audit/experiment.py): who trains on what, and one model per job.

The split of the training set. One fixed random pool of `candidates` examples (the same in every seed,
so that one set of reference models serves every seed); in each seed every candidate joins the
members by an independent fair coin. The rest (never a candidate) feeds the extra training examples,
the control's training set (as large as members + extra), the validation split the rates are chosen
on, and RMIA's population; the last two are never trained on. Every model is trained centrally with
the client's trainer (client/training.private_trainer) and the mechanism from privacy.registry.build_mechanism.
Jobs run in `--workers` spawned single-threaded processes.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context

import numpy as np
import torch

from client.training import PoissonBatches, private_trainer
from dirichlet_fl.data.image_data import ImageData
from dirichlet_fl.data.loaders import load_dataset
from dirichlet_fl.metrics import evaluate
from dirichlet_fl.models.networks import build_model
from privacy.attenuation import S_Y_FOR_LEARNING_RATE
from privacy.audit.attacks import per_example_losses
from privacy.mechanisms import MechanismSpec, loss_weighting
from privacy.registry import build_mechanism
from sims.audit.config import CONTROL, Arm, ExperimentConfig

POOL_SEED = 0
REFERENCE_SEED = 1_000_003
TUNING_SEED = 2_000_003
"""Seeds of the fixed candidate pool, of the reference models and of the tuning models (never a target seed)."""


@dataclass(frozen=True)
class CandidateSplit:
    """Indices into the training split: the pool and its coins (True = member), extra training data,
    the control's data, the validation split and the RMIA population (the last two never trained on)."""

    pool: np.ndarray
    coins: np.ndarray
    extra: np.ndarray
    control_train: np.ndarray
    validation: np.ndarray
    population: np.ndarray

    @property
    def members(self) -> np.ndarray:
        return self.pool[self.coins]

    @property
    def nonmembers(self) -> np.ndarray:
        return self.pool[~self.coins]


def candidate_split(num_train: int, config: ExperimentConfig, seed: int) -> CandidateSplit:
    """The fixed pool (POOL_SEED) with this seed's coins; the rest feeds extra and control from its front,
    population and validation from its back."""
    order = np.random.default_rng(POOL_SEED).permutation(num_train)
    pool, rest = order[: config.candidates], order[config.candidates :]
    coins = np.random.default_rng([seed, 0]).random(config.candidates) < 0.5
    population_start = len(rest) - config.candidates // 2
    return CandidateSplit(
        pool=pool,
        coins=coins,
        extra=rest[: config.extra_train],
        control_train=rest[: int(coins.sum()) + config.extra_train],
        validation=rest[population_start - config.validation : population_start],
        population=rest[population_start:],
    )


def reference_mask(config: ExperimentConfig, reference: int) -> np.ndarray:
    """Which pool candidates reference model `reference` trains on: an independent fair coin each."""
    return np.random.default_rng([REFERENCE_SEED, reference]).random(config.candidates) < 0.5


def reference_arm(arm: Arm) -> Arm:
    """The arm whose reference models calibrate `arm`'s scores: the control is scored like `none`."""
    return Arm("none", "none", math.inf) if arm.name == CONTROL else arm


@dataclass(frozen=True)
class Setting:
    """How an arm trains: its SGD rate and DP-SGD's clip norm C. `effective`: the rate is that of a plain
    step, which Mechanism.step_rate turns into the mechanism's (Dirichlet: / kappa(s_y = 0.9)); otherwise
    the optimizer runs at `rate` itself (a rate given with --rate)."""

    rate: float
    clip: float
    effective: bool


@dataclass(frozen=True)
class Job:
    """One model to train: a target (seed), reference model number `reference` of an arm, or a tuning
    model (`tuning`: trained on non-candidates, scored on the validation split)."""

    arm: Arm
    seed: int
    setting: Setting
    reference: int | None = None
    tuning: bool = False

    @property
    def key(self) -> str:
        if self.tuning:
            return f"tune_{self.arm.name}_lr{self.setting.rate:g}_C{self.setting.clip:g}"
        if self.reference is not None:
            return f"{self.arm.name}_ref{self.reference}"
        return f"{self.arm.name}_seed{self.seed}"


@dataclass(frozen=True)
class TrainedModel:
    """A trained model's claim, its accuracy (test for targets and references, validation for tuning
    models) and the losses of the pool and the population under it (empty for tuning models)."""

    job: Job
    claimed_eps: float
    test_accuracy: float | None
    validation_accuracy: float | None
    learning_rate: float
    noise: dict[str, float]
    pool_losses: np.ndarray
    population_losses: np.ndarray
    seconds: float


@functools.lru_cache(maxsize=1)
def load_experiment_data(dataset: str, data_root: str | None) -> ImageData:
    return load_dataset(dataset, data_root)


def training_index(config: ExperimentConfig, split: CandidateSplit, job: Job) -> np.ndarray:
    """What the job trains on: tuning models and the control on non-candidates, references on their half
    of the pool, targets on the seed's members; all of them plus the extra examples."""
    if job.tuning or job.arm.name == CONTROL:
        return split.control_train
    if job.reference is not None:
        return np.concatenate([split.pool[reference_mask(config, job.reference)], split.extra])
    return np.concatenate([split.members, split.extra])


def _identity(job: Job) -> list[int]:
    """The seed material of a job's initial model and sampling: the same start in every arm."""
    if job.tuning:
        return [TUNING_SEED, job.seed]
    return [job.seed] if job.reference is None else [REFERENCE_SEED, job.reference]


def train_job(config: ExperimentConfig, job: Job) -> TrainedModel:
    """Train one model and measure its accuracy and (unless it is a tuning model) the pool's and the
    population's losses."""
    started = time.monotonic()
    data = load_experiment_data(config.dataset, config.data_root)
    split = candidate_split(len(data.train_y), config, job.seed)
    index = torch.as_tensor(training_index(config, split, job))
    mechanism = build_mechanism(MechanismSpec(
        name=job.arm.mechanism,
        target_epsilon=job.arm.epsilon if math.isfinite(job.arm.epsilon) else config.epsilons[0],
        delta=config.delta, sample_rate=config.sample_rate, planned_steps=config.steps, alpha=config.alpha,
        max_grad_norm=job.setting.clip, num_examples=len(index),
        loss_weighting=loss_weighting(job.arm.weighting, S_Y_FOR_LEARNING_RATE, config.weight_cap),
    ))
    identity = _identity(job)
    torch.manual_seed(int(np.random.SeedSequence(identity).generate_state(1)[0]))
    model = build_model(config.model, data.in_channels, data.num_classes, data.image_size, norm=config.norm)
    rate = job.setting.rate
    if job.setting.effective and config.optimizer == "sgd":
        rate = mechanism.step_rate(rate, S_Y_FOR_LEARNING_RATE)
    trainer = private_trainer(mechanism, model, config.optimizer, rate)
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([*identity, 1]).generate_state(1)[0]))
    trainer.train(PoissonBatches(data.train_x[index], data.train_y[index], generator), config.steps)
    if job.arm.name == CONTROL or job.tuning:
        claimed = 0.0
    else:
        claimed = mechanism.epsilon(config.delta) if mechanism.private else math.inf
    pool, population = torch.as_tensor(split.pool), torch.as_tensor(split.population)
    validation = torch.as_tensor(split.validation)
    return TrainedModel(
        job=job, claimed_eps=claimed,
        test_accuracy=None if job.tuning else evaluate(model, data.test_x, data.test_y)[1],
        validation_accuracy=evaluate(model, data.train_x[validation], data.train_y[validation])[1]
        if job.tuning else None,
        learning_rate=rate, noise=mechanism.parameters(),
        pool_losses=np.zeros(0) if job.tuning else per_example_losses(model, data.train_x[pool], data.train_y[pool]),
        population_losses=np.zeros(0) if job.tuning else per_example_losses(
            model, data.train_x[population], data.train_y[population]),
        seconds=time.monotonic() - started,
    )


def _single_threaded() -> None:
    torch.set_num_threads(1)


def run_jobs(
    config: ExperimentConfig, planned: list[Job], log: Callable[[str], None] = print
) -> dict[str, TrainedModel]:
    """Train every job, logged as it finishes: in `workers` spawned single-threaded processes, or in this
    process (torch's thread setting untouched) when workers is 1. Keyed by Job.key."""
    done: dict[str, TrainedModel] = {}
    if config.workers == 1:
        for job in planned:
            done[job.key] = train_job(config, job)
            _log_model(log, done[job.key], len(done), len(planned))
        return done
    with ProcessPoolExecutor(config.workers, mp_context=get_context("spawn"), initializer=_single_threaded) as pool:
        futures = [pool.submit(train_job, config, job) for job in planned]
        for future in as_completed(futures):
            model = future.result()
            done[model.job.key] = model
            _log_model(log, model, len(done), len(planned))
    return done


def _log_model(log: Callable[[str], None], model: TrainedModel, done: int, total: int) -> None:
    measured = (f"validation accuracy {model.validation_accuracy:.4f}" if model.test_accuracy is None
                else f"test accuracy {model.test_accuracy:.4f}")
    log(f"[{done}/{total}] {model.job.key}: {measured}, lr {model.learning_rate:.4g}, {model.seconds:.0f} s")
