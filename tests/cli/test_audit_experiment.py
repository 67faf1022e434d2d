"""The audit experiment on scikit-learn's digits, tiny: the split, the learning-rate rule, the tables."""

from __future__ import annotations

import argparse
import csv
import json
import math

import numpy as np
import pytest

from cli import audit_experiment
from privacy.analysis import attenuation
from privacy.audit import AttackCounts, epsilon_from_counts
from sims.audit_experiment import CONTROL, ExperimentConfig, candidate_split, train_arm

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TINY = ["--dataset", "digits", "--candidates", "40", "--steps", "30", "--sample-rate", "0.1", "--seeds", "2",
        "--epsilon", "0.5", "--workers", "1", "--learning-rate", "0.1"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    audit_experiment.add_parser(parser.add_subparsers())
    return parser.parse_args(["audit-experiment", *argv])


def test_candidates_are_split_at_random_into_disjoint_balanced_halves():
    config = ExperimentConfig(candidates=100, extra_train=30)
    split = candidate_split(1000, config, seed=3)
    pool = np.concatenate([split.members, split.nonmembers])
    assert len(split.members) == len(split.nonmembers) == 50
    assert len(np.unique(pool)) == 100
    assert not np.intersect1d(pool, split.extra).size and not np.intersect1d(pool, split.control_train).size
    assert len(split.control_train) == 50 + 30
    again = candidate_split(1000, config, seed=3)
    assert np.array_equal(again.members, split.members)
    assert not np.array_equal(candidate_split(1000, config, seed=4).members, split.members)


def test_dirichlet_trains_at_the_rate_whose_effective_rate_is_the_non_private_one():
    config = ExperimentConfig(dataset="digits", candidates=40, steps=30, sample_rate=0.1, epsilon=0.5, learning_rate=0.1)
    result = train_arm(config, seed=0, arm="dirichlet")
    r = float(result.noise["r"])
    assert result.learning_rate == pytest.approx(0.1 / attenuation(0.9, r, 3.0))
    assert 0 < result.claimed_eps <= 0.5
    assert result.member_losses.shape == result.nonmember_losses.shape == (20,)


def test_tiny_experiment_writes_consistent_tables(tmp_path, capsys):
    out = tmp_path / "audit"
    assert audit_experiment.run(parse([*TINY, "--out", str(out)])) == 0
    with open(out / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    arms = ["dirichlet", "dpsgd", "none", CONTROL]
    assert [(row["arm"], row["seed"]) for row in rows] == [
        (arm, seed) for arm in arms for seed in ("0", "1", "pooled")
    ]
    for arm in arms:
        seeds = [row for row in rows if row["arm"] == arm and row["seed"] != "pooled"]
        pooled = next(row for row in rows if row["arm"] == arm and row["seed"] == "pooled")
        summed = sum(
            (AttackCounts(*(int(row[key]) for key in ("true_positives", "members", "false_positives", "nonmembers")))
             for row in seeds[1:]),
            AttackCounts(*(int(seeds[0][key]) for key in ("true_positives", "members", "false_positives", "nonmembers"))),
        )
        assert (int(pooled["true_positives"]), int(pooled["members"])) == (summed.true_positives, summed.members)
        assert float(pooled["eps_lower_bound"]) == pytest.approx(epsilon_from_counts(summed, 1e-5))
        for row in seeds + [pooled]:
            assert (row["violation"] == "True") == (float(row["eps_lower_bound"]) > float(row["claimed_eps"]))
            assert row["delta"] == "1e-05" and row["covers"]
    claims = {row["arm"]: float(row["claimed_eps"]) for row in rows}
    assert math.isinf(claims["none"]) and claims[CONTROL] == 0.0
    assert 0 < claims["dirichlet"] <= 0.5 and 0 < claims["dpsgd"] <= 0.5

    markdown = (out / "results.md").read_text()
    assert "delta=1e-05" in markdown and "## Pooled over seeds" in markdown and "NOT the trained weights" in markdown
    assert json.loads((out / "config.json").read_text())["seeds"] == [0, 1]
    assert len(np.load(out / "losses.npz").files) == 2 * 2 * len(arms)
    assert "| dpsgd | pooled |" in capsys.readouterr().out


def test_an_impossible_split_is_one_line_and_exit_code_two(tmp_path, capsys):
    code = audit_experiment.run(parse([*TINY, "--candidates", "5000", "--out", str(tmp_path / "x")]))
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1 and "--candidates=5000" in error
    assert not (tmp_path / "x").exists()
