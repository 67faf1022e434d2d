"""Membership-inference audit: exact intervals, the eps lower bound, AUC and ROC, on scores and on real models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom
from sklearn.datasets import load_digits
from sklearn.metrics import roc_auc_score
from torch import nn

from privacy.audit.attacks import per_example_losses
from privacy.audit.report import Claim, audit
from privacy.audit.statistics import (
    AttackCounts,
    Threshold,
    auc,
    choose_threshold,
    clopper_pearson,
    empirical_epsilon_lower_bound,
    epsilon_from_counts,
    roc_curve,
)

DELTA = 1e-5


pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.mark.parametrize(
    "successes, trials, low, high",
    [  # published 95% Clopper-Pearson intervals
        (0, 10, 0.0, 0.3085),
        (1, 10, 0.0025, 0.4450),
        (5, 10, 0.1871, 0.8129),
        (10, 10, 0.6915, 1.0),
    ],
)
def test_clopper_pearson_matches_published_values(successes, trials, low, high):
    assert clopper_pearson(successes, trials) == pytest.approx((low, high), abs=5e-5)


@pytest.mark.parametrize("successes, trials", [(3, 17), (40, 250), (1, 1000)])
def test_clopper_pearson_ends_are_where_the_binomial_tails_reach_alpha_over_two(successes, trials):
    low, high = clopper_pearson(successes, trials, confidence=0.9)
    assert binom.sf(successes - 1, trials, low) == pytest.approx(0.05, rel=1e-6)  # P(X >= k | low)
    assert binom.cdf(successes, trials, high) == pytest.approx(0.05, rel=1e-6)  # P(X <= k | high)


def test_clopper_pearson_closed_forms_at_the_extremes():
    n = 250
    assert clopper_pearson(0, n)[1] == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-10)
    assert clopper_pearson(n, n)[0] == pytest.approx(0.025 ** (1 / n), rel=1e-10)


@pytest.mark.parametrize("successes, trials", [(-1, 10), (11, 10), (0, 0)])
def test_clopper_pearson_refuses_impossible_counts(successes, trials):
    with pytest.raises(ValueError):
        clopper_pearson(successes, trials)


def test_epsilon_from_counts_of_a_perfect_attack_uses_the_conservative_ends():
    n = 250
    counts = AttackCounts(true_positives=n, members=n, false_positives=0, nonmembers=n)
    tpr_low, fpr_high = 0.025 ** (1 / n), 1 - 0.025 ** (1 / n)
    expected = max(math.log((tpr_low - DELTA) / fpr_high), math.log((1 - fpr_high - DELTA) / (1 - tpr_low)))
    assert epsilon_from_counts(counts, DELTA) == pytest.approx(expected, rel=1e-10)


def test_epsilon_from_counts_uses_the_cleared_side_when_it_is_stronger():
    # Few members flagged but no non-member left unflagged... mirrored: every non-member is flagged,
    # some members are not flagged: the evidence is TNR / FNR, the second term.
    counts = AttackCounts(true_positives=100, members=200, false_positives=0, nonmembers=200)
    tpr_low, tpr_high = clopper_pearson(100, 200)
    fpr_low, fpr_high = clopper_pearson(0, 200)
    flagged = math.log((tpr_low - DELTA) / fpr_high)
    cleared = math.log((1 - fpr_high - DELTA) / (1 - tpr_low))
    assert epsilon_from_counts(counts, DELTA) == pytest.approx(max(flagged, cleared), rel=1e-10)
    mirrored = AttackCounts(true_positives=200, members=200, false_positives=100, nonmembers=200)
    tpr_low, _ = clopper_pearson(200, 200)
    _, fpr_high = clopper_pearson(100, 200)
    assert epsilon_from_counts(mirrored, DELTA) == pytest.approx(
        math.log((1 - fpr_high - DELTA) / (1 - tpr_low)), rel=1e-10
    )


def test_epsilon_from_counts_is_zero_when_rates_are_equal():
    assert epsilon_from_counts(AttackCounts(50, 100, 50, 100), DELTA) == 0.0


def test_attack_counts_add_up_for_pooling():
    assert AttackCounts(1, 10, 2, 10) + AttackCounts(3, 5, 0, 6) == AttackCounts(4, 15, 2, 16)


def test_choose_threshold_finds_the_separating_side_in_either_direction():
    members, nonmembers = np.array([5.0, 6.0, 7.0, 8.0] * 10), np.array([0.0, 1.0, 2.0, 3.0] * 10)
    assert choose_threshold(members, nonmembers, DELTA) == Threshold(5.0, "higher")
    assert choose_threshold(-members, -nonmembers, DELTA) == Threshold(-5.0, "lower")


def test_bound_is_zero_when_members_and_nonmembers_come_from_one_distribution():
    rng = np.random.default_rng(0)
    bounds = [
        empirical_epsilon_lower_bound(rng.normal(size=1000), rng.normal(size=1000), DELTA, rng).epsilon
        for _ in range(10)
    ]
    assert sum(bound == 0.0 for bound in bounds) >= 8
    assert max(bounds) < 0.3


def test_bound_detects_separated_scores_and_is_measured_on_the_held_out_half():
    rng = np.random.default_rng(1)
    result = empirical_epsilon_lower_bound(rng.normal(3.0, 1.0, 1000), rng.normal(0.0, 1.0, 1001), DELTA, rng)
    assert result.epsilon > 1.5
    assert (result.counts.members, result.counts.nonmembers) == (500, 501)
    assert result.epsilon == epsilon_from_counts(result.counts, DELTA)


def test_auc_handles_ties_and_matches_scikit_learn():
    assert auc(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.5
    assert auc(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 1.0
    rng = np.random.default_rng(2)
    members, nonmembers = rng.integers(0, 5, 300).astype(float), rng.integers(0, 4, 200).astype(float)
    expected = roc_auc_score(np.r_[np.ones(300), np.zeros(200)], np.r_[members, nonmembers])
    assert auc(members, nonmembers) == pytest.approx(expected, rel=1e-12)


def test_roc_curve_area_is_the_auc_and_tpr_at_fpr_reads_the_curve():
    rng = np.random.default_rng(3)
    members, nonmembers = rng.integers(0, 20, 400).astype(float) + 2, rng.integers(0, 20, 300).astype(float)
    curve = roc_curve(members, nonmembers)
    assert (curve.fpr[0], curve.tpr[0], curve.fpr[-1], curve.tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.trapezoid(curve.tpr, curve.fpr) == pytest.approx(auc(members, nonmembers), rel=1e-12)

    simple = roc_curve(np.array([4.0, 3.0, 1.0]), np.array([3.5, 0.0, 0.5, 2.0]))
    assert simple.tpr_at(0.0) == pytest.approx(1 / 3)
    assert simple.tpr_at(0.25) == pytest.approx(2 / 3)
    assert simple.tpr_at(0.5) == pytest.approx(1.0)


def test_audit_report_flags_a_violation_and_serialises():
    rng = np.random.default_rng(4)
    report = audit(rng.normal(3, 1, 600), rng.normal(0, 1, 600), Claim(1.0, DELTA, "weights"), rng=rng)
    assert report.violation and report.eps_lower_bound > 1.0
    assert report.to_dict()["violation"] is True and report.to_dict()["claimed_eps"] == 1.0
    no_claim = audit(rng.normal(3, 1, 600), rng.normal(0, 1, 600), Claim(math.inf, DELTA, "nothing"), rng=rng)
    assert not no_claim.violation and no_claim.to_dict()["claimed_eps"] is None


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    bunch = load_digits()
    return torch.tensor(bunch.data / 16.0, dtype=torch.float32), torch.tensor(bunch.target, dtype=torch.int64)


def _train(inputs: torch.Tensor, labels: torch.Tensor, steps: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
    return model


def test_per_example_losses_are_the_unreduced_cross_entropy_in_batches():
    x, y = _digits()
    model = _train(x[:50], y[:50], 5)
    losses = per_example_losses(model, x[:300], y[:300], batch_size=64)
    expected = nn.functional.cross_entropy(model(x[:300]).double(), y[:300], reduction="none").detach().numpy()
    np.testing.assert_allclose(losses, expected, rtol=1e-9)


def test_per_example_losses_keep_confident_predictions_apart():
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    inputs = torch.tensor([[50.0, 0.0], [60.0, 0.0], [0.0, 0.0]])
    losses = per_example_losses(model, inputs, torch.tensor([0, 0, 0]))
    np.testing.assert_allclose(losses, [math.exp(-50), math.exp(-60), math.log(2)], rtol=1e-9)


def test_a_model_that_never_saw_the_candidates_shows_no_leak():
    x, y = _digits()
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    members, nonmembers, other = order[:400], order[400:800], order[800:]
    model = _train(x[other], y[other], 60)
    scores_in = -per_example_losses(model, x[members], y[members])
    scores_out = -per_example_losses(model, x[nonmembers], y[nonmembers])
    report = audit(scores_in, scores_out, Claim(0.0, DELTA, "-"), rng=np.random.default_rng(0))
    assert abs(report.auc - 0.5) < 0.1
    assert report.eps_lower_bound < 0.2


def test_an_overfit_model_leaks_membership():
    # As many features as examples and a noisy label (the primer's setting): the model memorises.
    generator = torch.Generator().manual_seed(0)
    dimension = 300
    x = torch.randn(400, dimension, generator=generator)
    relevant = torch.zeros(dimension)
    relevant[:10] = 1.0
    y = (x @ relevant / 10**0.5 + 0.5 * torch.randn(400, generator=generator) > 0).long()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(dimension, 128), nn.ReLU(), nn.Linear(128, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[:200]), y[:200]).backward()
        optimizer.step()
    scores_in = -per_example_losses(model, x[:200], y[:200])
    scores_out = -per_example_losses(model, x[200:], y[200:])
    report = audit(scores_in, scores_out, Claim(1.0, DELTA, "-"), rng=np.random.default_rng(0))
    assert report.auc > 0.8
    assert report.eps_lower_bound > 1.0 and report.violation
