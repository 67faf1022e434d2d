"""The audit experiment on scikit-learn's digits, tiny: the split, the rates, the attacks and the tables."""

from __future__ import annotations

import argparse
import csv
import json
import math

import numpy as np
import pytest

from cli import audit_experiment
from dirichlet_fl.norms import NORMS
from privacy.analysis import attenuation
from privacy.audit.statistics import AttackCounts, epsilon_from_counts
from sims.audit_config import CONTROL, NORM_CHOICES, Arm, ExperimentConfig, parse_rates
from sims.audit_experiment import Job, candidate_split, reference_mask, train_job

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TINY = ["--dataset", "digits", "--candidates", "40", "--steps", "30", "--sample-rate", "0.1", "--seeds", "2",
        "--epsilon", "0.5,2", "--workers", "1", "--rate", "none=0.1,dpsgd=0.1", "--references", "2",
        "--mechanisms", "dirichlet,none", "--model", "cnn"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    audit_experiment.add_parser(parser.add_subparsers())
    return parser.parse_args(["audit-experiment", *argv])


def test_the_pool_is_fixed_and_each_seed_flips_a_fair_coin_per_candidate():
    config = ExperimentConfig(candidates=100, extra_train=30)
    split = candidate_split(1000, config, seed=3)
    assert np.array_equal(split.pool, candidate_split(1000, config, seed=4).pool)
    assert not np.array_equal(split.coins, candidate_split(1000, config, seed=4).coins)
    assert len(split.members) + len(split.nonmembers) == 100 and 30 < len(split.members) < 70
    used = np.concatenate([split.pool, split.control_train, split.extra])
    assert not np.intersect1d(split.population, used).size and len(split.population) == 50
    assert not np.intersect1d(split.pool, split.control_train).size
    assert len(split.control_train) == len(split.members) + 30
    assert not np.array_equal(reference_mask(config, 0), reference_mask(config, 1))


def test_rates_are_given_per_arm_or_mechanism_and_dirichlet_defaults_to_the_kappa_rule():
    config = ExperimentConfig(dataset="digits", candidates=40, steps=30, sample_rate=0.1, epsilons=(0.5,),
                              rates=parse_rates("none=0.1"), model="cnn")
    result = train_job(config, Job(Arm("dirichlet-eps0.5", "dirichlet", 0.5), 0))
    assert result.learning_rate == pytest.approx(0.1 / attenuation(0.9, float(result.noise["r"]), 3.0))
    assert 0 < result.claimed_eps <= 0.5 and result.pool_losses.shape == (40,)
    explicit = ExperimentConfig(rates=parse_rates("none=0.1,dirichlet=0.7,dirichlet-eps4=0.3"), epsilons=(1.0, 4.0))
    arms = {arm.name: arm for arm in explicit.arms()}
    assert [explicit.explicit_rate(arms[name]) for name in ("dirichlet-eps1", "dirichlet-eps4", CONTROL)] == [0.7, 0.3, 0.1]
    assert NORM_CHOICES == NORMS


def test_tiny_experiment_writes_every_attack_with_verdicts_at_matched_utility(tmp_path, capsys):
    out = tmp_path / "audit"
    assert audit_experiment.run(parse([*TINY, "--out", str(out)])) == 0
    with open(out / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    arms = ["dirichlet-eps0.5", "dirichlet-eps2", "none", CONTROL]
    attacks = ["loss", "one-run loss", "lira", "one-run lira", "rmia", "one-run rmia"]
    assert [(row["arm"], row["attack"], row["seed"]) for row in rows] == [
        (arm, attack, seed) for arm in arms for attack in attacks for seed in ("0", "1", "pooled")
    ]
    for arm in arms:
        for attack in ("loss", "lira"):
            chosen = [row for row in rows if row["arm"] == arm and row["attack"] == attack]
            summed = sum((AttackCounts(*(int(row[k]) for k in ("true_positives", "members", "false_positives", "nonmembers")))
                          for row in chosen[1:2]), AttackCounts(*(int(chosen[0][k]) for k in ("true_positives", "members", "false_positives", "nonmembers"))))
            assert float(chosen[2]["eps_lower_bound"]) == pytest.approx(epsilon_from_counts(summed, 1e-5))
    for row in rows:
        bound, claim = float(row["eps_lower_bound"]), float(row["claimed_eps"])
        underfit = float(row["test_accuracy"]) < float(row["control_accuracy"]) - 0.03
        expected = "violation" if bound > claim else ("inconclusive" if underfit else "no violation")
        assert row["verdict"] == expected and row["delta"] == "1e-05" and row["covers"]
    claims = {row["arm"]: float(row["claimed_eps"]) for row in rows}
    assert math.isinf(claims["none"]) and claims[CONTROL] == 0.0 and 0 < claims["dirichlet-eps0.5"] <= 0.5

    markdown = (out / "results.md").read_text()
    assert "delta=1e-05" in markdown and "## Verdicts" in markdown and "How the number of reference models K" in markdown
    assert json.loads((out / "config.json").read_text())["seeds"] == [0, 1]
    with open(out / "reference_sweep.csv", newline="") as handle:
        assert [(row["arm"], row["references"]) for row in csv.DictReader(handle)] == [(arm, "2") for arm in arms]
    assert (out / "audit_roc.png").read_bytes()[:4] == b"\x89PNG"
    assert "| none | pooled | lira |" in capsys.readouterr().out


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--candidates", "5000", "--candidates=5000"),
    ("--rate", "dirichlet=fast", "--rate item 'dirichlet=fast'"),
    ("--rate", "sgd=0.1", "--rate has unknown arm 'sgd'"),
    ("--references", "1", "--references=1"),
    ("--model", "vgg", "--model='vgg'"),
])
def test_bad_input_is_one_line_and_exit_code_two(tmp_path, capsys, flag, value, message):
    code = audit_experiment.run(parse([*TINY, flag, value, "--out", str(tmp_path / "x")]))
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1 and message in error
    assert not (tmp_path / "x").exists()
