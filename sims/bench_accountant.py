"""`bench accountant`: how long one r* solve (privacy.analysis.calibrate_r) takes, against a plain loop.

Every client solves equation (1) once per run, and a sweep solves it once per cell, so the solve
must be cheap. The grid is the paper's four (q, T) settings (Section 4.1.2) x eps in {1, 2, 4, 8}
(delta = 1e-5) x alpha in {1, 3}. Each configuration is solved `--repeats` times with the module's
caches warm, and once cold (the binomial tables cleared first, as in a client's first solve).

The reference is what a direct transcription of Theorem 10 does: a Python loop over the admissible
orders, each order evaluated with numpy over j (trigamma and binomial terms recomputed per order),
solved by Brent's method over the whole interval. What calibrate_r does instead (docs/privacy.md):
trigamma once per r, one memoised log-binomial table, all orders at once in log space, and a
bracket found by halving from alpha/2 before Brent. It is slow (about a second per solve), so only
`--reference-configs` configurations are timed with it, and its r* is checked against calibrate_r's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp, polygamma

from privacy import analysis
from privacy.analysis import DEFAULT_MAX_ORDER, PAPER_DELTA, UnreachableEpsilonError, calibrate_r

PAPER_SETTINGS = {
    "cifar10": (0.005, 20_000),
    "dermamnist": (70 / 7007, 6006),
    "mnist": (250 / 60_000, 9600),
    "svhn": (250 / 73_257, 11_722),
}
"""(sampling rate q, steps T) per data set, Section 4.1.2 of the paper."""
EPSILONS = (1.0, 2.0, 4.0, 8.0)
ALPHAS = (1.0, 3.0)
TARGET_SECONDS = 0.010


@dataclass(frozen=True)
class Setting:
    """One r* problem of the grid."""

    dataset: str
    sample_rate: float
    steps: int
    epsilon: float
    alpha: float

    def solve(self) -> float:
        """calibrate_r's r*."""
        return calibrate_r(self.epsilon, PAPER_DELTA, self.sample_rate, self.steps, self.alpha).r


def grid() -> list[Setting]:
    """The paper's (q, T) settings x EPSILONS x ALPHAS."""
    return [
        Setting(name, q, steps, eps, alpha)
        for name, (q, steps) in PAPER_SETTINGS.items()
        for eps in EPSILONS
        for alpha in ALPHAS
    ]


def reference_epsilon(r: float, setting: Setting, max_order: int = DEFAULT_MAX_ORDER) -> float:
    """Theorem 10, order by order: min over 2 <= lam < 1 + alpha/r (lam <= max_order) of eps_o(lam)."""
    q, alpha = setting.sample_rate, setting.alpha
    best = math.inf
    lam = 2
    while lam <= max_order and alpha - (lam - 1) * r > 0:
        j = np.arange(lam + 1, dtype=np.float64)
        log_pmf = gammaln(lam + 1.0) - gammaln(j + 1.0) - gammaln(lam - j + 1.0) + j * math.log(q)
        log_pmf = log_pmf + (lam - j) * math.log1p(-q)
        e = j * r * r * polygamma(1, alpha - (j - 1.0) * r)
        log_weights = np.concatenate(([0.0, 0.0, e[2]], math.log(3.0) + (j[3:] - 1.0) * e[3:]))
        log_bracket = float(logsumexp(log_pmf + log_weights))
        eps = setting.steps / (lam - 1) * log_bracket + math.log(lam - 1)
        best = min(best, eps - (math.log(PAPER_DELTA) + lam * math.log(lam)) / (lam - 1))
        lam += 1
    return best


def reference_solve(setting: Setting) -> float:
    """r* from reference_epsilon by Brent's method over the whole interval (alpha / 1000, alpha), with
    no bracket search first: the small-r end admits a thousand orders, which is where the time goes."""

    def excess(r: float) -> float:
        return reference_epsilon(r, setting) - setting.epsilon

    return brentq(excess, setting.alpha * 1e-3, setting.alpha * (1.0 - 1e-12), xtol=1e-12 * setting.alpha,
                  rtol=1e-13)


def _seconds(action) -> tuple[float, object]:
    start = time.perf_counter()
    value = action()
    return time.perf_counter() - start, value


def _cold_seconds(setting: Setting) -> float:
    """One solve after clearing calibrate_r's memoised binomial tables (a client's first solve)."""
    analysis._log_binomial_table.cache_clear()
    return _seconds(setting.solve)[0]


def time_grid(settings: list[Setting], repeats: int) -> list[dict[str, object]]:
    """Per configuration: r*, its median warm solve time, its cold time; or the floor if unreachable."""
    rows = []
    for setting in settings:
        row: dict[str, object] = {**setting.__dict__, "delta": PAPER_DELTA}
        try:
            cold = _cold_seconds(setting)
        except UnreachableEpsilonError as error:
            rows.append({**row, "unreachable": True, "floor": error.floor})
            continue
        warm = [_seconds(setting.solve) for _ in range(repeats)]
        rows.append({**row, "unreachable": False, "r_star": warm[0][1], "cold_seconds": cold,
                     "warm_seconds": statistics.median(seconds for seconds, _ in warm)})
    return rows


def time_reference(settings: list[Setting]) -> list[dict[str, object]]:
    """Reference solve time and r* for each setting, with calibrate_r's r* and time beside it."""
    rows = []
    for setting in settings:
        reference_seconds, reference_r = _seconds(lambda: reference_solve(setting))
        fast_seconds, fast_r = _seconds(setting.solve)
        rows.append({**setting.__dict__, "delta": PAPER_DELTA, "reference_seconds": reference_seconds,
                     "reference_r_star": reference_r, "fast_seconds": fast_seconds, "fast_r_star": fast_r})
    return rows




def _reference_settings(settings: list[Setting], rows: list[dict[str, object]], count: int) -> list[Setting]:
    """`count` reachable settings spread over the grid (the reference is too slow for all of them)."""
    reachable = [s for s, row in zip(settings, rows) if not row["unreachable"]]
    if count <= 0 or not reachable:
        return []
    step = max(1, len(reachable) // count)
    return reachable[::step][:count]


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    """Time the grid and the reference; return the report."""
    if args.repeats < 1 or args.reference_configs < 0:
        raise ValueError("--repeats must be >= 1 and --reference-configs >= 0")
    settings = grid()
    rows = time_grid(settings, args.repeats)
    solved = [row for row in rows if not row["unreachable"]]
    reference = time_reference(_reference_settings(settings, rows, args.reference_configs))
    median = statistics.median(row["warm_seconds"] for row in solved)
    report: dict[str, object] = {
        "median_seconds": median,
        "max_seconds": max(row["warm_seconds"] for row in solved),
        "median_cold_seconds": statistics.median(row["cold_seconds"] for row in solved),
        "solves": len(solved),
        "unreachable": [row for row in rows if row["unreachable"]],
        "target_seconds": TARGET_SECONDS,
        "target_met": median <= TARGET_SECONDS,
        "grid": rows,
        "reference": reference,
        "config": {"settings": PAPER_SETTINGS, "epsilons": EPSILONS, "alphas": ALPHAS, "delta": PAPER_DELTA,
                   "repeats": args.repeats, "max_order": DEFAULT_MAX_ORDER},
    }
    if reference:
        report["reference_median_seconds"] = statistics.median(row["reference_seconds"] for row in reference)
        report["speedup_over_reference"] = report["reference_median_seconds"] / statistics.median(
            row["fast_seconds"] for row in reference
        )
        report["reference_max_abs_r_difference"] = max(
            abs(row["reference_r_star"] - row["fast_r_star"]) for row in reference
        )
    return report


def summary_lines(report: dict[str, object]) -> list[str]:
    """Human-readable lines: medians, target, and the reference comparison."""
    state = "met" if report["target_met"] else "MISSED"
    lines = [
        f"r* solve (calibrate_r), {report['solves']} configurations (delta={PAPER_DELTA:g}): median "
        f"{report['median_seconds'] * 1e3:.2f} ms warm, {report['median_cold_seconds'] * 1e3:.2f} ms cold, "
        f"max {report['max_seconds'] * 1e3:.2f} ms (target <= {TARGET_SECONDS * 1e3:g} ms: {state})"
    ]
    for row in report["unreachable"]:
        lines.append(f"  unreachable: {row['dataset']} eps={row['epsilon']:g} (delta={PAPER_DELTA:g}) "
                     f"alpha={row['alpha']:g}: floor {row['floor']:.4f}")
    if report["reference"]:
        lines.append(
            f"plain reference loop: median {report['reference_median_seconds']:.3f} s per solve over "
            f"{len(report['reference'])} configurations, {report['speedup_over_reference']:.0f}x slower; "
            f"max |r* difference| {report['reference_max_abs_r_difference']:.2e}"
        )
    return lines
