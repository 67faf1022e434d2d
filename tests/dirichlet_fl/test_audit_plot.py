"""dirichlet_fl/runs/audit_plot.py draws audit reports and bare ROC curves into one PNG, written atomically."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dirichlet_fl.runs.audit_plot import plot_roc
from privacy.audit.report import Claim, audit


def test_reports_and_curves_are_drawn_into_a_png_and_nothing_else_is_left(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    report = audit(rng.normal(3, 1, 600), rng.normal(0, 1, 600), Claim(1.0, 1e-5, "weights"), rng=rng)
    no_claim = audit(rng.normal(3, 1, 600), rng.normal(0, 1, 600), Claim(math.inf, 1e-5, "nothing"), rng=rng)
    target = tmp_path / "audit" / "roc.png"
    plot_roc({"claimed": report, "none": no_claim.roc}, target, "test")
    assert target.read_bytes()[:4] == b"\x89PNG" and [path.name for path in target.parent.iterdir()] == ["roc.png"]
