"""`bench accountant`: how long one r* solve (privacy.accounting.analysis.calibrate_r) takes, near the floor included.

Every client solves equation (1) once per run, and a sweep solves it once per cell, so the solve must be
cheap everywhere, also just above the Theorem 10 floor where only orders in the thousands admit an r
(issue 33: half a minute per solve there before). The grid has four groups (GROUPS): the paper's four
(q, T) settings (Section 4.1.2) x eps in {1, 2, 4, 8} x alpha in {1, 3}; issue 33's four rows; targets
0.1 %, 1 % and 10 % above the floor; and 313 configurations drawn log-uniformly from alpha 0.5-10,
q 1e-3-0.1, T 100-50,000, eps 0.5-8, delta 1e-5 or 1e-6 (seeded). Each configuration is solved once
cold (calibrate_r's caches cleared first, as in a client's first solve) and `--repeats` times warm,
each timed in wall and in CPU seconds (the CPU time is what a loaded machine does not inflate); the
targets (median <= 5 ms, max <= 1 s per solve) are checked on each.

The reference is what a direct transcription of Theorem 10 does: a Python loop over the admissible
orders, each order evaluated with numpy over j (trigamma and binomial terms recomputed per order),
solved by Brent's method over the whole interval. It is slow (about a second per solve), so only
`--reference-configs` configurations of the paper's group are timed with it, and its r* is checked
against calibrate_r's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp, polygamma

from privacy.accounting import rdp
from privacy.accounting.analysis import PAPER_DELTA, Calibration, UnreachableEpsilonError, calibrate_r, epsilon_floor
from privacy.accounting.rdp import DEFAULT_MAX_ORDER

PAPER_SETTINGS = {
    "cifar10": (0.005, 20_000),
    "dermamnist": (70 / 7007, 6006),
    "mnist": (250 / 60_000, 9600),
    "svhn": (250 / 73_257, 11_722),
}
"""(sampling rate q, steps T) per data set, Section 4.1.2 of the paper."""
EPSILONS = (1.0, 2.0, 4.0, 8.0)
ALPHAS = (1.0, 3.0)
ISSUE_33 = ((3.0, 0.05, 3000, 1.0), (0.5, 0.05, 3000, 1.0), (3.0, 0.05, 3000, 3.0), (3.0, 0.01, 1000, 1.0))
"""(alpha, q, T, eps) of issue 33's table: the three slowest solves measured before the change, and a fast one."""
NEAR_FLOOR = ((0.05, 3000, 1e-5), (0.01, 1000, 1e-6), (0.001, 100, 1e-5), (0.1, 500, 1e-6))
"""(q, T, delta) whose targets are set just above their Theorem 10 floor (orders in the thousands)."""
NEAR_FLOOR_FACTORS = (1.001, 1.01, 1.1)
NEAR_FLOOR_ALPHAS = (0.5, 10.0)
RANDOM_SIZE, RANDOM_SEED = 313, 313
"""The random group: issue 33's 313-style configurations, log-uniform over the ranges below."""
RANGES = {"alpha": (0.5, 10.0), "sample_rate": (1e-3, 0.1), "steps": (100, 50_000), "epsilon": (0.5, 8.0)}
DELTAS = (1e-5, 1e-6)
GROUPS = ("paper", "issue-33", "near-floor", "random")
TARGET_MEDIAN_SECONDS = 0.005
TARGET_MAX_SECONDS = 1.0


@dataclass(frozen=True)
class Setting:
    """One r* problem of the grid."""

    group: str
    name: str
    sample_rate: float
    steps: int
    epsilon: float
    alpha: float
    delta: float = PAPER_DELTA

    def solve(self) -> float:
        """calibrate_r's r*."""
        return calibrate_r(self.epsilon, self.delta, self.sample_rate, self.steps, self.alpha).r


def _paper() -> list[Setting]:
    """The paper's (q, T) settings x EPSILONS x ALPHAS, delta 1e-5."""
    return [Setting("paper", name, q, steps, eps, alpha)
            for name, (q, steps) in PAPER_SETTINGS.items() for eps in EPSILONS for alpha in ALPHAS]


def _issue_33() -> list[Setting]:
    return [Setting("issue-33", f"row {i + 1}", q, steps, eps, alpha)
            for i, (alpha, q, steps, eps) in enumerate(ISSUE_33)]


def _near_floor() -> list[Setting]:
    """Targets 0.1 %, 1 % and 10 % above the floor: only orders near the floor's admit an r."""
    settings = []
    for q, steps, delta in NEAR_FLOOR:
        floor = epsilon_floor(q, steps, delta).epsilon
        for factor in NEAR_FLOOR_FACTORS:
            target = float(f"{floor * factor:.6g}")
            settings += [Setting("near-floor", f"floor x {factor:g}", q, steps, target, alpha, delta)
                         for alpha in NEAR_FLOOR_ALPHAS]
    return settings


def _random() -> list[Setting]:
    """RANDOM_SIZE configurations, each parameter log-uniform over RANGES (3 significant digits), delta
    1e-5 or 1e-6; seeded, so that the grid is the same on every run (many are below their floor)."""
    rng = np.random.default_rng(RANDOM_SEED)

    def draw(key: str) -> float:
        low, high = RANGES[key]
        return float(f"{math.exp(rng.uniform(math.log(low), math.log(high))):.3g}")

    settings = []
    for i in range(RANDOM_SIZE):
        alpha, q, steps, eps = draw("alpha"), draw("sample_rate"), int(draw("steps")), draw("epsilon")
        settings.append(Setting("random", f"#{i}", q, steps, eps, alpha, DELTAS[int(rng.integers(len(DELTAS)))]))
    return settings


def grid(groups: tuple[str, ...] = GROUPS) -> list[Setting]:
    """The benchmark's configurations, group by group (GROUPS)."""
    makers = {"paper": _paper, "issue-33": _issue_33, "near-floor": _near_floor, "random": _random}
    return [setting for group in groups for setting in makers[group]()]


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
        best = min(best, eps - (math.log(setting.delta) + lam * math.log(lam)) / (lam - 1))
        lam += 1
    return best


def reference_solve(setting: Setting) -> float:
    """r* from reference_epsilon by Brent's method over the whole interval (alpha / 1000, alpha), with
    no bracket search first: the small-r end admits a thousand orders, which is where the time goes."""

    def excess(r: float) -> float:
        return reference_epsilon(r, setting) - setting.epsilon

    return brentq(excess, setting.alpha * 1e-3, setting.alpha * (1.0 - 1e-12), xtol=1e-12 * setting.alpha,
                  rtol=1e-13)


def _seconds(action: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = action()
    return time.perf_counter() - start, value


def _timed(action: Callable[[], object]) -> tuple[float, float, object]:
    """Wall and CPU seconds of one call (CPU time shows the cost on a loaded machine), and its value."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = action()
    return time.perf_counter() - wall, time.process_time() - cpu, value


def clear_caches() -> None:
    """Forget everything calibrate_r memoises (tables of log-binomials, tails, log-factorials): a first solve."""
    rdp.clear_memoised()


def time_setting(setting: Setting, repeats: int) -> dict[str, Any]:
    """One configuration: its cold and median warm solve times (wall and CPU), r*, eps(r*) and its order;
    or its floor when the target is unreachable."""
    row: dict[str, Any] = dict(setting.__dict__)
    clear_caches()
    try:
        wall, cpu, found = _timed(lambda: calibrate_r(setting.epsilon, setting.delta, setting.sample_rate,
                                                      setting.steps, setting.alpha))
    except UnreachableEpsilonError as error:
        return {**row, "unreachable": True, "floor": error.floor}
    warm = [_timed(setting.solve) for _ in range(repeats)]
    assert isinstance(found, Calibration)
    return {**row, "unreachable": False, "r_star": found.r, "epsilon_at_r_star": found.epsilon,
            "order": found.order, "floor": found.floor, "cold_seconds": wall, "cold_cpu_seconds": cpu,
            "warm_seconds": statistics.median(w for w, _, _ in warm),
            "warm_cpu_seconds": statistics.median(c for _, c, _ in warm)}


def time_reference(settings: list[Setting]) -> list[dict[str, Any]]:
    """Reference solve time and r* for each setting, with calibrate_r's r* and time beside it."""
    rows = []
    for setting in settings:
        reference_seconds, reference_r = _seconds(lambda: reference_solve(setting))
        fast_seconds, fast_r = _seconds(setting.solve)
        rows.append({**setting.__dict__, "reference_seconds": reference_seconds,
                     "reference_r_star": reference_r, "fast_seconds": fast_seconds, "fast_r_star": fast_r})
    return rows


def _reference_settings(rows: list[dict[str, Any]], count: int) -> list[Setting]:
    """`count` reachable settings of the paper's group, spread over it (the reference is too slow for all)."""
    fields = Setting.__dataclass_fields__
    reachable = [Setting(**{key: row[key] for key in fields}) for row in rows
                 if row["group"] == "paper" and not row["unreachable"]]
    if count <= 0 or not reachable:
        return []
    step = max(1, len(reachable) // count)
    return reachable[::step][:count]


TIMES = ("cold", "warm", "cold_cpu", "warm_cpu")


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and maximum seconds per solve (TIMES) over the reachable rows, and the unreachable count."""
    solved = [row for row in rows if not row["unreachable"]]
    summary: dict[str, Any] = {"configurations": len(rows), "solves": len(solved),
                                  "unreachable": len(rows) - len(solved)}
    for kind in TIMES:
        seconds = [float(row[f"{kind}_seconds"]) for row in solved]
        summary[f"median_{kind}_seconds"] = statistics.median(seconds) if seconds else math.nan
        summary[f"max_{kind}_seconds"] = max(seconds) if seconds else math.nan
    return summary


def targets(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 33's targets, each on every kind of time (TIMES)."""
    checks = {}
    for kind in TIMES:
        for stat, limit in (("median", TARGET_MEDIAN_SECONDS), ("max", TARGET_MAX_SECONDS)):
            value = float(summary[f"{stat}_{kind}_seconds"])
            checks[f"{stat}_{kind}_seconds"] = {"value": value, "target": limit, "met": value <= limit}
    return checks


def parse_groups(text: str) -> tuple[str, ...]:
    """The --groups option: comma-separated names out of GROUPS."""
    groups = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in groups if name not in GROUPS]
    if not groups or unknown:
        raise ValueError(f"--groups={text!r} is not valid: give a comma-separated subset of {','.join(GROUPS)}")
    return groups


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Time the grid and the reference; return the report."""
    if args.repeats < 1 or args.reference_configs < 0:
        raise ValueError("--repeats must be >= 1 and --reference-configs >= 0")
    groups = parse_groups(args.groups)
    rows = [time_setting(setting, args.repeats) for setting in grid(groups)]
    reference = time_reference(_reference_settings(rows, args.reference_configs))
    summary = summarise(rows)
    over = [row for row in rows if not row["unreachable"] and row["epsilon_at_r_star"] > row["epsilon"]]
    report: dict[str, Any] = {
        **summary,
        "groups": {group: summarise([row for row in rows if row["group"] == group]) for group in groups},
        "targets": targets(summary),
        "over_target": len(over),
        "grid": rows,
        "reference": reference,
        "config": {"groups": groups, "paper_settings": PAPER_SETTINGS, "epsilons": EPSILONS, "alphas": ALPHAS,
                   "issue_33": ISSUE_33, "near_floor": NEAR_FLOOR, "near_floor_factors": NEAR_FLOOR_FACTORS,
                   "near_floor_alphas": NEAR_FLOOR_ALPHAS, "random_size": RANDOM_SIZE,
                   "random_seed": RANDOM_SEED, "ranges": RANGES, "deltas": DELTAS, "repeats": args.repeats,
                   "max_order": DEFAULT_MAX_ORDER},
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


def summary_lines(report: dict[str, Any]) -> list[str]:
    """Human-readable lines: per group and overall medians and maxima, the targets, the reference."""
    lines = []
    for group, summary in {**report["groups"], "all": report}.items():
        times = "; ".join(f"{kind.replace('_', ' ')} median {summary[f'median_{kind}_seconds'] * 1e3:.2f} ms, max "
                          f"{summary[f'max_{kind}_seconds'] * 1e3:.1f} ms" for kind in TIMES)
        lines.append(f"{group}: {summary['solves']} solves, {summary['unreachable']} unreachable; {times}")
    for name, check in report["targets"].items():
        lines.append(f"target {name} <= {check['target'] * 1e3:g} ms: {'met' if check['met'] else 'MISSED'}")
    lines.append(f"eps(r*) above its target: {report['over_target']}")
    if report["reference"]:
        lines.append(
            f"plain reference loop: median {report['reference_median_seconds']:.3f} s per solve over "
            f"{len(report['reference'])} configurations, {report['speedup_over_reference']:.0f}x slower; "
            f"max |r* difference| {report['reference_max_abs_r_difference']:.2e}"
        )
    return lines
