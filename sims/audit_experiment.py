"""The audit experiment (`dirichlet-fl audit-experiment`): does a model claimed at eps leak like eps, at
matched utility, under the strongest attacks a CPU affords?

Candidates. One fixed random pool of `candidates` training examples (the same in every seed, so that
one set of reference models serves every seed); in each seed every candidate joins the members by an
independent fair coin (Poisson-style inclusion: what one-run auditing's theorem needs, and a random
assignment, so every bound here is a valid DP lower bound). Per seed and arm (each mechanism at each
eps, `none`, and the CONTROL) one model is trained centrally with the shared loop
client/training.train_locally and the mechanism from privacy.registry.build_mechanism. The control
trains without privacy on as many NON-candidates: its true eps with respect to the candidates is 0, so
its bounds show each attack's false-alarm level, and its accuracy is the utility every arm is matched
against (privacy.audit.verdict: "no violation" only within `margin` of it, else "inconclusive").

Attacks (privacy.audit; higher score = member):
- loss: -loss of the candidate under the target (the classic threshold attack);
- lira / rmia: offline LiRA and RMIA against K reference models per arm, each trained like the
  target (same mechanism, eps and rate) on a random half of the pool (its own coins), never on the
  seed's members as such; RMIA compares with a population of candidates/2 examples no model trains on;
- one-run <attack>: Steinke, Nasr and Jagielski (2023) on the same scores: guess "in" for the k
  highest and "out" for the k lowest of the coin-flipped candidates, k a fixed fraction of them
  (privacy.audit.one_run: Bonferroni over the fractions), bound at 95%.
The split-half attacks (loss, lira, rmia) choose a threshold on one random half of the candidates and
measure it on the other with Clopper-Pearson 95% bounds; pooled rows sum the held-out counts over
seeds. Pooled one-run rows sum the guesses over the independent seeds (each seed's delta term counted).
How K moves LiRA's and RMIA's bound is measured on the same models by using only the first K' references.

Learning rates (`--rate ARM=RATE,...`): given per arm (e.g. dirichlet-eps1=0.7) or per mechanism
(dirichlet=0.7); Dirichlet's default is Section 3.6's rule, the non-private rate / kappa(s_y = 0.9)
at its r, so that its steps move like the non-private ones (with Adam every non-DP-SGD arm uses the
non-private rate). Jobs run in `--workers` single-threaded processes.
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

from client.training import PoissonBatches, make_optimizer, train_locally
from dirichlet_fl.data import ImageData, load_dataset
from dirichlet_fl.models import build_model
from dirichlet_fl.task import evaluate
from privacy.analysis import private_learning_rate
from privacy.audit.attacks import lira_offline_scores, per_example_losses, rmia_offline_scores
from privacy.audit.one_run import one_run_bound, one_run_counts
from privacy.audit.plot import plot_roc
from privacy.audit.report import audit_scores
from privacy.audit.statistics import CONFIDENCE, AttackCounts, epsilon_from_counts
from privacy.audit.verdict import verdict
from privacy.mechanisms import MechanismSpec
from privacy.registry import build_mechanism, covers
from sims.audit_config import CONTROL, Arm, ExperimentConfig

CONTROL_COVERS = "the candidates never entered training: its eps with respect to them is exactly 0"
POOL_SEED = 0
REFERENCE_SEED = 1_000_003
"""Seeds of the fixed candidate pool and of the reference models' halves and training (never a target seed)."""
COUNT_KEYS = ("true_positives", "members", "false_positives", "nonmembers")
ONE_RUN_KEYS = ("guesses", "correct", "canaries")
CSV_COLUMNS = [
    "arm", "seed", "attack", "claimed_eps", "delta", "test_accuracy", "control_accuracy", "auc",
    "tpr_at_fpr_1pct", "tpr_at_fpr_01pct", "eps_lower_bound", "confidence", "verdict", "reason",
    *COUNT_KEYS, *ONE_RUN_KEYS, "learning_rate", "noise", "seconds", "covers",
]


@dataclass(frozen=True)
class CandidateSplit:
    """Indices into the training split: the pool and its coins (True = member), extra training data,
    the control's data and the RMIA population (never trained on by any model)."""

    pool: np.ndarray
    coins: np.ndarray
    extra: np.ndarray
    control_train: np.ndarray
    population: np.ndarray

    @property
    def members(self) -> np.ndarray:
        return self.pool[self.coins]

    @property
    def nonmembers(self) -> np.ndarray:
        return self.pool[~self.coins]


def candidate_split(num_train: int, config: ExperimentConfig, seed: int) -> CandidateSplit:
    """The fixed pool (POOL_SEED) with this seed's coins; the rest feeds extra, control and population."""
    order = np.random.default_rng(POOL_SEED).permutation(num_train)
    pool, rest = order[: config.candidates], order[config.candidates :]
    coins = np.random.default_rng([seed, 0]).random(config.candidates) < 0.5
    return CandidateSplit(
        pool=pool,
        coins=coins,
        extra=rest[: config.extra_train],
        control_train=rest[: int(coins.sum()) + config.extra_train],
        population=rest[len(rest) - config.candidates // 2 :],
    )


def reference_mask(config: ExperimentConfig, reference: int) -> np.ndarray:
    """Which pool candidates reference model `reference` trains on: an independent fair coin each."""
    return np.random.default_rng([REFERENCE_SEED, reference]).random(config.candidates) < 0.5


def reference_arm(arm: Arm) -> Arm:
    """The arm whose reference models calibrate `arm`'s scores: the control is scored like `none`."""
    return Arm("none", "none", math.inf) if arm.name == CONTROL else arm


@dataclass(frozen=True)
class Job:
    """One model to train: a target (seed) or reference model number `reference` of an arm."""

    arm: Arm
    seed: int
    reference: int | None = None

    @property
    def key(self) -> str:
        return f"{self.arm.name}_{'seed' if self.reference is None else 'ref'}{self.seed if self.reference is None else self.reference}"


@dataclass(frozen=True)
class TrainedModel:
    """A trained model's claim, accuracy and the losses of the pool and the population under it."""

    job: Job
    claimed_eps: float
    test_accuracy: float
    learning_rate: float
    noise: dict[str, float]
    pool_losses: np.ndarray
    population_losses: np.ndarray
    seconds: float


@functools.lru_cache(maxsize=1)
def load_experiment_data(dataset: str, data_root: str | None) -> ImageData:
    return load_dataset(dataset, data_root)


def learning_rate(config: ExperimentConfig, arm: Arm, noise: dict[str, float]) -> float:
    """The arm's rate as given (ExperimentConfig.explicit_rate), else for Dirichlet with SGD the rate whose
    effective rate (Theorem 11's kappa at s_y = 0.9) is the non-private one, else the non-private rate."""
    given = config.explicit_rate(arm)
    if given is not None:
        return given
    base = config.explicit_rate(Arm("none", "none", math.inf))
    if base is None:
        raise ValueError(f"--rate gives no rate for {arm.name} and none for `none` to derive it from")
    if arm.mechanism == "dirichlet" and config.optimizer == "sgd":
        return private_learning_rate(base, noise["r"], config.alpha)
    return base


def _training_index(config: ExperimentConfig, split: CandidateSplit, job: Job) -> np.ndarray:
    if job.reference is not None:
        return np.concatenate([split.pool[reference_mask(config, job.reference)], split.extra])
    if job.arm.name == CONTROL:
        return split.control_train
    return np.concatenate([split.members, split.extra])


def train_job(config: ExperimentConfig, job: Job) -> TrainedModel:
    """Train one model and measure its test accuracy and the pool's and population's losses."""
    started = time.monotonic()
    data = load_experiment_data(config.dataset, config.data_root)
    split = candidate_split(len(data.train_y), config, job.seed)
    index = torch.as_tensor(_training_index(config, split, job))
    mechanism = build_mechanism(
        MechanismSpec(
            name=job.arm.mechanism,
            target_epsilon=job.arm.epsilon if math.isfinite(job.arm.epsilon) else config.epsilons[0],
            delta=config.delta,
            sample_rate=config.sample_rate,
            planned_steps=config.steps,
            alpha=config.alpha,
            max_grad_norm=config.max_grad_norm,
            num_examples=len(index),
        )
    )
    identity = [job.seed] if job.reference is None else [REFERENCE_SEED, job.reference]
    torch.manual_seed(int(np.random.SeedSequence(identity).generate_state(1)[0]))  # same start in every arm
    model = build_model(config.model, data.in_channels, data.num_classes, data.image_size, norm=config.norm)
    rate = learning_rate(config, job.arm, mechanism.parameters())
    wrapped, optimizer = mechanism.wrap(model, make_optimizer(config.optimizer, model, rate))
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([*identity, 1]).generate_state(1)[0]))
    train_locally(wrapped, optimizer, mechanism, PoissonBatches(data.train_x[index], data.train_y[index], generator),
                  config.steps)
    _, accuracy = evaluate(model, data.test_x, data.test_y)
    pool, population = torch.as_tensor(split.pool), torch.as_tensor(split.population)
    if job.arm.name == CONTROL:
        claimed = 0.0
    else:
        claimed = mechanism.epsilon(config.delta) if job.arm.mechanism != "none" else math.inf
    return TrainedModel(
        job=job,
        claimed_eps=claimed,
        test_accuracy=accuracy,
        learning_rate=rate,
        noise=mechanism.parameters(),
        pool_losses=per_example_losses(model, data.train_x[pool], data.train_y[pool]),
        population_losses=per_example_losses(model, data.train_x[population], data.train_y[population]),
        seconds=time.monotonic() - started,
    )


def jobs(config: ExperimentConfig) -> list[Job]:
    """Every target (seed x arm), then every reference model (K per calibrating arm)."""
    arms = config.arms()
    targets = [Job(arm, seed) for seed in config.seeds for arm in arms]
    calibrating = list(dict.fromkeys(reference_arm(arm) for arm in arms))
    references = [Job(arm, 0, k) for k in range(config.references) for arm in calibrating]
    return targets + references


def _single_threaded() -> None:
    torch.set_num_threads(1)


def run_jobs(config: ExperimentConfig, log: Callable[[str], None] = print) -> dict[str, TrainedModel]:
    """Train every job, logged as it finishes: in `workers` spawned single-threaded processes, or in this
    process (torch's thread setting untouched) when workers is 1. Keyed by Job.key."""
    planned = jobs(config)
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
    log(f"[{done}/{total}] {model.job.key}: test accuracy {model.test_accuracy:.4f}, lr {model.learning_rate:.4g}, "
        f"{model.seconds:.0f} s")


def _covers(arm: Arm) -> str:
    return CONTROL_COVERS if arm.name == CONTROL else covers(arm.mechanism)


def _confidence(losses: np.ndarray) -> np.ndarray:
    """softmax[y] from the float64 cross-entropy: exp(-loss)."""
    return np.exp(-np.asarray(losses, dtype=np.float64))


def attack_scores(
    config: ExperimentConfig, models: dict[str, TrainedModel], arm: Arm, seed: int, references: int | None = None
) -> dict[str, np.ndarray]:
    """Each attack's scores on the pool for the target (arm, seed), using the first `references` reference
    models (default all); LiRA and RMIA only when there are at least two."""
    target = models[Job(arm, seed).key]
    scores = {"loss": -target.pool_losses}
    count = config.references if references is None else references
    if count < 2:
        return scores
    calibrating = reference_arm(arm)
    refs = [models[Job(calibrating, 0, k).key] for k in range(count)]
    in_mask = np.stack([reference_mask(config, k) for k in range(count)])
    pool_confidence = np.stack([_confidence(ref.pool_losses) for ref in refs])
    scores["lira"] = lira_offline_scores(_confidence(target.pool_losses), pool_confidence, in_mask)
    population_confidence = np.stack([_confidence(ref.population_losses) for ref in refs])
    n, m = len(target.pool_losses), len(target.population_losses)
    scores["rmia"] = rmia_offline_scores(
        np.concatenate([_confidence(target.pool_losses), _confidence(target.population_losses)]),
        np.concatenate([pool_confidence, population_confidence], axis=1),
        np.concatenate([in_mask, np.zeros((count, m), dtype=bool)], axis=1),
        population=np.arange(n, n + m),
    )[:n]
    return scores


def _verdict(config: ExperimentConfig, row: dict[str, object]) -> dict[str, object]:
    label, reason = verdict(
        float(row["eps_lower_bound"]), float(row["claimed_eps"]), float(row["test_accuracy"]),
        float(row["control_accuracy"]), config.margin,
    )
    return {"verdict": label, "reason": reason}


def seed_rows(config: ExperimentConfig, models: dict[str, TrainedModel], arm: Arm, seed: int) -> list[dict[str, object]]:
    """One row per attack for the target (arm, seed); the halves are drawn per seed (the same in every arm)."""
    num_train = len(load_experiment_data(config.dataset, config.data_root).train_y)
    coins = candidate_split(num_train, config, seed).coins
    target = models[Job(arm, seed).key]
    base = {
        "arm": arm.name, "seed": seed, "claimed_eps": target.claimed_eps, "delta": config.delta,
        "test_accuracy": target.test_accuracy,
        "control_accuracy": models[Job(Arm(CONTROL, "none", math.inf), seed).key].test_accuracy,
        "confidence": CONFIDENCE, "learning_rate": target.learning_rate,
        "noise": ";".join(f"{key}={value:.6g}" for key, value in target.noise.items()),
        "seconds": round(target.seconds, 1), "covers": _covers(arm),
    }
    rows = []
    for name, scores in attack_scores(config, models, arm, seed).items():
        report = audit_scores(scores, coins, claimed_eps=target.claimed_eps, delta=config.delta,
                              rng=np.random.default_rng([seed, 2]), covers=_covers(arm), confidence=CONFIDENCE)
        row = {**base, "attack": name, "auc": report.auc, "tpr_at_fpr_1pct": report.tpr_at_fpr_1pct,
               "tpr_at_fpr_01pct": report.tpr_at_fpr_01pct, "eps_lower_bound": report.eps_lower_bound,
               **asdict(report.bound.counts)}
        rows.append({**row, **_verdict(config, row)})
        counts = one_run_counts(scores, coins)
        bound, best = one_run_bound(counts, config.delta, CONFIDENCE)
        one_run = {**row, "attack": f"one-run {name}", "eps_lower_bound": bound, **asdict(best),
                   **{key: "" for key in COUNT_KEYS}}
        rows.append({**one_run, **_verdict(config, one_run), "one_run_counts": counts})
    return rows


def pooled_row(config: ExperimentConfig, rows: list[dict[str, object]]) -> dict[str, object]:
    """One attack of one arm pooled over seeds: summed held-out counts (split-half) or summed guesses
    (one-run) under one bound; accuracy, AUC and TPR are means."""
    first = rows[0]
    pooled = {
        **first,
        "seed": "pooled",
        "claimed_eps": max(float(row["claimed_eps"]) for row in rows),
        **{key: float(np.mean([float(row[key]) for row in rows]))
           for key in ("test_accuracy", "control_accuracy", "auc", "tpr_at_fpr_1pct", "tpr_at_fpr_01pct")},
        "seconds": round(sum(float(row["seconds"]) for row in rows), 1),
    }
    if str(first["attack"]).startswith("one-run"):
        per_rule = zip(*(row["one_run_counts"] for row in rows))
        summed = [functools.reduce(lambda a, b: a + b, counts) for counts in per_rule]
        bound, best = one_run_bound(summed, config.delta, CONFIDENCE)
        pooled.update(eps_lower_bound=bound, **asdict(best), one_run_counts=summed)
    else:
        counts = functools.reduce(lambda a, b: a + b, (AttackCounts(*(int(row[key]) for key in COUNT_KEYS)) for row in rows))
        pooled.update(eps_lower_bound=epsilon_from_counts(counts, config.delta, CONFIDENCE), **asdict(counts))
    return {**pooled, **_verdict(config, pooled)}


def audit_rows(config: ExperimentConfig, models: dict[str, TrainedModel]) -> list[dict[str, object]]:
    """Per arm and attack: one row per seed, then the pooled row."""
    rows = []
    for arm in config.arms():
        per_seed = [row for seed in config.seeds for row in seed_rows(config, models, arm, seed)]
        for attack in dict.fromkeys(row["attack"] for row in per_seed):
            chosen = [row for row in per_seed if row["attack"] == attack]
            rows += chosen + [pooled_row(config, chosen)]
    return rows


def reference_sweep(config: ExperimentConfig, models: dict[str, TrainedModel]) -> list[dict[str, object]]:
    """How K moves the pooled LiRA and RMIA bounds: the same targets scored with the first K' references."""
    sweep = sorted({k for k in (2, 4, 8, 16, 32, 64) if k < config.references} | {config.references})
    if config.references < 2:
        return []
    num_train = len(load_experiment_data(config.dataset, config.data_root).train_y)
    rows = []
    for arm in config.arms():
        for k in sweep:
            totals: dict[str, AttackCounts] = {}
            for seed in config.seeds:
                coins = candidate_split(num_train, config, seed).coins
                scores = attack_scores(config, models, arm, seed, references=k)
                for name in ("lira", "rmia"):
                    report = audit_scores(scores[name], coins, claimed_eps=math.inf, delta=config.delta,
                                          rng=np.random.default_rng([seed, 2]), confidence=CONFIDENCE)
                    totals[name] = totals[name] + report.bound.counts if name in totals else report.bound.counts
            rows.append({"arm": arm.name, "references": k,
                         **{name: epsilon_from_counts(counts, config.delta, CONFIDENCE) for name, counts in totals.items()}})
    return rows


def arm_verdicts(rows: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    """Per arm, the pooled row of its strongest attack (largest eps bound; ties: the first)."""
    strongest: dict[str, dict[str, object]] = {}
    for row in rows:
        if row["seed"] == "pooled" and (row["arm"] not in strongest
                                        or float(row["eps_lower_bound"]) > float(strongest[row["arm"]]["eps_lower_bound"])):
            strongest[str(row["arm"])] = row
    return strongest


def _claim(value: object) -> str:
    return "inf (none)" if math.isinf(float(value)) else f"{float(value):.3f}"


def markdown(config: ExperimentConfig, rows: list[dict[str, object]], sweep: list[dict[str, object]], seconds: float) -> str:
    """The tables: per arm its strongest attack's verdict, every attack pooled, K sweep, per seed."""
    header = ("| arm | seed | attack | claimed eps | acc | control acc | AUC | TPR@1%FPR | TPR@0.1%FPR | eps lower bound | verdict |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|")

    def line(row: dict[str, object]) -> str:
        return (f"| {row['arm']} | {row['seed']} | {row['attack']} | {_claim(row['claimed_eps'])} | "
                f"{float(row['test_accuracy']):.4f} | {float(row['control_accuracy']):.4f} | {float(row['auc']):.3f} | "
                f"{float(row['tpr_at_fpr_1pct']):.3f} | {float(row['tpr_at_fpr_01pct']):.3f} | "
                f"{float(row['eps_lower_bound']):.3f} | {row['verdict']} |")

    verdicts = [f"- {arm}: {row['reason']} (strongest attack: {row['attack']})" for arm, row in arm_verdicts(rows).items()]
    sweep_lines = ["| arm | K | LiRA bound | RMIA bound |", "|---|---|---|---|"] + [
        f"| {row['arm']} | {row['references']} | {row['lira']:.3f} | {row['rmia']:.3f} |" for row in sweep
    ]
    arms = config.arms()
    return "\n".join([
        f"# Membership audit at matched utility (delta={config.delta:g})",
        "",
        f"{config.dataset}, pool of {config.candidates} candidates (each a member by a fair coin per seed), "
        f"{config.extra_train} extra training examples, model {config.model} (norm {config.norm or 'default'}), "
        f"{config.optimizer}, q={config.sample_rate:g}, T={config.steps}, alpha={config.alpha:g}, seeds "
        f"{list(config.seeds)}, K={config.references} reference models per arm. Split-half attacks: threshold on one "
        f"half, Clopper-Pearson {CONFIDENCE:.0%} on the other; one-run: Steinke et al. 2023 at {CONFIDENCE:.0%}. "
        f"Pooled rows sum counts over seeds (accuracy, AUC, TPR: means). Matched utility: within "
        f"{config.margin:.0%} of the control's accuracy. Every eps is at delta={config.delta:g}. "
        f"Wall time {seconds / 60:.1f} min.",
        "",
        "Learning rates: " + ", ".join(
            f"{arm.name} {next(float(r['learning_rate']) for r in rows if r['arm'] == arm.name):.4g}" for arm in arms),
        "",
        "What each claim covers:",
        *[f"- {arm.name}: {_covers(arm)}" for arm in arms],
        "",
        "## Verdicts (strongest attack per arm, pooled)",
        "",
        *verdicts,
        "",
        "## Pooled over seeds",
        "",
        header,
        *[line(row) for row in rows if row["seed"] == "pooled"],
        "",
        "## How the number of reference models K moves the pooled bound",
        "",
        *sweep_lines,
        "",
        "## Per seed",
        "",
        header,
        *[line(row) for row in rows if row["seed"] != "pooled"],
        "",
    ])


def write_outputs(
    out: Path, config: ExperimentConfig, models: dict[str, TrainedModel], rows: list[dict[str, object]],
    sweep: list[dict[str, object]], seconds: float,
) -> None:
    """config.json, results.csv, results.md, reference_sweep.csv, losses.npz (every model's pool and
    population losses, the coins and the reference halves, for re-analysis) and audit_roc.png (first seed)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**asdict(config), "wall_seconds": round(seconds, 1)}, indent=2) + "\n")
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    with open(out / "reference_sweep.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["arm", "references", "lira", "rmia"])
        writer.writeheader()
        writer.writerows(sweep)
    (out / "results.md").write_text(markdown(config, rows, sweep, seconds))
    num_train = len(load_experiment_data(config.dataset, config.data_root).train_y)
    np.savez_compressed(
        out / "losses.npz",
        **{f"{key}_pool": model.pool_losses for key, model in models.items()},
        **{f"{key}_population": model.population_losses for key, model in models.items()},
        **{f"coins_seed{seed}": candidate_split(num_train, config, seed).coins for seed in config.seeds},
        **{f"reference_mask{k}": reference_mask(config, k) for k in range(config.references)},
    )
    seed = config.seeds[0]
    coins = candidate_split(num_train, config, seed).coins
    curves = {
        f"{arm.name} {name}": audit_scores(scores, coins, claimed_eps=math.inf, delta=config.delta,
                                           rng=np.random.default_rng([seed, 2]))
        for arm in config.arms() if arm.name != CONTROL
        for name, scores in attack_scores(config, models, arm, seed).items()
    }
    plot_roc(curves, out / "audit_roc.png", f"membership attacks, seed {seed}")
