"""The audit experiment (`dirichlet-fl audit-experiment`): does a model claimed at eps leak like eps?

For each seed: draw a random pool of candidates from the training split and assign each at random to
members or non-members (a random balanced assignment, so the audit is a valid DP lower bound: a
candidate's membership is independent of everything but the coin). Train one model centrally per
mechanism (one client holding the members, plus optional extra non-candidate examples) with the shared
loop client/training.train_locally and the mechanism from privacy.mechanisms.build_mechanism, and a
CONTROL model (no privacy) on non-candidates only, which never sees a candidate: its true eps with
respect to the candidates is exactly 0, so its bound shows the audit's false-alarm level.

The audit is privacy.audit's loss-threshold attack: threshold chosen on one random half of the
candidates, rates measured on the other half with Clopper-Pearson bounds. Per seed, and pooled over
seeds (second-half counts summed before Clopper-Pearson). Learning rates: `--learning-rate` is the
non-private SGD rate (no privacy and control); the Dirichlet mechanism trains at learning-rate / kappa
(the effective-learning-rate rule of Section 3.6, kappa at s_y = 0.9), so that its steps move like the
non-private ones; DP-SGD uses `--dpsgd-learning-rate` on its sum / expected-batch gradient.

Jobs (seed x arm) run in `--workers` processes with one torch thread each (on 2 cores, two
single-threaded processes are several times faster than one process with two threads). The defaults
(mnist-idx on the t10k files, 5 seeds x 3 mechanisms + control, T = 4000, 500 members) took 14.3 min
on 2 CPU cores shared with other work; `--quick` (2 seeds, T = 1000) takes about 2 min.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from client.training import make_optimizer, train_locally
from dirichlet_fl.data import ImageData, load_dataset
from dirichlet_fl.models import build_model
from dirichlet_fl.task import evaluate
from privacy.analysis import private_learning_rate
from privacy.audit import AttackCounts, audit, epsilon_from_counts, per_example_losses
from privacy.mechanisms import MechanismSpec
from privacy.registry import build_mechanism, covers
from sims.audit_config import ExperimentConfig

CONTROL = "control"
CONTROL_COVERS = "the candidates never entered training: its eps with respect to them is exactly 0"
CONFIDENCE = 0.95
COUNT_KEYS = ("true_positives", "members", "false_positives", "nonmembers")
CSV_COLUMNS = [
    "arm", "seed", "claimed_eps", "delta", "test_accuracy", "auc", "tpr_at_fpr_1pct", "eps_lower_bound",
    "violation", "true_positives", "members", "false_positives", "nonmembers", "learning_rate", "noise",
    "seconds", "covers",
]


@dataclass(frozen=True)
class CandidateSplit:
    """Indices into the training split: members, non-members, extra training data, the control's data."""

    members: np.ndarray
    nonmembers: np.ndarray
    extra: np.ndarray
    control_train: np.ndarray


def candidate_split(num_train: int, config: ExperimentConfig, seed: int) -> CandidateSplit:
    """A random candidate pool, split at random into equal halves; the rest feeds extra and control data."""
    rng = np.random.default_rng([seed, 0])
    order = rng.permutation(num_train)
    pool, rest = order[: config.candidates], order[config.candidates :]
    assignment = rng.permutation(config.candidates)
    half = config.candidates // 2
    return CandidateSplit(
        members=pool[assignment[:half]],
        nonmembers=pool[assignment[half : 2 * half]],
        extra=rest[: config.extra_train],
        control_train=rest[: half + config.extra_train],
    )


@dataclass(frozen=True)
class ArmResult:
    """One trained model (seed x arm): its claim, accuracy and the candidates' losses."""

    seed: int
    arm: str
    claimed_eps: float
    test_accuracy: float
    learning_rate: float
    noise: dict[str, float]
    member_losses: np.ndarray
    nonmember_losses: np.ndarray
    seconds: float


@functools.lru_cache(maxsize=1)
def load_experiment_data(dataset: str, data_root: str | None) -> ImageData:
    return load_dataset(dataset, data_root)


def _learning_rate(arm: str, config: ExperimentConfig, noise: dict[str, float]) -> float:
    """Dirichlet with SGD: the rate whose effective rate (Theorem 11's kappa at s_y = 0.9) is the non-private
    one. Adam normalises the gradient's scale, so with Adam every non-DP-SGD arm uses the same rate."""
    if arm == "dirichlet" and config.optimizer == "sgd":
        return private_learning_rate(config.learning_rate, noise["r"], config.alpha)
    if arm == "dpsgd":
        return config.dpsgd_learning_rate
    return config.learning_rate


def train_arm(config: ExperimentConfig, seed: int, arm: str) -> ArmResult:
    """Train the model of one arm for one seed and measure its candidates' losses and test accuracy."""
    started = time.monotonic()
    data = load_experiment_data(config.dataset, config.data_root)
    split = candidate_split(len(data.train_y), config, seed)
    train_index = split.control_train if arm == CONTROL else np.concatenate([split.members, split.extra])
    inputs, labels = data.train_x[torch.as_tensor(train_index)], data.train_y[torch.as_tensor(train_index)]
    mechanism = build_mechanism(
        MechanismSpec(
            name="none" if arm == CONTROL else arm,
            target_epsilon=config.epsilon,
            delta=config.delta,
            sample_rate=config.sample_rate,
            planned_steps=config.steps,
            alpha=config.alpha,
            max_grad_norm=config.max_grad_norm,
            num_examples=len(train_index),
        )
    )
    torch.manual_seed(seed)  # the same initial weights in every arm of a seed
    model = build_model(config.model, data.in_channels, data.num_classes, data.image_size)
    learning_rate = _learning_rate(arm, config, mechanism.parameters())
    wrapped, optimizer = mechanism.wrap(model, make_optimizer(config.optimizer, model, learning_rate))
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 1]).generate_state(1)[0]))
    train_locally(wrapped, optimizer, mechanism, inputs, labels, config.steps, config.sample_rate, generator)
    _, accuracy = evaluate(model, data.test_x, data.test_y)
    members, nonmembers = torch.as_tensor(split.members), torch.as_tensor(split.nonmembers)
    return ArmResult(
        seed=seed,
        arm=arm,
        claimed_eps=0.0 if arm == CONTROL else mechanism.epsilon(config.delta),
        test_accuracy=accuracy,
        learning_rate=learning_rate,
        noise=mechanism.parameters(),
        member_losses=per_example_losses(model, data.train_x[members], data.train_y[members]),
        nonmember_losses=per_example_losses(model, data.train_x[nonmembers], data.train_y[nonmembers]),
        seconds=time.monotonic() - started,
    )


def _single_threaded() -> None:
    torch.set_num_threads(1)


def run_arms(config: ExperimentConfig, log: Callable[[str], None] = print) -> list[ArmResult]:
    """Every (seed, arm) job, logged as it finishes: in `workers` spawned single-threaded processes, or in
    this process (torch's thread setting untouched) when workers is 1."""
    jobs = [(seed, arm) for seed in config.seeds for arm in (*config.mechanisms, CONTROL)]
    results = []
    if config.workers == 1:
        for seed, arm in jobs:
            results.append(train_arm(config, seed, arm))
            _log_result(log, results[-1], len(results), len(jobs))
        return results
    with ProcessPoolExecutor(config.workers, mp_context=get_context("spawn"), initializer=_single_threaded) as pool:
        futures = [pool.submit(train_arm, config, seed, arm) for seed, arm in jobs]
        for future in as_completed(futures):
            results.append(future.result())
            _log_result(log, results[-1], len(results), len(jobs))
    return sorted(results, key=lambda result: (result.seed, jobs.index((result.seed, result.arm))))


def _log_result(log: Callable[[str], None], result: ArmResult, done: int, total: int) -> None:
    log(
        f"[{done}/{total}] seed {result.seed} {result.arm}: test accuracy {result.test_accuracy:.4f}, "
        f"lr {result.learning_rate:.4g}, {result.seconds:.0f} s"
    )


def _covers(arm: str) -> str:
    return CONTROL_COVERS if arm == CONTROL else covers(arm)


def audit_rows(config: ExperimentConfig, results: list[ArmResult]) -> list[dict[str, object]]:
    """Per arm: one row per seed, then a pooled row (held-out counts summed over seeds before Clopper-Pearson)."""
    rows = []
    for arm in (*config.mechanisms, CONTROL):
        arm_rows = [_seed_row(config, result) for result in results if result.arm == arm]
        pooled_counts = functools.reduce(
            lambda total, counts: total + counts,
            (AttackCounts(*(row[key] for key in COUNT_KEYS)) for row in arm_rows),
        )
        pooled = {
            **arm_rows[0],
            "seed": "pooled",
            "claimed_eps": max(row["claimed_eps"] for row in arm_rows),
            **{key: float(np.mean([row[key] for row in arm_rows])) for key in ("test_accuracy", "auc", "tpr_at_fpr_1pct")},
            "eps_lower_bound": epsilon_from_counts(pooled_counts, config.delta, CONFIDENCE),
            **asdict(pooled_counts),
            "seconds": round(sum(row["seconds"] for row in arm_rows), 1),
        }
        pooled["violation"] = pooled["eps_lower_bound"] > pooled["claimed_eps"]
        rows += arm_rows + [pooled]
    return rows


def _seed_row(config: ExperimentConfig, result: ArmResult) -> dict[str, object]:
    """The audit of one trained model, with its halves drawn per seed (the same halves in every arm)."""
    report = audit(
        -result.member_losses,
        -result.nonmember_losses,
        claimed_eps=result.claimed_eps,
        delta=config.delta,
        covers=_covers(result.arm),
        rng=np.random.default_rng([result.seed, 2]),
        confidence=CONFIDENCE,
    )
    counts = report.bound.counts
    return {
        "arm": result.arm,
        "seed": result.seed,
        "claimed_eps": result.claimed_eps,
        "delta": config.delta,
        "test_accuracy": result.test_accuracy,
        "auc": report.auc,
        "tpr_at_fpr_1pct": report.tpr_at_fpr_1pct,
        "eps_lower_bound": report.eps_lower_bound,
        "violation": report.violation,
        **asdict(counts),
        "learning_rate": result.learning_rate,
        "noise": ";".join(f"{key}={value:.6g}" for key, value in result.noise.items()),
        "seconds": round(result.seconds, 1),
        "covers": report.covers,
    }


def markdown(config: ExperimentConfig, rows: list[dict[str, object]], seconds: float) -> str:
    """The tables (pooled first, then per seed), with what each claim covers and the delta."""
    header = "| arm | seed | claimed eps | test acc | AUC | TPR@1%FPR | eps lower bound | violation |\n|---|---|---|---|---|---|---|---|"

    def line(row: dict[str, object]) -> str:
        claim = "inf (none)" if math.isinf(row["claimed_eps"]) else f"{row['claimed_eps']:.3f}"
        return (
            f"| {row['arm']} | {row['seed']} | {claim} | {row['test_accuracy']:.4f} | {row['auc']:.3f} | "
            f"{row['tpr_at_fpr_1pct']:.3f} | {row['eps_lower_bound']:.3f} | {'YES' if row['violation'] else 'no'} |"
        )

    pooled = [line(row) for row in rows if row["seed"] == "pooled"]
    per_seed = [line(row) for row in rows if row["seed"] != "pooled"]
    covers = [f"- {arm}: {_covers(arm)}" for arm in (*config.mechanisms, CONTROL)]
    return "\n".join([
        f"# Membership audit: models claimed at eps={config.epsilon:g} (delta={config.delta:g})",
        "",
        f"{config.dataset}, {config.candidates} candidates per seed (half members at random), "
        f"{config.extra_train} extra training examples, {config.model}, q={config.sample_rate:g}, "
        f"T={config.steps}, alpha={config.alpha:g}, seeds {list(config.seeds)}; loss-threshold attack, "
        f"threshold chosen on one half, Clopper-Pearson {CONFIDENCE:.0%} on the other half; pooled rows sum "
        f"the held-out counts over seeds (AUC, TPR and accuracy: means). Every eps is at delta={config.delta:g}. "
        f"Wall time {seconds / 60:.1f} min.",
        "",
        "What each claim covers:",
        *covers,
        "",
        "## Pooled over seeds",
        "",
        header,
        *pooled,
        "",
        "## Per seed",
        "",
        header,
        *per_seed,
        "",
    ])


def write_outputs(
    out: Path, config: ExperimentConfig, results: list[ArmResult], rows: list[dict[str, object]], seconds: float
) -> None:
    """config.json, results.csv, results.md and losses.npz (every candidate's loss, for re-analysis)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**asdict(config), "wall_seconds": round(seconds, 1)}, indent=2) + "\n")
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    (out / "results.md").write_text(markdown(config, rows, seconds))
    np.savez_compressed(
        out / "losses.npz",
        **{f"{r.arm}_seed{r.seed}_{side}": getattr(r, f"{side}_losses") for r in results for side in ("member", "nonmember")},
    )
