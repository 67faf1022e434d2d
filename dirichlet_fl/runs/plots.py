"""Pictures of run folders: curves.png (dirichlet_fl.runs.writer draws it as a run goes) and
`dirichlet-fl plot` overlays.

Read from a run folder's rounds.csv and ledger.csv (dirichlet_fl.runs.writer), so a picture shows exactly
what the files hold. Three panels: central test accuracy (with balanced accuracy and macro AUC, dashed
and dotted, where rounds.csv has them) and central loss per round, and each
client's eps (at the run's delta) over the rounds against its target, refusals marked. With several
runs, the eps panel shows each run's largest client eps and its largest target.

matplotlib is imported only when a picture is drawn (the server and the clients never pay for it
otherwise), and only its object-oriented Agg API is used: no pyplot, no global figure state.
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass
from pathlib import Path

from dirichlet_fl.files import atomic_path

CURVES_FILE = "curves.png"
CURVES_EVERY_S = 10.0
"""A run's curves.png is redrawn after a round once this many seconds have passed since it was last drawn (or
since the run started), and always when the run finishes: a drawing (matplotlib) costs a good part of a second
of CPU, as much as a whole round of a small simulation."""


@dataclass(frozen=True)
class RunCurves:
    """What a picture needs from one run folder."""

    name: str
    rounds: list[int]
    accuracy: list[float]
    balanced_accuracy: list[float]
    macro_auc: list[float]
    loss: list[float]
    epsilon: dict[int, list[tuple[int, float]]]
    """client -> [(round, eps after that round)] (0 before a client's first step)."""
    target: dict[int, float]
    refusals: dict[int, list[tuple[int, float]]]
    """client -> [(round, eps at the refusal)]."""
    delta: str


def _float(text: str) -> float:
    return float(text) if text not in ("", "nan") else math.nan


def read_curves(run_dir: str | Path) -> RunCurves:
    """The curves of one run folder; FileNotFoundError naming the folder when it holds no rounds.csv."""
    directory = Path(run_dir)
    if not (directory / "rounds.csv").is_file():
        raise FileNotFoundError(f"{directory}: no rounds.csv; is this a dirichlet-fl run folder?")
    with open(directory / "rounds.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    epsilon: dict[int, list[tuple[int, float]]] = {}
    target: dict[int, float] = {}
    refusals: dict[int, list[tuple[int, float]]] = {}
    delta = ""
    ledger = directory / "ledger.csv"
    if ledger.is_file():
        with open(ledger, newline="") as handle:
            for row in csv.DictReader(handle):
                client, server_round, eps = int(row["client"]), int(row["round"]), _float(row["epsilon"])
                epsilon.setdefault(client, []).append((server_round, eps))
                target[client] = _float(row["target_epsilon"])
                delta = row["delta"]
                if row["status"] == "refused":
                    refusals.setdefault(client, []).append((server_round, eps))
    return RunCurves(
        name=directory.name,
        rounds=[int(row["round"]) for row in rows],
        accuracy=[_float(row["central_accuracy"]) for row in rows],
        balanced_accuracy=[_float(row.get("central_balanced_accuracy", "")) for row in rows],
        macro_auc=[_float(row.get("central_macro_auc", "")) for row in rows],
        loss=[_float(row["central_loss"]) for row in rows],
        epsilon=epsilon,
        target=target,
        refusals=refusals,
        delta=delta,
    )


def draw_curves(runs: list[RunCurves], path: str | Path) -> None:
    """Draw accuracy, loss and eps panels for one run (every client) or several (overlaid) to `path`,
    written atomically (a viewer never sees half a file)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(13, 3.8), constrained_layout=True)
    FigureCanvasAgg(figure)
    accuracy_axis, loss_axis, eps_axis = figure.subplots(1, 3)
    for run in runs:
        label = run.name if len(runs) > 1 else None
        line = accuracy_axis.plot(run.rounds, run.accuracy, marker=".", label=label or "accuracy")[0]
        extra_curves = ((run.balanced_accuracy, "--", "balanced accuracy"), (run.macro_auc, ":", "macro AUC"))
        for values, style, name in extra_curves:
            if any(not math.isnan(v) for v in values):
                accuracy_axis.plot(run.rounds, values, linestyle=style, color=line.get_color(),
                                   label=None if label else name)
        loss_axis.plot(run.rounds, run.loss, marker=".", label=label)
    accuracy_axis.set(title="central test accuracy (-- balanced, : macro AUC)", xlabel="round", ylim=(0.0, 1.0))
    loss_axis.set(title="central test loss", xlabel="round")
    if len(runs) == 1:
        _client_epsilons(eps_axis, runs[0])
    else:
        _largest_epsilons(eps_axis, runs)
    eps_axis.set_ylim(bottom=0.0)
    for axis in (accuracy_axis, loss_axis, eps_axis):
        axis.grid(alpha=0.3)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    accuracy_axis.legend(fontsize="small")
    delta = runs[0].delta if runs and runs[0].delta else "?"
    eps_axis.set(title=f"client eps (delta={delta}); x: refused", xlabel="round")
    with atomic_path(Path(path)) as temporary:
        figure.savefig(temporary, dpi=90, format="png")


def _client_epsilons(axis, run: RunCurves) -> None:
    """Each client's eps over the rounds, its target dashed in the same colour, refusals as x."""
    for client, points in sorted(run.epsilon.items()):
        rounds, values = zip(*points)
        line = axis.plot(rounds, values, marker=".", linewidth=1, label=f"client {client}")[0]
        axis.axhline(run.target[client], color=line.get_color(), linestyle="--", linewidth=0.8)
        if run.refusals.get(client):
            axis.plot(*zip(*run.refusals[client]), linestyle="none", marker="x", markersize=9,
                      color=line.get_color())
    if 1 < len(run.epsilon) <= 12:
        axis.legend(fontsize="x-small", ncol=2)


def _largest_epsilons(axis, runs: list[RunCurves]) -> None:
    """Each run's largest client eps per round, its largest target dashed, rounds with a refusal as x."""
    for run in runs:
        by_round: dict[int, float] = {}
        for points in run.epsilon.values():
            for server_round, eps in points:
                by_round[server_round] = max(by_round.get(server_round, 0.0), eps)
        if not by_round:
            continue
        rounds = sorted(by_round)
        line = axis.plot(rounds, [by_round[r] for r in rounds], marker=".", label=run.name)[0]
        axis.axhline(max(run.target.values()), color=line.get_color(), linestyle="--", linewidth=0.8)
        refused = sorted({r for points in run.refusals.values() for r, _ in points})
        if refused:
            axis.plot(refused, [by_round[r] for r in refused], linestyle="none", marker="x", markersize=9,
                      color=line.get_color())


def plot_runs(run_dirs: list[str | Path], path: str | Path) -> None:
    """Overlay the curves of several run folders (one folder: every client's eps) in one picture."""
    draw_curves([read_curves(directory) for directory in run_dirs], path)


class RunCurvesFile:
    """A run folder's curves.png as the run goes: redrawn from the folder's rows after a round once CURVES_EVERY_S
    passed since its last drawing, and by draw() (the run's end) whenever a round came since."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.drawn_at = time.monotonic()
        self.stale = False
        """Whether rounds.csv holds a round that the picture does not show yet."""

    def round_written(self) -> None:
        """A round's rows are on disk: redraw if CURVES_EVERY_S passed since the last drawing."""
        self.stale = True
        if time.monotonic() - self.drawn_at >= CURVES_EVERY_S:
            self.draw()

    def draw(self) -> None:
        """Redraw from the folder's rows if a round came since the last drawing."""
        if self.stale:
            plot_runs([self.directory], self.directory / CURVES_FILE)
            self.drawn_at, self.stale = time.monotonic(), False
