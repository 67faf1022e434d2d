"""Per-client privacy mechanisms: small objects that privatise one client's local training.

Each mechanism owns how one training step turns a Poisson-sampled minibatch into an update, and its
accountant, which composes exactly the steps that ran. The client code is the same for every
mechanism: build (privacy.registry.build_mechanism, calibrated once), wrap the model and optimizer,
refuse a round that would_exceed the budget, train_step, record. For a site's lifetime accounting
(privacy/accounting/lifetime.py) a mechanism answers for itself, in the spirit of dp-accounting's DpEvent:
`rdp_curve`, `after`, `joint_epsilon`, and `noise_range` / `with_noise`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from privacy.accounting.accountant import AccountantConfig, DirichletAccountant, DirichletEvent
from privacy.accounting.analysis import calibrate_r
from privacy.attenuation import private_learning_rate

if TYPE_CHECKING:  # torch is imported where a mechanism trains, so that the registry stays cheap to import
    import torch
    from torch import Tensor, nn

    from privacy.csprng import SecureRandom

@dataclass(frozen=True)
class MechanismSpec:
    """What a client needs to set up its mechanism: its budget and its whole-run plan."""

    name: str
    target_epsilon: float
    delta: float
    sample_rate: float
    planned_steps: int
    alpha: float = 3.0
    max_grad_norm: float = 1.0
    num_examples: int | None = None
    """The client's training-set size; DP-SGD divides its noisy gradient sum by the expected batch
    size round(sample_rate * num_examples). Unused by the other mechanisms."""
    loss_weighting: LossWeighting | None = None
    """Dirichlet only: the per-example confidence normalisation of its NLL (None: the paper's loss)."""


LOSS_WEIGHTINGS = ("normalized", "paper")
"""The Dirichlet NLL's named losses (run-config key dirichlet-weighting): normalized, each example's NLL weighted
as LossWeighting says; paper, Algorithm 1 as published."""


@dataclass(frozen=True)
class LossWeighting:
    """The Dirichlet NLL's per-example weight kappa(reference_confidence) / kappa(s_y), capped at `cap`
    (privacy/dirichlet.py, ConfidenceNormalization). Training only: the accountant never reads it."""

    reference_confidence: float = 0.9
    cap: float = 5.0


def loss_weighting(name: str, reference_confidence: float, cap: float) -> LossWeighting | None:
    """The weighting of the Dirichlet NLL named `name`: LossWeighting(reference_confidence, cap) for
    "normalized"; None, the paper's unweighted loss, for "paper" or no name (a mechanism without named losses).
    The one place a run config's dirichlet-weighting and an audit arm's weighting become a LossWeighting."""
    return LossWeighting(reference_confidence, cap) if name == "normalized" else None


def weighted_cross_entropy(logits: Tensor, labels: Tensor, weights: Tensor | None) -> Tensor:
    """Mean cross-entropy of a batch, each example's times its weight (None: torch's own mean, bit for bit)."""
    from torch.nn.functional import cross_entropy

    if weights is None:
        return cross_entropy(logits, labels)
    return (cross_entropy(logits, labels, reduction="none") * weights).mean()


def offset_logits(logits: Tensor, offsets: Tensor | None) -> Tensor:
    """`logits` plus one offset per class (client/logit_adjustment.py), or `logits` themselves for None. The
    softmax of shifted logits is still a point of the simplex, which is all Theorem 10 assumes of the softmax
    that the Dirichlet mechanism privatises; the offsets come from the client's public labels."""
    return logits if offsets is None else logits + offsets


class Mechanism(ABC):
    """One client's privatised training step and its ledger."""

    name: ClassVar[str]
    covers: ClassVar[str]
    """What this mechanism's eps bounds, in the words every report uses (read through privacy.registry)."""
    does_not_cover: ClassVar[str | None] = None
    """What a run releases that this mechanism's eps does not bound, for the end-of-run lines and
    summary.json (read through privacy.registry); None when it bounds the weights and every update."""
    private: ClassVar[bool] = True
    """Whether it bounds anything: False for the non-private baseline, whose eps is inf (no budget, no eps on
    the round line, a run of it is an audit's control)."""
    has_epsilon_floor: ClassVar[bool] = False
    """Whether its eps keeps a positive floor as the noise grows without bound (Theorem 10's r -> 0 floor), so
    that a target at or below it is refused before training (privacy.accounting.analysis.epsilon_floor)."""
    per_example_gradients: ClassVar[bool] = False
    """Whether it clips each example's gradient (DP-SGD, max-grad-norm): its clip norm is a setting to tune, and
    BatchNorm, which has no per-example gradient, cannot train under it at all (allow-batch-norm is refused)."""
    validates_model: ClassVar[bool] = False
    """Whether the run's model is checked against the accountant's assumption that each example's output depends
    on its own input only (privacy.validation: no batch-dependent layer unless allow-batch-norm)."""
    reports_training_loss: ClassVar[bool] = True
    """Whether a client reports its training loss: False where the eps does not cover it (DP-SGD's loss is
    of the un-noised batch)."""
    loss_weightings: ClassVar[tuple[str, ...]] = ()
    """The named losses it can train with (LOSS_WEIGHTINGS for the Dirichlet NLL); () for its one loss."""
    rate_key: ClassVar[str]
    """The name of its given rate in a study (the Study field; its flag is rate_flag(): --learning-rate for
    the baseline, --<name>-learning-rate for a private mechanism)."""
    sgd_rate_grid: ClassVar[tuple[float, ...]] = (0.02, 0.05, 0.1)
    """SGD's rates a study tries for it unless told (a Dirichlet rate is an effective one: step_rate divides it)."""

    @classmethod
    def rate_flag(cls) -> str:
        """The command-line flag that gives this mechanism's rate in `study` and `bench accuracy`."""
        return "--" + cls.rate_key.replace("_", "-")
    sample_rate: float
    """The Poisson sampling rate q this mechanism was calibrated for."""

    @abstractmethod
    def parameters(self) -> dict[str, float]:
        """The calibrated noise parameters (for the ledger)."""

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Prepare model and optimizer for private training (identity unless the mechanism needs hooks)."""
        return model, optimizer

    def step_rate(self, effective_rate: float, s_y: float) -> float:
        """The optimizer rate at which this mechanism's expected step equals a plain cross-entropy step
        at `effective_rate` (reference confidence s_y): the rate itself unless the loss attenuates it."""
        return effective_rate

    @abstractmethod
    def loss(self, logits: Tensor, labels: Tensor, generator: torch.Generator | SecureRandom | None,
             weights: Tensor | None = None) -> Tensor:
        """Mean loss of one minibatch, each example's times its weight in `weights` (None: 1), for the
        class-weighting of a client's labels (client/class_balance.py); the weights touch no released value."""

    def train_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        inputs: Tensor,
        labels: Tensor,
        generator: torch.Generator | SecureRandom | None,
        weights: Tensor | None = None,
        logit_offsets: Tensor | None = None,
    ) -> Tensor | None:
        """One step of Algorithm 1 (lines 3-8) on the examples' losses times `weights` (None: 1), the loss
        taken on the logits plus `logit_offsets` (None: the logits themselves); an empty batch makes no update.
        Returns the loss (on device)."""
        if labels.numel() == 0:
            return None
        optimizer.zero_grad(set_to_none=True)
        loss = self.loss(offset_logits(model(inputs), logit_offsets), labels, generator, weights)
        loss.backward()
        optimizer.step()
        return loss.detach()

    @abstractmethod
    def epsilon(self, delta: float) -> float:
        """eps spent so far at this delta."""

    @abstractmethod
    def would_exceed(self, steps: int, max_epsilon: float) -> bool:
        """Whether `steps` more steps would take eps above max_epsilon."""

    @abstractmethod
    def record(self, steps: int) -> None:
        """Compose `steps` steps that ran (also empty-batch steps: their sampling was private)."""

    @property
    @abstractmethod
    def steps(self) -> int:
        """Steps composed so far."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable ledger and calibration."""

    @abstractmethod
    def rdp_curve(self, orders: np.ndarray) -> np.ndarray:
        """RDP of every step this ledger composed, at each of `orders` (inf where it has no bound): ledgers
        compose by adding these curves (Lemma 12). Raises ValueError for orders it does not support;
        integer orders >= 2 every mechanism supports."""

    @classmethod
    def joint_epsilon(cls, mechanisms: Sequence[Mechanism], delta: float) -> float | None:
        """eps at `delta` of `mechanisms` (all of this class) composed by this class's own accountant, or
        None where it has none better than adding their rdp_curve at integer orders (the default)."""
        return None

    def after(self, steps: int) -> Mechanism:
        """A copy with `steps` more steps composed; this mechanism is not changed. A write-ahead ledger
        stores `after(steps).state_dict()`, so a process killed mid-round over-states its spending."""
        copy = type(self).from_state_dict(self.state_dict())
        copy.record(steps)
        return copy

    def noise_range(self, useful_fraction: float) -> tuple[float, float] | None:
        """(own, least useful) value of the noise parameter `with_noise` sets: the calibrated one, and the one
        whose signal-to-noise is `useful_fraction` of it; None (the default) when there is none to raise."""
        return None

    def with_noise(self, noise: float) -> Mechanism:
        """A copy whose noise parameter is `noise`, its ledger kept (only where noise_range is not None)."""
        raise ValueError(f"mechanism {self.name!r} has no noise parameter to set")

    @classmethod
    @abstractmethod
    def calibrated(cls, spec: MechanismSpec) -> Mechanism:
        """Set the mechanism up for one client's whole-run plan (raises ValueError for an impossible budget)."""

    @classmethod
    @abstractmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Mechanism:
        """Rebuild a mechanism, calibration and ledger included, from state_dict()."""


class NoPrivacy(Mechanism):
    """The non-private baseline: the same sampler and loop, plain cross-entropy, eps = inf."""

    name = "none"
    covers = "nothing: training is not private (eps = inf)"
    does_not_cover = "anything: the weights and every update are not private"
    private = False
    rate_key = "learning_rate"

    def __init__(self, sample_rate: float) -> None:
        self.sample_rate = sample_rate
        self._steps = 0

    @classmethod
    def calibrated(cls, spec: MechanismSpec) -> NoPrivacy:
        return cls(spec.sample_rate)

    def parameters(self) -> dict[str, float]:
        return {}

    def loss(self, logits: Tensor, labels: Tensor, generator: torch.Generator | SecureRandom | None,
             weights: Tensor | None = None) -> Tensor:
        return weighted_cross_entropy(logits, labels, weights)

    def epsilon(self, delta: float) -> float:
        return math.inf

    def would_exceed(self, steps: int, max_epsilon: float) -> bool:
        return False

    def rdp_curve(self, orders: np.ndarray) -> np.ndarray:
        """inf at every order once a step ran (nothing bounds it), 0 before."""
        return np.full(np.asarray(orders).size, math.inf if self._steps else 0.0)

    def record(self, steps: int) -> None:
        self._steps += steps

    @property
    def steps(self) -> int:
        return self._steps

    def state_dict(self) -> dict[str, Any]:
        return {"mechanism": self.name, "sample_rate": self.sample_rate, "steps": self._steps}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> NoPrivacy:
        mechanism = cls(float(state["sample_rate"]))
        mechanism._steps = int(state["steps"])
        return mechanism


class DirichletMechanism(Mechanism):
    """Algorithm 1: the loss is -log p[y] with p ~ Dir(r softmax(z) + alpha); ledger of Theorem 10."""

    name = "dirichlet"
    covers = (
        "the perturbed softmax outputs released at each step (Theorem 10), per example, inputs only, "
        "labels public; NOT the trained weights (audit them)"
    )
    does_not_cover = (
        "the trained weights and every update a client returns: each example's gradient r J(x)^T u passes "
        "its raw input through the Jacobian J(x) (and, with dirichlet-weighting = normalized, its weight "
        "w(s_y) through the un-noised softmax), so in general no (eps, delta) guarantee holds for them "
        "(docs/privacy.md); an audit bound is a lower bound on their leakage (measured: docs/audit.md)"
    )
    has_epsilon_floor = True
    validates_model = True
    loss_weightings = LOSS_WEIGHTINGS
    rate_key = "dirichlet_learning_rate"

    def __init__(
        self, r: float, alpha: float, sample_rate: float, delta: float, loss_weighting: LossWeighting | None = None
    ) -> None:
        self.sample_rate = sample_rate
        self.event = DirichletEvent(r=r, alpha=alpha, sample_rate=sample_rate)
        self.accountant = DirichletAccountant(AccountantConfig(target_delta=delta))
        self.loss_weighting = loss_weighting

    @classmethod
    def calibrated(cls, spec: MechanismSpec) -> DirichletMechanism:
        """Solve equation (1) once for the whole run's planned steps: r* with eps(r*) <= target."""
        calibration = calibrate_r(spec.target_epsilon, spec.delta, spec.sample_rate, spec.planned_steps, spec.alpha)
        return cls(calibration.r, spec.alpha, spec.sample_rate, spec.delta, spec.loss_weighting)

    def parameters(self) -> dict[str, float]:
        return {"r": self.event.r, "alpha": self.event.alpha}

    def step_rate(self, effective_rate: float, s_y: float) -> float:
        """effective_rate / kappa(s_y) at this client's own r* (Theorem 11, equation (3)): the expected
        private gradient is kappa times the cross-entropy gradient, so dividing by kappa makes clients
        with different r* take equally large steps on average. Under the confidence normalisation the
        expected gradient is kappa(reference) times cross-entropy's whatever s_y is, so kappa is taken there."""
        if self.loss_weighting is not None:
            s_y = self.loss_weighting.reference_confidence
        return private_learning_rate(effective_rate, self.event.r, self.event.alpha, s_y)

    def loss(self, logits: Tensor, labels: Tensor, generator: torch.Generator | SecureRandom | None,
             weights: Tensor | None = None) -> Tensor:
        from privacy.dirichlet import ConfidenceNormalization, dirichlet_nll_loss

        weighting = self.loss_weighting
        normalization = None if weighting is None else ConfidenceNormalization(weighting.reference_confidence,
                                                                               weighting.cap)
        if weights is None:
            return dirichlet_nll_loss(logits, labels, self.event.r, self.event.alpha, generator,
                                      normalization=normalization)
        return (dirichlet_nll_loss(logits, labels, self.event.r, self.event.alpha, generator, reduction="none",
                                   normalization=normalization) * weights).mean()

    def epsilon(self, delta: float) -> float:
        return self.accountant.get_epsilon(delta)

    def would_exceed(self, steps: int, max_epsilon: float) -> bool:
        return self.accountant.would_exceed(self.event, max_epsilon, steps)

    def rdp_curve(self, orders: np.ndarray) -> np.ndarray:
        """Theorem 10's curve of the ledger at integer orders >= 2 (inf beyond an event's admissible order)."""
        return self.accountant.rdp_curve(orders)

    def noise_range(self, useful_fraction: float) -> tuple[float, float]:
        """(r*, useful_fraction * r*): a smaller r is more private (r scales the softmax in the concentration)."""
        return self.event.r, useful_fraction * self.event.r

    def with_noise(self, noise: float) -> DirichletMechanism:
        """A copy at r = `noise` (the ledger of steps already run keeps their own r)."""
        state = self.state_dict()
        state["event"] = {**state["event"], "r": noise}
        return type(self).from_state_dict(state)

    def record(self, steps: int) -> None:
        if steps > 0:
            self.accountant.compose(self.event, steps)

    @property
    def steps(self) -> int:
        return self.accountant.num_releases

    def state_dict(self) -> dict[str, Any]:
        """The ledger layout of every earlier version, plus `loss-weighting` only when the NLL is normalised."""
        state = {"mechanism": self.name, "event": asdict(self.event), "ledger": self.accountant.state_dict()}
        if self.loss_weighting is not None:
            state["loss-weighting"] = asdict(self.loss_weighting)
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> DirichletMechanism:
        event = DirichletEvent(**state["event"])
        saved_weighting = state.get("loss-weighting")  # absent in ledgers written before it existed: the paper's
        weighting = None if saved_weighting is None else LossWeighting(**saved_weighting)
        mechanism = cls(event.r, event.alpha, event.sample_rate, state["ledger"]["config"]["target_delta"], weighting)
        mechanism.accountant.load_state_dict(state["ledger"])
        return mechanism
