"""The audit experiment's parameters (sims/audit/experiment.py), in a module that imports nothing heavy
so that the command line can show their defaults without loading torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dirichlet_fl.models.norms import check_norm
from privacy.accounting.analysis import PAPER_DELTA, epsilon_floor
from privacy.checks import check_choice, check_in_interval, check_in_open_interval, check_integer, check_positive
from privacy.mechanisms import LOSS_WEIGHTINGS
from privacy.registry import MECHANISMS, mechanism_class

CONTROL = "control"
"""The arm that never trains on a candidate (non-private, on as many other examples): the audit's
false-alarm level, and the accuracy every other arm is matched against."""
WEIGHTINGS = LOSS_WEIGHTINGS
"""The Dirichlet losses an arm can train with: the confidence-normalised NLL or the paper's."""
DEFAULT_WEIGHT_CAP = 20.0
"""The normalised loss's weight cap (the run config's dirichlet-weight-cap default; a test checks)."""
DEFAULT_RATE_GRIDS = (
    ("none", (0.0125, 0.025, 0.05)),
    ("dirichlet", (0.00625, 0.0125, 0.025, 0.05)),
    ("dpsgd", (0.02, 0.05, 0.2)),
)
"""Effective SGD rates each arm without a --rate tries, per mechanism: the rate of a plain step
(Mechanism.step_rate turns it into Dirichlet's rate / kappa(s_y = 0.9); DP-SGD's and none's are as given,
DP-SGD's on its noisy sum / expected batch size)."""
ADAM_RATE_GRIDS = tuple((mechanism, (3e-4, 1e-3, 3e-3)) for mechanism, _ in DEFAULT_RATE_GRIDS)
"""Adam's rates an arm tries (Adam's own units: no kappa; docs/learning-rates.md), when the optimizer is Adam."""
DEFAULT_CLIP_GRID = (0.5, 2.0)
"""DP-SGD clip norms C tried with each of its rates when --max-grad-norm is not given."""
DEFAULT_MAX_GRAD_NORM = 1.0
"""DP-SGD's clip norm when its rate is given (--rate) and --max-grad-norm is not."""
MIN_REFERENCES = 2


@dataclass(frozen=True)
class Arm:
    """One trained configuration: a mechanism at a target eps (math.inf for `none` and the control), and for
    a mechanism with named losses (Dirichlet) its loss (one of WEIGHTINGS)."""

    name: str
    mechanism: str
    epsilon: float
    weighting: str = ""


def reported_clip(arm: Arm, clip: float) -> float | None:
    """The clip norm a result row shows for `arm`: `clip` where its mechanism clips per-example gradients, else None
    (the unused value ExperimentConfig.clips gives the others)."""
    return clip if mechanism_class(arm.mechanism).per_example_gradients else None


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything that determines the experiment's result (saved with it)."""

    dataset: str = "mnist-idx"
    data_root: str | None = None
    epsilons: tuple[float, ...] = (1.0,)
    mechanism_epsilons: tuple[tuple[str, tuple[float, ...]], ...] = ()
    """(mechanism, its eps values) pairs that replace `epsilons` for the mechanisms named."""
    delta: float = PAPER_DELTA
    alpha: float = 3.0
    sample_rate: float = 0.01
    steps: int = 4000
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    candidates: int = 1000
    extra_train: int = 0
    validation: int = 1000
    """Non-candidate examples the rates are chosen on (never trained on, never a candidate)."""
    model: str = "lenet"
    """A network that fits under the Dirichlet loss with SGD (dirichlet_fl.models.networks.LeNet5x5), so that the
    arms can match the control's utility."""
    norm: str | None = None
    """None: the model's own (none for lenet), under which the normalised loss (the app's default) matched the
    control on every MNIST seed measured (docs/audit.md); the paper's loss needs GroupNorm ("group") to match."""
    rates: tuple[tuple[str, float], ...] = ()
    """(arm or mechanism name, SGD rate) pairs that fix an arm's rate (an arm's own name, e.g. dirichlet-eps1,
    wins over its mechanism's); every other arm picks its rate from `rate_grids` on the validation split."""
    rate_grids: tuple[tuple[str, tuple[float, ...]], ...] = DEFAULT_RATE_GRIDS
    optimizer: str = "sgd"
    max_grad_norm: float | None = None
    """DP-SGD's clip norm; None: chosen from `clip_grid` with the rate (DEFAULT_MAX_GRAD_NORM for a given rate)."""
    clip_grid: tuple[float, ...] = DEFAULT_CLIP_GRID
    mechanisms: tuple[str, ...] = tuple(MECHANISMS)
    weightings: tuple[str, ...] = ("normalized",)
    """The Dirichlet losses, one arm each per eps (named dirichlet-<weighting>-eps<eps>); default: the app's
    default loss (dirichlet-weighting), the paper's is `--weighting paper` (with `--norm group`)."""
    weight_cap: float = DEFAULT_WEIGHT_CAP
    references: int = 8
    """K reference models per arm for offline LiRA / RMIA (0: skip those attacks)."""
    reference_epsilons: tuple[float, ...] = ()
    """Only the private arms at these eps get reference models (and `none` and the control); empty: all."""
    margin: float = 0.03
    """Matched utility: an arm's accuracy may fall at most this far below the control's for "no violation"."""
    workers: int = 2

    def arms(self) -> list[Arm]:
        """Every private mechanism at every eps (and each of its losses), `none` once, then the control."""
        arms = []
        for mechanism in self.mechanisms:
            kind = mechanism_class(mechanism)
            if not kind.private:
                arms.append(Arm(mechanism, mechanism, math.inf))
            elif kind.loss_weightings:
                arms += [Arm(f"{mechanism}-{weighting}-eps{eps:g}", mechanism, eps, weighting)
                         for weighting in self.weightings for eps in self.epsilons_of(mechanism)]
            else:
                arms += [Arm(f"{mechanism}-eps{eps:g}", mechanism, eps) for eps in self.epsilons_of(mechanism)]
        return [*arms, Arm(CONTROL, "none", math.inf)]

    def epsilons_of(self, mechanism: str) -> tuple[float, ...]:
        """The eps values of a private mechanism's arms."""
        return dict(self.mechanism_epsilons).get(mechanism, self.epsilons)

    def references_for(self, arm: Arm) -> int:
        """K for this arm: `references`, or 0 for a private arm whose eps is not in `reference_epsilons`."""
        if self.reference_epsilons and math.isfinite(arm.epsilon) and arm.epsilon not in self.reference_epsilons:
            return 0
        return self.references

    def explicit_rate(self, arm: Arm) -> float | None:
        """The rate given for this arm (by its name, else by its mechanism's; the control uses none's)."""
        given = dict(self.rates)
        mechanism = "none" if arm.name == CONTROL else arm.mechanism
        return given.get(arm.name, given.get(mechanism))

    def rate_grid(self, mechanism: str) -> tuple[float, ...]:
        """The effective rates an arm of `mechanism` tries."""
        return dict(self.rate_grids)[mechanism]

    def clips(self, mechanism: str) -> tuple[float, ...]:
        """The clip norms tried with each rate: DP-SGD's grid (or its --max-grad-norm); one unused value else."""
        if not mechanism_class(mechanism).per_example_gradients:
            return (DEFAULT_MAX_GRAD_NORM,)
        return self.clip_grid if self.max_grad_norm is None else (self.max_grad_norm,)

    @property
    def tuning_seed(self) -> int:
        """The seed whose split the rates are chosen on; the choice is reused for every seed."""
        return self.seeds[0]

    def _check_floor(self) -> None:
        """Refuse an eps at or below Theorem 10's r -> 0 floor for (q, T, delta) before any training, for each
        mechanism that has the floor (Dirichlet)."""
        floored = [name for name in self.mechanisms if name in MECHANISMS and MECHANISMS[name].has_epsilon_floor]
        if not floored:
            return
        floor = epsilon_floor(self.sample_rate, self.steps, self.delta).epsilon
        for mechanism in floored:
            unreachable = [eps for eps in self.epsilons_of(mechanism) if eps <= floor]
            if unreachable:
                raise ValueError(f"--epsilon={','.join(f'{eps:g}' for eps in unreachable)} is unreachable for "
                                 f"{mechanism} at --sample-rate={self.sample_rate:g}, --steps={self.steps}, --delta="
                                 f"{self.delta:g}: the floor of Theorem 10 (r -> 0) is {floor:.6g}; give eps above "
                                 "it, or fewer --steps or a smaller --sample-rate")

    def validate_flags(self) -> None:
        """Raise ValueError naming the flag when a value is out of range (before any data is loaded)."""
        if not self.epsilons:
            raise ValueError("--epsilon is empty: give one or more positive numbers, e.g. 1,4")
        for eps in self.epsilons:
            check_positive("--epsilon", eps)
        for name, values in self.mechanism_epsilons:
            if name not in MECHANISMS or not mechanism_class(name).private or not values:
                raise ValueError(f"--mechanism-epsilon {name}: give a private mechanism and its eps values, "
                                 "e.g. dpsgd=1/4")
            for eps in values:
                check_positive(f"--mechanism-epsilon {name}", eps)
        for eps in self.reference_epsilons:
            check_positive("--reference-epsilon", eps)
        check_in_open_interval("--delta", self.delta, 0.0, 1.0)
        check_positive("--alpha", self.alpha)
        check_in_open_interval("--sample-rate", self.sample_rate, 0.0, 1.0)
        check_integer("--steps", self.steps, 1)
        self._check_floor()
        check_integer("--workers", self.workers, 1)
        check_integer("--validation", self.validation, 1)
        if self.max_grad_norm is not None:
            check_positive("--max-grad-norm", self.max_grad_norm)
        if not self.seeds:
            raise ValueError("--seeds=0 is out of range: it must be >= 1")
        if self.candidates < 8:
            raise ValueError(f"--candidates={self.candidates} is out of range: it must be >= 8")
        unknown = [name for name in self.mechanisms if name not in MECHANISMS]
        if unknown or not self.mechanisms:
            raise ValueError(f"--mechanisms has unknown {unknown}; valid: {', '.join(MECHANISMS)}")
        if self.norm is not None:
            try:
                check_norm(self.norm)
            except ValueError as error:
                raise ValueError(f"--{error}") from None
        if not self.weightings:
            raise ValueError(f"--weighting is empty: give one or more of {', '.join(WEIGHTINGS)}")
        for weighting in self.weightings:
            check_choice("--weighting", weighting, WEIGHTINGS)
        check_in_interval("--weight-cap", self.weight_cap, 1.0, 1e6)
        if self.references != 0 and self.references < MIN_REFERENCES:
            raise ValueError(f"--references={self.references} is out of range: use 0 (no LiRA/RMIA) or >= 2")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"--margin={self.margin} is out of range: it must lie in [0, 1)")
        names = {arm.name for arm in self.arms()} | set(MECHANISMS)
        for name, rate in self.rates:
            if name not in names:
                raise ValueError(f"--rate has unknown arm {name!r}; valid: {', '.join(sorted(names))}")
            check_positive(f"--rate {name}", rate)
        self._validate_grids()

    def _validate_grids(self) -> None:
        grids = dict(self.rate_grids)
        for mechanism in MECHANISMS:
            if not grids.get(mechanism):
                raise ValueError(f"--rate-grid has no rates for {mechanism}: give e.g. {mechanism}=0.025/0.05/0.1")
        for name, grid in self.rate_grids:
            if name not in MECHANISMS:
                raise ValueError(f"--rate-grid has unknown mechanism {name!r}; valid: {', '.join(MECHANISMS)}")
            for rate in grid:
                check_positive(f"--rate-grid {name}", rate)
        if not self.clip_grid:
            raise ValueError("--clip-grid is empty: give one or more clip norms, e.g. 0.5/2")
        for clip in self.clip_grid:
            check_positive("--clip-grid", clip)

    def validate(self, num_train: int) -> None:
        """validate_flags, then raise ValueError naming the flag when the split is impossible."""
        self.validate_flags()
        needed = 2 * self.candidates + self.extra_train + self.candidates // 2 + self.validation
        if needed > num_train:
            raise ValueError(
                f"--candidates={self.candidates}, --extra-train={self.extra_train} and --validation="
                f"{self.validation} need {needed} training examples (candidates, a control set as large as "
                f"members + extra, a population of candidates/2 for RMIA, the validation split), but "
                f"{self.dataset} has {num_train}"
            )


def parse_rates(text: str) -> tuple[tuple[str, float], ...]:
    """'dirichlet=0.7,none=0.025' -> (("dirichlet", 0.7), ("none", 0.025)); ValueError naming the bad item."""
    pairs = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, _, value = item.partition("=")
        try:
            pairs.append((name.strip(), float(value)))
        except ValueError:
            raise ValueError(f"--rate item {item!r} is invalid: write ARM=RATE, e.g. dirichlet=0.7") from None
    return tuple(pairs)


def parse_values(flag: str, text: str) -> tuple[float, ...]:
    """'0.5/1/2' -> (0.5, 1.0, 2.0); ValueError naming `flag` and the bad item."""
    try:
        return tuple(float(item) for item in text.split("/") if item.strip())
    except ValueError:
        raise ValueError(f"{flag} {text!r} is invalid: write numbers separated by '/', e.g. 0.5/1/2") from None


def parse_named_values(flag: str, text: str) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """'none=0.025/0.05,dpsgd=1/2' -> (("none", (0.025, 0.05)), ("dpsgd", (1.0, 2.0))); ValueError naming `flag`."""
    pairs = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, separator, values = item.partition("=")
        if not separator:
            raise ValueError(f"{flag} item {item!r} is invalid: write MECHANISM=V1/V2/..., e.g. dpsgd=1/4")
        pairs.append((name.strip(), parse_values(f"{flag} {name.strip()}", values)))
    return tuple(pairs)


def parse_rate_grids(text: str, optimizer: str = "sgd") -> tuple[tuple[str, tuple[float, ...]], ...]:
    """'none=0.025/0.05,dpsgd=1/2' over the optimizer's default grids (DEFAULT_RATE_GRIDS for SGD,
    ADAM_RATE_GRIDS for Adam): the mechanisms named get the grids given."""
    defaults = ADAM_RATE_GRIDS if optimizer == "adam" else DEFAULT_RATE_GRIDS
    return tuple({**dict(defaults), **dict(parse_named_values("--rate-grid", text))}.items())
