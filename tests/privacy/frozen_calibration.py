"""The r* solver as it stood before issue 33 (privacy/accounting/analysis.py at 8c18231), frozen as the reference that
the fast solver must reproduce: same r* to 1e-9 relative, never an eps above its target.

It evaluates eps(r) over every admissible order at once from a (lam, j) table of log Binomial(lam, q)
probabilities (power-of-two sizes up to 4096 x 4096), brackets r* by halving from alpha/2, and solves with
Brent's method (xtol 1e-12 alpha, rtol 1e-13), stepping down by xtol until eps(r) <= target. Near the floor
one solve takes half a minute, so its answers over the benchmark's grid are committed in
calibration_reference.json; regenerate them (about 10 minutes on an idle machine) with
  nice -n 10 .venv/bin/python -m tests.privacy.frozen_calibration
and time it on one group of the grid (BENCHMARKS.md's "before" column: docs/accountant/before.json) with
  nice -n 10 .venv/bin/python -m tests.privacy.frozen_calibration --time issue-33 --out docs/accountant/before.json
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp, polygamma
from scipy.stats import binom

SOLVER = "calibrate_r of privacy/accounting/analysis.py at 8c18231, before issue 33"
MAX_ORDER = 4096
REFERENCE = Path(__file__).with_name("calibration_reference.json")


def top_order(r: float, alpha: float) -> int:
    """Largest order lam <= MAX_ORDER with alpha - (lam - 1) r > 0."""
    order = min(MAX_ORDER, math.ceil(1.0 + alpha / r) - 1)
    while order >= 2 and not alpha - (order - 1) * r > 0:
        order -= 1
    return order


@functools.lru_cache(maxsize=2)  # 8 before: 2 keeps a test process under 300 MB; the values are the same
def log_binomial_table(size: int, q: float) -> np.ndarray:
    """log P(J = j), J ~ Binomial(lam, q), for lam, j in 0..size (-inf for j > lam)."""
    log_factorial = gammaln(np.arange(size + 1) + 1.0)
    lam = np.arange(size + 1)[:, None]
    j = np.arange(size + 1)[None, :]
    with np.errstate(invalid="ignore"):
        table = (log_factorial[lam] - log_factorial[j] - log_factorial[np.clip(lam - j, 0, None)]
                 + j * math.log(q) + (lam - j) * math.log1p(-q))
    return np.where(j <= lam, table, -np.inf)


def log_excess_weights(r: float, alpha: float, top: int) -> np.ndarray:
    """log(w_j - 1), j = 0..top: w_2 = exp(e(2)), w_j = 3 exp((j - 1) e(j)); -inf at j = 0, 1."""
    j = np.arange(top + 1, dtype=np.float64)
    out = np.full(top + 1, -np.inf)
    e = j[2:] * r * r * polygamma(1, alpha - (j[2:] - 1.0) * r)
    out[2] = e[0] + math.log(-math.expm1(-e[0]))
    x = (j[3:] - 1.0) * e[1:]
    out[3:] = math.log(3.0) + x + np.log1p(-np.exp(-x) / 3.0)
    return out


def to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> tuple[float, int]:
    """Lemma 13: (smallest eps over the orders, its order)."""
    lam = orders.astype(np.float64)
    eps = rdp + np.log(lam - 1.0) - (math.log(delta) + lam * np.log(lam)) / (lam - 1.0)
    eps = np.where(np.isnan(eps), np.inf, eps)
    best = int(np.argmin(eps))
    return float(max(eps[best], 0.0)), int(orders[best])


def epsilon(r: float, alpha: float, q: float, steps: int, delta: float) -> tuple[float, int]:
    """eps(r) of T steps and its order: Theorem 10 over every admissible order, in log space."""
    top = top_order(r, alpha)
    size = max(16, 1 << (top - 1).bit_length())
    log_pmf = log_binomial_table(size, q)[2 : top + 1, : top + 1]
    log_b_minus_one = logsumexp(log_pmf + log_excess_weights(r, alpha, top)[None, :], axis=1)
    orders = np.arange(2, top + 1)
    rdp = np.logaddexp(0.0, log_b_minus_one) / (orders - 1.0)
    return to_epsilon(orders, steps * rdp, delta)


def floor(q: float, steps: int, delta: float) -> float:
    """lim r -> 0 of eps(r): B - 1 -> 2 P(J >= 3)."""
    orders = np.arange(2, MAX_ORDER + 1)
    return to_epsilon(orders, steps * np.log1p(2.0 * binom.sf(2, orders, q)) / (orders - 1.0), delta)[0]


def calibrate(target: float, delta: float, q: float, steps: int, alpha: float) -> float | None:
    """r* = sup{r in (0, alpha) : eps(r) <= target}, or None when target <= the floor."""

    def excess(r: float) -> float:
        return epsilon(r, alpha, q, steps, delta)[0] - target

    if target <= floor(q, steps, delta):
        return None
    high, low = alpha * (1.0 - 1e-12), alpha / 2.0
    while excess(low) > 0.0:
        high, low = low, low / 2.0
    if excess(high) <= 0.0:
        return high
    xtol = 1e-12 * alpha
    low = brentq(excess, low, high, xtol=xtol, rtol=1e-13)
    while excess(low) > 0.0:
        low -= xtol
    return low


def reference_row(setting: dict[str, object]) -> dict[str, object]:
    """One grid configuration with the frozen solver's r*, eps(r*) and order, and its time."""
    args = (setting["epsilon"], setting["delta"], setting["sample_rate"], setting["steps"], setting["alpha"])
    start, cpu = time.perf_counter(), time.process_time()
    r = calibrate(*args)  # type: ignore[arg-type]
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if r is None:
        return {**setting, "r_star": None, "seconds": seconds, "cpu_seconds": cpu}
    eps, order = epsilon(r, setting["alpha"], setting["sample_rate"], setting["steps"], setting["delta"])  # type: ignore[arg-type]
    return {**setting, "r_star": r, "epsilon_at_r_star": eps, "order": order, "seconds": seconds,
            "cpu_seconds": cpu}


def _settings(group: str | None) -> list[dict[str, object]]:
    from sims.bench.accountant import grid

    return [{"group": s.group, "name": s.name, "alpha": s.alpha, "sample_rate": s.sample_rate, "steps": s.steps,
             "epsilon": s.epsilon, "delta": s.delta} for s in grid() if group is None or s.group == group]


def main(argv: list[str]) -> None:
    """Write calibration_reference.json over the whole grid, or (--time GROUP --out FILE) time one group."""
    parser = argparse.ArgumentParser(prog="python -m tests.privacy.frozen_calibration")
    parser.add_argument("--time", metavar="GROUP", help="time the frozen solver on this group of the grid only")
    parser.add_argument("--out", help="where --time writes its JSON")
    args = parser.parse_args(argv)
    if args.time and not args.out:
        parser.error("--time needs --out")
    load_before = os.getloadavg()
    rows = []
    for setting in _settings(args.time):
        rows.append(reference_row(setting))
        print(json.dumps(rows[-1]), flush=True)
    if args.time:
        command = f"python -m tests.privacy.frozen_calibration {' '.join(argv)}"
        Path(args.out).write_text(json.dumps({
            "solver": SOLVER, "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "load_before": list(load_before),
            "load_after": list(os.getloadavg()), "rows": rows}, indent=1) + "\n")
    else:
        write_reference(rows)


def write_reference(rows: list[dict[str, object]]) -> None:
    """calibration_reference.json: the solver's name, then one grid row per line."""
    lines = ",\n".join(json.dumps(row) for row in rows)
    REFERENCE.write_text(f'{{"solver": {json.dumps(SOLVER)}, "rows": [\n{lines}\n]}}\n')


if __name__ == "__main__":
    main(sys.argv[1:])
