"""The audit experiment on scikit-learn's digits, tiny: the split, the rate choice, matched-utility pooling,
the attacks and the tables."""

from __future__ import annotations

import argparse
import csv
import json
import math

import numpy as np
import pytest

from cli import audit_experiment
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import DIRICHLET_WEIGHTINGS
from privacy.attenuation import attenuation
from privacy.audit.one_run import OneRunCounts
from privacy.audit.statistics import AttackCounts, epsilon_from_counts
from privacy.mechanisms import LossWeighting, loss_weighting
from sims.audit.config import (
    CONTROL,
    DEFAULT_WEIGHT_CAP,
    WEIGHTINGS,
    Arm,
    ExperimentConfig,
    parse_rate_grids,
    parse_rates,
)
from sims.audit.experiment import pooled_row, target_jobs
from sims.audit.training import (
    Job,
    Setting,
    candidate_split,
    reference_mask,
    train_job,
    training_index,
)
from sims.audit.tuning import Choice, choose, tuning_jobs

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TINY = ["--dataset", "digits", "--candidates", "40", "--steps", "30", "--sample-rate", "0.1", "--seeds", "2",
        "--epsilon", "0.5,2", "--workers", "1", "--rate", "dpsgd=0.1", "--references", "2",
        "--mechanisms", "dirichlet,none", "--weighting", "paper", "--model", "cnn", "--validation", "200",
        "--rate-grid", "none=0.05/0.2,dirichlet=0.05/0.2"]
COUNT_KEYS = ("true_positives", "members", "false_positives", "nonmembers")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    audit_experiment.add_parser(parser.add_subparsers())
    return parser.parse_args(["audit-experiment", *argv])


def test_the_pool_is_fixed_and_each_seed_flips_a_fair_coin_per_candidate():
    config = ExperimentConfig(candidates=100, extra_train=30, validation=200)
    split = candidate_split(1000, config, seed=3)
    assert np.array_equal(split.pool, candidate_split(1000, config, seed=4).pool)
    assert not np.array_equal(split.coins, candidate_split(1000, config, seed=4).coins)
    assert len(split.members) + len(split.nonmembers) == 100 and 30 < len(split.members) < 70
    used = np.concatenate([split.pool, split.control_train, split.extra])
    assert not np.intersect1d(split.population, used).size and len(split.population) == 50
    assert not np.intersect1d(split.pool, split.control_train).size
    assert len(split.control_train) == len(split.members) + 30
    assert not np.array_equal(reference_mask(config, 0), reference_mask(config, 1))


def test_the_rates_are_chosen_on_examples_that_are_never_candidates_nor_trained_on():
    """The audit's validity: whatever a tuning model sees (its training set, its validation split) is
    disjoint from the candidates, and no model of any kind trains on the validation split."""
    config = ExperimentConfig(candidates=200, extra_train=50, validation=300, references=4, epsilons=(1.0,))
    arm = Arm("dirichlet-eps1", "dirichlet", 1.0)
    setting = Setting(0.1, 1.0, effective=True)
    config.validate(850)  # just enough: 2 x 200 + 50 + 100 (population) + 300
    for seed in range(5):
        split = candidate_split(850, config, seed)
        assert len(split.validation) == 300 and not np.intersect1d(split.validation, split.pool).size
        jobs = [Job(arm, seed, setting, tuning=True), Job(arm, seed, setting), Job(Arm(CONTROL, "none", math.inf),
                seed, setting), *(Job(arm, seed, setting, reference=k) for k in range(4))]
        for job in jobs:
            assert not np.intersect1d(training_index(config, split, job), split.validation).size
        assert not np.intersect1d(training_index(config, split, jobs[0]), split.pool).size
        assert not np.intersect1d(split.validation, split.population).size
    with pytest.raises(ValueError, match="--validation=300"):
        config.validate(849)


def test_a_dirichlet_eps_below_the_floor_is_refused_before_training():
    """q = 0.01, T = 4000, delta 1e-5: Theorem 10's floor is 0.788, so eps 0.5 cannot be calibrated."""
    with pytest.raises(ValueError, match=r"--epsilon=0.5 is unreachable .* floor of Theorem 10 .* is 0.78"):
        ExperimentConfig(epsilons=(0.5, 1.0)).validate_flags()
    ExperimentConfig(epsilons=(0.5, 1.0), steps=1000).validate_flags()  # floor 0.269
    ExperimentConfig(epsilons=(0.5,), mechanisms=("dpsgd",)).validate_flags()  # no floor for DP-SGD


def test_an_arm_picks_the_most_accurate_grid_point_and_a_given_rate_skips_the_grid():
    config = ExperimentConfig(dataset="digits", candidates=40, steps=30, sample_rate=0.1, epsilons=(0.5,),
                              model="cnn", validation=200, mechanisms=("dirichlet", "dpsgd"),
                              rates=parse_rates("dpsgd=0.3"), weightings=("paper",),
                              rate_grids=parse_rate_grids("none=0.05/0.2,dirichlet=0.05/0.4"))
    planned = tuning_jobs(config)
    assert [(job.arm.name, job.setting.rate) for job in planned] == [
        ("dirichlet-paper-eps0.5", 0.05), ("dirichlet-paper-eps0.5", 0.4), ("none", 0.05), ("none", 0.2)]
    models = {job.key: train_job(config, job) for job in planned}
    tuned = models[planned[1].key]
    assert tuned.learning_rate == pytest.approx(0.4 / attenuation(0.9, tuned.noise["r"], 3.0))
    assert tuned.test_accuracy is None and tuned.validation_accuracy is not None and tuned.pool_losses.size == 0
    choices = choose(config, models)
    best = max(planned[:2], key=lambda job: models[job.key].validation_accuracy)
    assert choices["dirichlet-paper-eps0.5"].setting == best.setting
    assert choices["dirichlet-paper-eps0.5"].source.startswith("tuned")
    assert choices[CONTROL].setting == max(planned[2:], key=lambda job: models[job.key].validation_accuracy).setting
    assert choices["dpsgd-eps0.5"].setting == Setting(0.3, 1.0, effective=False)
    assert choices["dpsgd-eps0.5"].source == "given"
    explicit = ExperimentConfig(rates=parse_rates("none=0.1,dirichlet=0.7,dirichlet-paper-eps4=0.3"),
                                epsilons=(1.0, 4.0), weightings=WEIGHTINGS)
    arms = {arm.name: arm for arm in explicit.arms()}
    names = ("dirichlet-paper-eps1", "dirichlet-paper-eps4", "dirichlet-normalized-eps4", CONTROL)
    assert [explicit.explicit_rate(arms[name]) for name in names] == [0.7, 0.3, 0.7, 0.1]


def test_each_dirichlet_loss_is_an_arm_and_the_normalised_one_trains_with_its_weighting():
    config = ExperimentConfig(dataset="digits", candidates=40, steps=30, sample_rate=0.1, epsilons=(0.5,), model="cnn",
                              validation=200, mechanisms=("dirichlet",), weightings=("paper", "normalized"))
    paper, normalized, control = config.arms()
    assert [paper.name, normalized.name, control.name] == ["dirichlet-paper-eps0.5", "dirichlet-normalized-eps0.5",
                                                           CONTROL]
    weighting = [loss_weighting(arm.weighting, 0.9, config.weight_cap) for arm in (paper, normalized, control)]
    assert weighting == [None, LossWeighting(0.9, 20.0), None]
    setting = Setting(0.1, 1.0, effective=True)
    first, second = (train_job(config, Job(arm, 0, setting)) for arm in (paper, normalized))
    assert first.claimed_eps == second.claimed_eps and first.noise == second.noise  # the loss changes no eps
    assert first.learning_rate == pytest.approx(second.learning_rate)  # both step at kappa(0.9)
    assert not np.array_equal(first.pool_losses, second.pool_losses)
    assert WEIGHTINGS == DIRICHLET_WEIGHTINGS and DEFAULT_WEIGHT_CAP == RunConfig().privacy.dirichlet_weight_cap


def test_eps_per_mechanism_and_reference_models_only_for_the_arms_asked():
    config = ExperimentConfig(epsilons=(1.0,), mechanism_epsilons=(("dirichlet", (0.5, 1.0, 8.0)),),
                              mechanisms=("dirichlet", "dpsgd"), references=4, reference_epsilons=(1.0,),
                              weightings=("paper",))
    names = [arm.name for arm in config.arms()]
    assert names == ["dirichlet-paper-eps0.5", "dirichlet-paper-eps1", "dirichlet-paper-eps8", "dpsgd-eps1", CONTROL]
    choices = {name: Choice(name, Setting(0.1, 1.0, effective=True), "given") for name in names}
    references = [job for job in target_jobs(config, choices) if job.reference is not None]
    assert sorted({job.arm.name for job in references}) == ["dirichlet-paper-eps1", "dpsgd-eps1", "none"]
    assert len(references) == 12 and all(job.setting == Setting(0.1, 1.0, True) for job in references)


def _seed_row(seed: int, accuracy: float, tp: int) -> dict:
    return {"arm": "dirichlet-eps1", "seed": seed, "attack": "loss", "claimed_eps": 1.0, "test_accuracy": accuracy,
            "control_accuracy": 0.95, "matched": accuracy >= 0.92, "seconds": 1.0, "auc": 0.6,
            "tpr_at_fpr_1pct": 0.1, "tpr_at_fpr_01pct": 0.0, "true_positives": tp, "members": 100,
            "false_positives": 5, "nonmembers": 100}


def test_only_seeds_at_matched_utility_are_pooled_and_the_others_are_named():
    config = ExperimentConfig(margin=0.03)
    rows = [_seed_row(0, 0.94, 30), _seed_row(1, 0.80, 90), _seed_row(2, 0.93, 20)]
    row = pooled_row(config, rows)
    assert (row["seeds_pooled"], row["seeds_total"]) == (2, 3) and "seed 1 (accuracy 0.8000" in row["unmatched_seeds"]
    assert row["eps_lower_bound"] == epsilon_from_counts(AttackCounts(50, 200, 10, 200), config.delta)
    assert row["test_accuracy"] == pytest.approx(0.935) and "pooled over 2 of 3 seeds" in row["reason"]
    nothing = pooled_row(config, [_seed_row(0, 0.5, 90), _seed_row(1, 0.6, 90)])
    assert nothing["seeds_pooled"] == 0 and nothing["eps_lower_bound"] == 0.0 and nothing["auc"] is None
    assert nothing["verdict"] == "inconclusive" and "no seed reached matched utility" in nothing["reason"]
    one_run = [{**_seed_row(s, a, 0), "attack": "one-run loss", "one_run_counts": [OneRunCounts(10, c, 100)]}
               for s, a, c in ((0, 0.94, 9), (1, 0.5, 10))]
    assert pooled_row(config, one_run)["correct"] == 9  # the unmatched seed's guesses stay out


def test_tiny_experiment_writes_every_attack_the_choices_and_verdicts_at_matched_utility(tmp_path, capsys):
    out = tmp_path / "audit"
    assert audit_experiment.run(parse([*TINY, "--out", str(out)])) == 0
    with open(out / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    arms = ["dirichlet-paper-eps0.5", "dirichlet-paper-eps2", "none", CONTROL]
    attacks = ["loss", "one-run loss", "lira", "one-run lira", "rmia", "one-run rmia"]
    assert [(row["arm"], row["attack"], row["seed"]) for row in rows] == [
        (arm, attack, seed) for arm in arms for attack in attacks for seed in ("0", "1", "pooled")
    ]
    for arm in arms:
        for attack in ("loss", "lira"):
            chosen = [row for row in rows if row["arm"] == arm and row["attack"] == attack]
            matched = [row for row in chosen[:2] if row["matched"] == "True"]
            assert chosen[2]["seeds_pooled"] == str(len(matched))
            if matched:
                summed = sum((AttackCounts(*(int(row[k]) for k in COUNT_KEYS)) for row in matched[1:]),
                             AttackCounts(*(int(matched[0][k]) for k in COUNT_KEYS)))
                assert float(chosen[2]["eps_lower_bound"]) == pytest.approx(epsilon_from_counts(summed, 1e-5))
    for row in rows:
        bound, claim = float(row["eps_lower_bound"]), float(row["claimed_eps"])
        underfit = float(row["test_accuracy"]) < float(row["control_accuracy"]) - 0.03
        expected = "violation" if bound > claim else ("inconclusive" if underfit else "no violation")
        if row["seed"] == "pooled" and row["seeds_pooled"] == "0":
            expected = "inconclusive"
        assert row["verdict"] == expected and row["delta"] == "1e-05" and row["covers"]
    claims = {row["arm"]: float(row["claimed_eps"]) for row in rows}
    assert math.isinf(claims["none"]) and claims[CONTROL] == 0.0 and 0 < claims["dirichlet-paper-eps0.5"] <= 0.5

    results = json.loads((out / "results.json").read_text())
    assert results["config"]["seeds"] == [0, 1] and results["config"]["rate_grids"][1] == ["dirichlet", [0.05, 0.2]]
    assert [(row["arm"], row["rate"]) for row in results["tuning"]] == [
        (arm, rate) for arm in ("dirichlet-paper-eps0.5", "dirichlet-paper-eps2", "none") for rate in (0.05, 0.2)]
    for arm in ("dirichlet-paper-eps0.5", "dirichlet-paper-eps2"):
        tried = [row for row in results["tuning"] if row["arm"] == arm]
        assert results["choices"][arm]["rate"] == max(tried, key=lambda row: row["validation_accuracy"])["rate"]
        assert [row["chosen_by"] for row in tried].count([arm]) == 1
    assert results["choices"][CONTROL]["rate"] == results["choices"]["none"]["rate"]
    markdown = (out / "results.md").read_text()
    assert "delta=1e-05" in markdown and "Rates tried" in markdown
    assert "How the number of reference models K" in markdown
    with open(out / "reference_sweep.csv", newline="") as handle:
        assert [(row["arm"], row["references"]) for row in csv.DictReader(handle)] == [(arm, "2") for arm in arms]
    assert (out / "audit_roc.png").read_bytes()[:4] == b"\x89PNG"
    assert "| none | pooled | lira |" in capsys.readouterr().out


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--candidates", "5000", "--candidates=5000"),
    ("--validation", "2000", "--validation=2000"),
    ("--rate", "dirichlet=fast", "--rate item 'dirichlet=fast'"),
    ("--rate", "sgd=0.1", "--rate has unknown arm 'sgd'"),
    ("--rate-grid", "dirichlet=0.1/x", "--rate-grid dirichlet '0.1/x'"),
    ("--rate-grid", "adam=0.1", "--rate-grid has unknown mechanism 'adam'"),
    ("--clip-grid", "0.5/-1", "--clip-grid=-1.0"),
    ("--references", "1", "--references=1"),
    ("--mechanism-epsilon", "none=1", "--mechanism-epsilon none"),
    ("--reference-epsilon", "x", "--reference-epsilon='x'"),
    ("--model", "vgg", "--model='vgg'"),
    ("--norm", "group-x", "--norm='group-x'"),
    ("--weighting", "capped", "--weighting='capped'"),
])
def test_bad_input_is_one_line_and_exit_code_two(tmp_path, capsys, flag, value, message):
    code = audit_experiment.run(parse([*TINY, flag, value, "--out", str(tmp_path / "x")]))
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1 and message in error
    assert not (tmp_path / "x").exists()


def test_the_optimizer_not_given_is_the_networks_own_with_its_own_rate_grid() -> None:
    """audit-experiment without --optimizer trains each network as its Recipe says: lenet with SGD over the
    effective-rate grids, lenet with GroupNorm with Adam over Adam's grid (its own units); a flag wins."""
    from sims.audit.config import ADAM_RATE_GRIDS, DEFAULT_RATE_GRIDS

    plain = audit_experiment.config_from_args(parse(["--model", "lenet"]))
    assert (plain.optimizer, plain.rate_grids) == ("sgd", DEFAULT_RATE_GRIDS)
    normed = audit_experiment.config_from_args(parse(["--model", "lenet", "--norm", "group"]))
    assert (normed.optimizer, normed.rate_grids) == ("adam", ADAM_RATE_GRIDS)
    given = audit_experiment.config_from_args(parse(["--norm", "group", "--optimizer", "sgd", "--rate-grid",
                                                     "none=0.01"]))
    assert given.optimizer == "sgd" and dict(given.rate_grids)["none"] == (0.01,)
