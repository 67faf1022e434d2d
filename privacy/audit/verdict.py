"""The audit's verdict: violation / no violation / inconclusive, with a one-line reason."""

from __future__ import annotations

import math
from typing import NamedTuple

VERDICTS = ("violation", "no violation", "inconclusive")


class Verdict(NamedTuple):
    """label: one of VERDICTS; reason: one line saying why."""

    label: str
    reason: str


def verdict(
    eps_lower_bound: float,
    claimed_eps: float,
    accuracy: float | None = None,
    control_accuracy: float | None = None,
    margin: float = 0.03,
) -> Verdict:
    """Label an audit: "violation" when the lower bound exceeds the claim, whatever the accuracy (the
    leak is proven); otherwise "inconclusive" when the audited model's accuracy is more than `margin` below the
    control's (a model that did not learn leaks nothing, so its clean audit says nothing about the
    mechanism); otherwise "no violation". The accuracy check runs only when both accuracies are given.
    claimed_eps = math.inf means no privacy claim, which nothing violates.
    """
    if math.isnan(eps_lower_bound) or eps_lower_bound < 0.0 or math.isnan(claimed_eps) or claimed_eps < 0.0:
        raise ValueError(f"need eps_lower_bound >= 0 and claimed_eps >= 0, got {eps_lower_bound!r} and {claimed_eps!r}")
    claim = f"claimed eps {claimed_eps:.3g}" if math.isfinite(claimed_eps) else "no privacy claim"
    if eps_lower_bound > claimed_eps:
        return Verdict("violation", f"violation: eps lower bound {eps_lower_bound:.3g} > {claim}")
    if accuracy is not None and control_accuracy is not None and accuracy < control_accuracy - margin:
        return Verdict(
            "inconclusive", f"inconclusive: the model underfits (acc {accuracy:.3f} vs control {control_accuracy:.3f})"
        )
    return Verdict("no violation", f"no violation: eps lower bound {eps_lower_bound:.3g} <= {claim}")
