"""ROC curves of membership attacks as a PNG (matplotlib is imported only when a plot is drawn).

Presentation, not privacy: it draws privacy.audit's ROC curves and writes the file through
dirichlet_fl.files, so it sits in the foundation beside the run audit (run_audit.py) that draws with it,
as sims/audit/experiment.py does."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dirichlet_fl.files import atomic_path
from privacy.audit.report import AuditReport
from privacy.audit.statistics import RocCurve


def plot_roc(
    curves: AuditReport | RocCurve | Mapping[str, AuditReport | RocCurve], path: str | Path, title: str = ""
) -> None:
    """Write ROC curves to `path` (PNG, atomically): linear axes, and log-log axes where the low-FPR tail shows."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    named = curves if isinstance(curves, Mapping) else {"": curves}
    figure = Figure(figsize=(10, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    linear, logarithmic = figure.subplots(1, 2)
    labelled = False
    for label, item in named.items():
        curve = item.roc if isinstance(item, AuditReport) else item
        if isinstance(item, AuditReport):
            label = f"{label} AUC {item.auc:.3f}, eps_lb {item.eps_lower_bound:.2f}".strip()
        labelled = labelled or bool(label)
        linear.plot(curve.fpr, curve.tpr, label=label or None)
        logarithmic.plot(curve.fpr[1:], curve.tpr[1:], label=label or None)
    for axes, scale in ((linear, "linear"), (logarithmic, "log")):
        axes.plot([1e-4, 1], [1e-4, 1], color="grey", linestyle=":", linewidth=1)
        axes.set(xscale=scale, yscale=scale, xlabel="false positive rate", ylabel="true positive rate")
    linear.set(xlim=(0, 1), ylim=(0, 1), title="ROC of the membership attacks")
    logarithmic.set(title="low false-positive region")
    if labelled:
        linear.legend(fontsize=7, loc="lower right")
    if title:
        figure.suptitle(title)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as temporary:
        figure.savefig(temporary, dpi=100, format="png")
