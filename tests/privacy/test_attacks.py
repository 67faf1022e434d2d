"""Offline LiRA and RMIA, one-run auditing, the update view and the verdict: planted leaks, planted
non-leaks, and golden values from independent computations (plain loops, scipy root finding,
closed forms, dp-accounting's PLD accountant)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import expit
from scipy.stats import binom, norm

from privacy.audit.attacks import lira_offline_scores, logit_confidence, rmia_offline_scores
from privacy.audit.one_run import (
    ONE_RUN_FRACTIONS,
    OneRunCounts,
    one_run_bound,
    one_run_counts,
    one_run_eps_lower_bound,
    one_run_guesses,
    one_run_p_value,
)
from privacy.audit.report import Claim, audit_scores
from privacy.audit.statistics import CONFIDENCE
from privacy.audit.update_view import (
    canary_cosines,
    cosine_view_audit,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_epsilon_estimate,
)
from privacy.audit.verdict import verdict

DELTA = 1e-5
CLAIM = 0.5


def _world(seed: int, boost: float, n: int = 2000, models: int = 16) -> dict[str, np.ndarray]:
    """A target and `models` references, each trained on a random half of n examples. Every model's
    true-label confidence is sigmoid(difficulty_i + noise + boost * trained_on_i): boost = 0 is a
    model whose output does not depend on membership; a large boost memorises its training set."""
    rng = np.random.default_rng(seed)
    difficulty = rng.normal(1.0, 1.5, n)
    in_mask = rng.random((models, n)) < 0.5
    member = rng.random(n) < 0.5

    def confidences(trained: np.ndarray) -> np.ndarray:
        return expit(difficulty + rng.normal(0.0, 0.5, trained.shape) + boost * trained)

    return {"target": confidences(member), "references": confidences(in_mask), "in_mask": in_mask, "member": member}


def _audit(scores: np.ndarray, member: np.ndarray, seed: int = 0):
    return audit_scores(scores, member, Claim(CLAIM, DELTA), rng=np.random.default_rng(seed))


# ------------------------------------------------------------------------------------------------
# LiRA
# ------------------------------------------------------------------------------------------------


def test_logit_confidence_is_finite_at_the_ends_and_exact_inside():
    values = logit_confidence(np.array([0.0, 0.25, 0.5, 1.0]))
    assert np.isfinite(values).all() and values[0] == -values[3] == pytest.approx(-math.log(1e15), rel=1e-12)
    np.testing.assert_allclose(values[1:3], [math.log(1 / 3), 0.0], atol=1e-15)


@pytest.mark.parametrize("models, global_variance", [(8, True), (80, False)])
def test_lira_matches_a_per_example_loop(models, global_variance):
    world = _world(seed=1, boost=2.0, n=300, models=models)
    scores = lira_offline_scores(world["target"], world["references"], world["in_mask"])
    phi_refs, phi_target = logit_confidence(world["references"]), logit_confidence(world["target"])
    means, residuals, stds = [], [], []
    for i in range(300):
        outs = phi_refs[~world["in_mask"][:, i], i]
        outs = outs if outs.size else phi_refs[:, i]  # no reference left example i out: use them all
        means.append(outs.mean())
        residuals.extend(outs - outs.mean())
        stds.append(outs.std(ddof=1) if outs.size > 1 else math.nan)
    assert models > 8 or world["in_mask"].all(axis=0).any()  # the fallback is exercised with 8 models
    pooled = math.sqrt(np.sum(np.square(residuals)) / (len(residuals) - 300))
    std = np.full(300, pooled) if global_variance else np.array(stds)
    expected = (phi_target - np.array(means)) / std
    np.testing.assert_allclose(scores, expected, rtol=1e-10)
    # Phi(z) is the paper's one-sided score 1 - Pr[Z > phi], Z ~ N(mu_out, sigma_out^2): z ranks alike.
    np.testing.assert_allclose(norm.cdf(scores), 1 - norm.sf(phi_target, loc=np.array(means), scale=std), rtol=1e-9)


def test_lira_falls_back_to_all_references_for_an_example_no_reference_left_out():
    world = _world(seed=2, boost=2.0, n=200)
    in_mask = world["in_mask"].copy()
    in_mask[:, 7] = True
    scores = lira_offline_scores(world["target"], world["references"], in_mask, global_variance=False)
    phi = logit_confidence(world["references"][:, 7])
    expected = (logit_confidence(world["target"][7]) - phi.mean()) / phi.std(ddof=1)
    assert scores[7] == pytest.approx(expected, rel=1e-10)


def test_lira_exposes_a_memorising_target_as_a_violation():
    world = _world(seed=3, boost=8.0)
    report = _audit(lira_offline_scores(world["target"], world["references"], world["in_mask"]), world["member"])
    assert report.auc > 0.99 and report.tpr_at_fpr_01pct > 0.5
    assert report.eps_lower_bound > 3.0 and report.violation
    assert verdict(report.eps_lower_bound, CLAIM).label == "violation"


def test_lira_finds_nothing_when_membership_does_not_change_the_output():
    world = _world(seed=4, boost=0.0)
    report = _audit(lira_offline_scores(world["target"], world["references"], world["in_mask"]), world["member"])
    assert abs(report.auc - 0.5) < 0.05
    assert report.eps_lower_bound < 0.3
    assert verdict(report.eps_lower_bound, CLAIM).label == "no violation"


def test_lira_refuses_inconsistent_inputs():
    world = _world(seed=5, boost=1.0, n=50)
    with pytest.raises(ValueError):
        lira_offline_scores(world["target"][:-1], world["references"], world["in_mask"])
    with pytest.raises(ValueError):
        lira_offline_scores(world["target"], world["references"], world["in_mask"].astype(int))
    with pytest.raises(ValueError):
        lira_offline_scores(world["target"] * 2, world["references"], world["in_mask"])
    with pytest.raises(ValueError):  # one reference model cannot give a variance
        lira_offline_scores(world["target"], world["references"][:1], world["in_mask"][:1])


# ------------------------------------------------------------------------------------------------
# RMIA
# ------------------------------------------------------------------------------------------------


def _rmia_pairwise(world: dict[str, np.ndarray], population: np.ndarray, a: float, gamma: float) -> np.ndarray:
    """Zarifzadeh et al.'s score written out pair by pair: Pr_z[LR(x, z) >= gamma], z != x."""
    scores = np.empty(len(world["target"]))
    for x in range(len(scores)):
        ratios = []
        for z in population:
            if z == x:
                continue
            p_x = ((1 + a) * world["references"][~world["in_mask"][:, x], x].mean() + (1 - a)) / 2
            p_z = ((1 + a) * world["references"][~world["in_mask"][:, z], z].mean() + (1 - a)) / 2
            ratios.append((world["target"][x] / p_x) / (world["target"][z] / p_z))
        scores[x] = np.mean(np.array(ratios) >= gamma)
    return scores


@pytest.mark.parametrize("a, gamma, use_population", [(0.3, 1.0, False), (0.6, 2.0, True), (1.0, 0.5, True)])
def test_rmia_matches_the_pairwise_definition(a, gamma, use_population):
    world = _world(seed=6, boost=2.0, n=120)
    population = np.random.default_rng(0).choice(120, 40, replace=False) if use_population else None
    scores = rmia_offline_scores(
        world["target"], world["references"], world["in_mask"], population=population, offline_a=a, gamma=gamma
    )
    expected = _rmia_pairwise(world, np.arange(120) if population is None else population, a, gamma)
    np.testing.assert_allclose(scores, expected, atol=1e-12)


def test_rmia_falls_back_to_all_references_for_an_example_no_reference_left_out():
    world = _world(seed=7, boost=2.0, n=100)
    all_in = world["in_mask"].copy()
    all_in[:, 3] = True
    nothing_in = world["in_mask"].copy()
    nothing_in[:, 3] = False
    np.testing.assert_array_equal(
        rmia_offline_scores(world["target"], world["references"], all_in),
        rmia_offline_scores(world["target"], world["references"], nothing_in),
    )


def test_rmia_exposes_a_memorising_target_as_a_violation():
    world = _world(seed=8, boost=8.0)
    held_out = np.flatnonzero(~world["member"])[:300]  # known non-members as the z population
    scores = rmia_offline_scores(world["target"], world["references"], world["in_mask"], population=held_out)
    candidates = np.setdiff1d(np.arange(len(scores)), held_out)
    report = _audit(scores[candidates], world["member"][candidates])
    assert report.auc > 0.98 and report.eps_lower_bound > 3.0 and report.violation


def test_rmia_finds_nothing_when_membership_does_not_change_the_output():
    world = _world(seed=9, boost=0.0)
    report = _audit(rmia_offline_scores(world["target"], world["references"], world["in_mask"]), world["member"])
    assert abs(report.auc - 0.5) < 0.05 and report.eps_lower_bound < 0.3
    assert verdict(report.eps_lower_bound, CLAIM).label == "no violation"


def test_rmia_refuses_bad_parameters():
    world = _world(seed=10, boost=1.0, n=20)
    args = (world["target"], world["references"], world["in_mask"])
    bad = ({"offline_a": 1.5}, {"gamma": 0.0}, {"population": np.array([1, 1, 2])}, {"population": np.array([0, 20])})
    for kwargs in bad:
        with pytest.raises(ValueError):
            rmia_offline_scores(*args, **kwargs)


# ------------------------------------------------------------------------------------------------
# Scores -> audit report
# ------------------------------------------------------------------------------------------------


def test_audit_scores_splits_by_label_and_reports_the_rates():
    rng = np.random.default_rng(11)
    member = rng.random(1000) < 0.5
    scores = np.where(member, 5.0, 0.0) + rng.normal(size=1000)
    report = _audit(scores, member)
    assert (report.num_members, report.num_nonmembers) == (member.sum(), (~member).sum())
    assert 0.99 < report.auc <= 1.0 and report.tpr_at_fpr_1pct > 0.7
    with pytest.raises(ValueError):
        _audit(scores, member.astype(float))


# ------------------------------------------------------------------------------------------------
# One-run auditing
# ------------------------------------------------------------------------------------------------


def test_one_run_guesses_count_the_extremes():
    scores = np.array([0.9, 0.1, 0.5, 0.8, 0.2, 0.3])
    included = np.array([True, False, True, False, True, False])
    # in: 0.9 (T), 0.8 (F); out: 0.1 (F), 0.2 (T)  -> 2 of 4 correct
    assert one_run_guesses(scores, included, 2, 2) == (4, 2)
    assert one_run_guesses(scores, included, 1, 1) == (2, 2)
    assert one_run_guesses(scores, included, 0, 0) == (0, 0)
    with pytest.raises(ValueError):
        one_run_guesses(scores, included, 4, 3)


def _pure_eps_bound_by_root_finding(r: int, v: int, beta: float) -> float:
    """delta = 0: the largest eps with P[Binomial(r, e^eps / (1 + e^eps)) >= v] <= beta, by brentq."""
    tail = lambda eps: binom.sf(v - 1, r, expit(eps)) - beta  # noqa: E731
    return 0.0 if tail(0.0) >= 0 else brentq(tail, 0.0, 50.0, xtol=1e-12)


@pytest.mark.parametrize("r, v", [(100, 70), (100, 100), (500, 300), (1000, 990), (50, 26)])
def test_one_run_bound_without_delta_matches_the_binomial_tail(r, v):
    expected = _pure_eps_bound_by_root_finding(r, v, 0.05)
    assert one_run_eps_lower_bound(r, v, 2000, 0.0) == pytest.approx(expected, abs=1e-8)


def test_one_run_bound_of_perfect_guessing_has_a_closed_form():
    # All r guesses right: q^r = beta, eps = log(q / (1 - q)); r = 1000 gives 5.809 at 95%.
    q = 0.05 ** (1 / 1000)
    assert one_run_eps_lower_bound(1000, 1000, 1000, 0.0) == pytest.approx(math.log(q / (1 - q)), abs=1e-8)
    assert one_run_eps_lower_bound(1000, 1000, 1000, 0.0) == pytest.approx(5.8091, abs=1e-4)
    assert 5.7 < one_run_eps_lower_bound(1000, 1000, 1000, DELTA) < 5.809


def _appendix_d(m: int, r: int, v: int, delta: float, p: float) -> float:
    """Steinke et al.'s Appendix D procedure, written as a plain loop, to check the vectorised version."""

    def p_value(eps: float) -> float:
        q = 1 / (1 + math.exp(-eps))
        tail, alpha, total = binom.sf(v - 1, r, q), 0.0, 0.0
        for i in range(1, v + 1):
            total += binom.pmf(v - i, r, q)
            if total > i * alpha:
                alpha = total / i
        return min(tail + alpha * delta * 2 * m, 1.0)

    low, high = 0.0, 1.0
    while p_value(high) < p:
        high += 1
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if p_value(middle) < p else (low, middle)
    return low


@pytest.mark.parametrize(
    "m, r, v, delta", [(1000, 200, 150, 1e-5), (1000, 1000, 600, 1e-5), (5000, 300, 290, 1e-4), (100, 100, 100, 1e-3)]
)
def test_one_run_bound_with_delta_matches_the_papers_procedure(m, r, v, delta):
    assert one_run_eps_lower_bound(r, v, m, delta) == pytest.approx(_appendix_d(m, r, v, delta, 0.05), abs=1e-7)


def test_one_run_bound_grows_with_correct_guesses_and_shrinks_with_delta_and_confidence():
    bounds = [one_run_eps_lower_bound(400, v, 1000, DELTA) for v in range(200, 401, 10)]
    assert bounds[0] == 0.0 and (np.diff(bounds) >= 0).all() and bounds[-1] > 4
    assert one_run_eps_lower_bound(400, 350, 1000, 1e-3) < one_run_eps_lower_bound(400, 350, 1000, 1e-6)
    assert one_run_eps_lower_bound(400, 350, 1000, DELTA, beta=0.01) < one_run_eps_lower_bound(400, 350, 1000, DELTA)


def test_one_run_p_value_at_the_bound_is_beta():
    eps = one_run_eps_lower_bound(300, 250, 1000, DELTA)
    assert one_run_p_value(300, 250, 1000, eps, DELTA) == pytest.approx(0.05, rel=1e-6)


def test_one_run_bound_is_zero_without_evidence_and_refuses_impossible_counts():
    assert one_run_eps_lower_bound(0, 0, 100, DELTA) == 0.0
    assert one_run_eps_lower_bound(100, 50, 100, 0.0) == 0.0
    assert one_run_eps_lower_bound(100, 100, 100, 0.5) == 0.0  # delta this large excuses anything
    for counts in [(10, 11, 100), (101, 50, 100), (-1, 0, 10)]:
        with pytest.raises(ValueError):
            one_run_eps_lower_bound(*counts, DELTA)


def test_one_run_on_memorised_canaries_is_a_violation_and_on_ignored_ones_is_not():
    rng = np.random.default_rng(12)
    included = rng.random(1000) < 0.5
    memorised = included + rng.normal(0.0, 0.1, 1000)
    r, v = one_run_guesses(memorised, included, 150, 150)
    assert (r, v) == (300, 300)
    bound = one_run_eps_lower_bound(r, v, 1000, DELTA)
    assert bound > 2.5 and verdict(bound, CLAIM).label == "violation"
    ignored = rng.normal(size=1000)
    bound = one_run_eps_lower_bound(*one_run_guesses(ignored, included, 150, 150), 1000, DELTA)
    assert bound < 0.3 and verdict(bound, CLAIM).label == "no violation"


def test_one_run_bound_holds_its_confidence_when_nothing_leaks():
    rng = np.random.default_rng(13)
    positives = 0
    for _ in range(200):
        included = rng.random(200) < 0.5
        positives += one_run_eps_lower_bound(*one_run_guesses(rng.normal(size=200), included, 50, 50), 200, 0.0) > 0
    assert positives <= 16  # at most 5% expected; 16 of 200 is beyond 3 standard deviations


# ------------------------------------------------------------------------------------------------
# The update view
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mu", [0.5, 1.0, 3.0])
def test_gaussian_epsilon_matches_dp_accounting(mu):
    dp_accounting = pytest.importorskip("dp_accounting")
    expected = dp_accounting.pld.PLDAccountant().compose(dp_accounting.GaussianDpEvent(1.0 / mu)).get_epsilon(DELTA)
    assert gaussian_epsilon(mu, DELTA) == pytest.approx(expected, rel=1e-6)
    assert gaussian_delta(gaussian_epsilon(mu, DELTA), mu) == pytest.approx(DELTA, rel=1e-6)


def test_gaussian_epsilon_edges():
    assert gaussian_epsilon(0.0, DELTA) == 0.0
    assert gaussian_epsilon(0.1, 0.5) == 0.0  # delta(0) = 2 Phi(0.05) - 1 = 0.04 <= 0.5
    assert gaussian_delta(0.0, 1.0) == pytest.approx(2 * norm.cdf(0.5) - 1, rel=1e-12)


def test_canary_cosines_of_one_update_and_the_max_over_several():
    canaries = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 1.0, 0.0]])
    np.testing.assert_allclose(canary_cosines(np.array([3.0, 0.0, 4.0]), canaries), [0.6, 0.0, 0.6 / math.sqrt(2)])
    several = [np.array([3.0, 0.0, 4.0]), np.array([0.0, 1.0, 0.0]), np.zeros(3)]
    np.testing.assert_allclose(canary_cosines(several, canaries), [0.6, 1.0, 1 / math.sqrt(2)])
    with pytest.raises(ValueError):
        canary_cosines(np.ones(4), canaries)


def _canary_world(seed: int, noise: float, signal: float = 1.0, d: int = 10000, m: int = 1000):
    """A Gaussian mechanism in d dimensions: the update is signal * (sum of the inserted unit canaries)
    plus N(0, noise^2 I); each canary inserted with a fair coin."""
    rng = np.random.default_rng(seed)
    canaries = rng.normal(size=(m, d)).astype(np.float32)
    canaries /= np.linalg.norm(canaries, axis=1, keepdims=True)
    in_mask = rng.random(m) < 0.5
    update = signal * canaries[in_mask].sum(axis=0) + rng.normal(0.0, noise, d).astype(np.float32)
    return update, canaries, in_mask


def test_update_view_recovers_the_gaussian_mechanisms_epsilon():
    # Andrew et al.'s calibration check: with sensitivity 1 and noise sigma, mu = 1 / sigma.
    update, canaries, in_mask = _canary_world(seed=14, noise=1.0)
    cosines = canary_cosines(update, canaries)
    result = cosine_view_audit(cosines, in_mask, Claim(10.0, DELTA), rng=np.random.default_rng(0))
    # The update also carries ~500 inserted canaries, whose overlaps (variance 500 / d) add to the noise.
    effective_mu = 1.0 / math.sqrt(1.0 + in_mask.sum() / canaries.shape[1])
    # mu is estimated from 500 + 500 cosines: its sampling error is about 0.05.
    assert result.mu == pytest.approx(effective_mu, rel=0.15)
    assert result.eps_estimate == gaussian_epsilon(result.mu, DELTA)
    assert result.eps_estimate == pytest.approx(gaussian_epsilon(effective_mu, DELTA), rel=0.25)
    assert not result.report.violation


def test_update_view_flags_unnoised_canaries_and_clears_an_unrelated_update():
    update, canaries, in_mask = _canary_world(seed=15, noise=0.0)
    cosines = canary_cosines(update, canaries)
    leaked = cosine_view_audit(cosines, in_mask, Claim(CLAIM, DELTA), rng=np.random.default_rng(0))
    assert leaked.eps_estimate > 10 and leaked.report.eps_lower_bound > 2.5 and leaked.report.violation
    assert verdict(leaked.report.eps_lower_bound, CLAIM).label == "violation"
    unrelated = np.random.default_rng(16).normal(size=canaries.shape[1])
    unrelated_cosines = canary_cosines(unrelated, canaries)
    clean = cosine_view_audit(unrelated_cosines, in_mask, Claim(CLAIM, DELTA), rng=np.random.default_rng(0))
    assert clean.report.eps_lower_bound < 0.3 and verdict(clean.report.eps_lower_bound, CLAIM).label == "no violation"
    assert clean.mu < 0.4  # an estimate: sampling noise alone, no confidence level


def test_gaussian_epsilon_estimate_reads_the_shift_in_units_of_the_null_spread():
    outside = np.array([-1.0, 0.0, 1.0])  # mean 0, sample std 1
    eps, mu = gaussian_epsilon_estimate(np.array([2.0, 2.0]), outside, DELTA)
    assert mu == pytest.approx(2.0) and eps == pytest.approx(gaussian_epsilon(2.0, DELTA))
    assert gaussian_epsilon_estimate(np.array([0.5, 0.5]), np.zeros(3), DELTA) == (math.inf, math.inf)


# ------------------------------------------------------------------------------------------------
# Verdict
# ------------------------------------------------------------------------------------------------


def test_verdict_branches_and_reasons():
    assert verdict(0.8, 0.5) == ("violation", "violation: eps lower bound 0.8 > claimed eps 0.5")
    # A proven leak stands even when the model underfits.
    assert verdict(0.8, 0.5, accuracy=0.3, control_accuracy=0.9).label == "violation"
    assert verdict(0.0, 0.5, accuracy=0.617, control_accuracy=0.941) == (
        "inconclusive",
        "inconclusive: the model underfits (acc 0.617 vs control 0.941)",
    )
    assert verdict(0.0, 0.5, accuracy=0.93, control_accuracy=0.941).label == "no violation"  # within the margin
    assert verdict(0.2, 0.5, accuracy=0.9).label == "no violation"  # no control: no underfit check
    assert verdict(0.5, 0.5).reason == "no violation: eps lower bound 0.5 <= claimed eps 0.5"
    assert verdict(7.0, math.inf).reason == "no violation: eps lower bound 7 <= no privacy claim"
    with pytest.raises(ValueError):
        verdict(-1.0, 0.5)


def test_an_underfit_model_that_leaks_nothing_is_inconclusive():
    world = _world(seed=17, boost=0.0)
    report = _audit(lira_offline_scores(world["target"], world["references"], world["in_mask"]), world["member"])
    assert not report.violation
    assert verdict(report.eps_lower_bound, CLAIM, accuracy=0.62, control_accuracy=0.94).label == "inconclusive"


def test_one_run_bound_is_the_best_fraction_at_beta_over_their_number_and_pooled_counts_add():
    rng = np.random.default_rng(5)
    coins = rng.random(400) < 0.5
    scores = np.where(coins, 1.0, 0.0) + rng.normal(0.0, 0.8, 400)
    counts = one_run_counts(scores, coins)
    assert [c.guesses for c in counts] == [2 * max(1, int(f * 400)) for f in ONE_RUN_FRACTIONS]
    beta = (1.0 - CONFIDENCE) / len(ONE_RUN_FRACTIONS)
    each = [one_run_eps_lower_bound(c.guesses, c.correct, c.canaries, DELTA, beta) for c in counts]
    bound, best = one_run_bound(counts, DELTA)
    assert bound == max(each) > 0.0 and best == counts[each.index(max(each))]
    again = one_run_counts(-scores, coins)  # a second, independent run whose guesses are all wrong
    pooled = [a + b for a, b in zip(counts, again)]
    assert pooled[0] == OneRunCounts(2 * counts[0].guesses, counts[0].correct + again[0].correct, 800)
    assert one_run_bound(pooled, DELTA)[0] < bound
