"""`dirichlet-fl calibrate`: r* for a target (eps, delta), sampling rate, steps and alpha (equation (1)).

Prints r* (rounded down, never up), the RDP order that attains it, eps(r*) <= target, the r -> 0
floor below which no r reaches the target, and the Theorem 11 factors that set the learning rate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from privacy.accounting.analysis import calibrate_r
from privacy.accounting.rdp import DEFAULT_MAX_ORDER
from privacy.attenuation import S_Y_FOR_LEARNING_RATE, attenuation
from privacy.registry import covers

PROG = "dirichlet-fl calibrate"
MAX_ORDER_CAP = 2 * DEFAULT_MAX_ORDER
"""The largest --max-order: the RDP curve's binomial table grows as the square of the order (one curve at a
small r took 45 s and 3.8 GB at 8,192 here, a quarter of that at the default 4,096)."""


def whole_number(text: str) -> int:
    """An argparse type: an integer, also written as 1e4; refuses a fraction."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid whole number: {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"invalid whole number: {text!r}")
    return int(value)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        description="r* = sup{r in (0, alpha): eps(r) <= epsilon} for T Poisson-sampled steps (Theorem 10).",
    )
    parser.add_argument("--epsilon", type=float, required=True, help="target eps > 0")
    parser.add_argument("--delta", type=float, default=1e-5, help="delta in (0, 1) (default 1e-5)")
    parser.add_argument("--sample-rate", type=float, required=True, help="Poisson sampling rate q in (0, 1)")
    parser.add_argument("--steps", type=int, required=True, help="training steps T >= 1")
    parser.add_argument("--alpha", type=float, default=3.0, help="Dirichlet offset alpha > 0 (default 3)")
    parser.add_argument("--max-order", type=whole_number, default=DEFAULT_MAX_ORDER,
                        help=f"largest RDP order evaluated (default {DEFAULT_MAX_ORDER}, at most {MAX_ORDER_CAP})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def floor_decimal(value: float, places: int = 6) -> str:
    """value rounded DOWN to `places` decimals, so that a printed r* never exceeds the true r*."""
    scale = 10**places
    return f"{math.floor(value * scale) / scale:.{places}f}"


def run(args: argparse.Namespace) -> int:
    if args.max_order > MAX_ORDER_CAP:
        print(f"{PROG}: error: --max-order={args.max_order} is out of range: at most {MAX_ORDER_CAP} (the cost "
              f"grows as the square of the order; the default {DEFAULT_MAX_ORDER} covers every r above "
              f"alpha/{DEFAULT_MAX_ORDER})", file=sys.stderr)
        return 2
    try:
        result = calibrate_r(args.epsilon, args.delta, args.sample_rate, args.steps, args.alpha, args.max_order)
    except ValueError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    kappa = attenuation(S_Y_FOR_LEARNING_RATE, result.r, result.alpha)
    report = {
        "r_star": result.r,
        "epsilon": result.epsilon,
        "target_epsilon": result.target_epsilon,
        "delta": result.delta,
        "sample_rate": result.sample_rate,
        "steps": result.steps,
        "alpha": result.alpha,
        "order": result.order,
        "floor": result.floor,
        "kappa_at_s_y_0_9": kappa,
        "learning_rate_multiplier": 1.0 / kappa,
        "covers": covers("dirichlet"),
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"r* = {floor_decimal(result.r)} (alpha={result.alpha:g}; rounded down)\n"
        f"eps(r*) = {result.epsilon:.6f} <= {result.target_epsilon:g} at delta={result.delta:g}, "
        f"sample rate q={result.sample_rate:g}, T={result.steps} steps, RDP order {result.order}\n"
        f"floor: no r > 0 reaches eps <= {result.floor:.6f} for this q, T and delta\n"
        f"kappa at s_y=0.9 = {kappa:.6f} (Theorem 11): a private step at rate gamma moves like a non-private "
        f"one at gamma*kappa; to match a non-private rate g, use gamma = g*{1.0 / kappa:.4f}\n"
        f"eps covers {covers('dirichlet')}"
    )
    return 0
