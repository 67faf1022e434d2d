"""DP-SGD (Abadi et al. 2016) as a Mechanism, on Opacus: per-example clipping, Gaussian noise, RDP ledger.

Each step of the shared loop (client/training.py) Poisson-samples a batch B with rate q; DP-SGD then
updates with

    g = (sum_{i in B} clip_C(grad loss_i) + N(0, sigma^2 C^2 I)) / L,    L = round(q * num_examples),

the expected batch size, so that the update does not reveal |B|. An empty batch still adds the noise
and steps, exactly as Opacus does for an empty batch of its DPDataLoader. Per-example gradients come
from Opacus's GradSampleModule, clipping and noise from its DPOptimizer, and the ledger is Opacus's
RDPAccountant for the Poisson-sampled Gaussian mechanism (Mironov et al. 2019), add/remove-one
neighbours. Unlike the Dirichlet mechanism's eps, this eps bounds what the weights reveal: every
intermediate model is a post-processing of the noisy gradients.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from privacy.checks import check_in_open_interval, check_integer, check_positive
from privacy.mechanisms import Mechanism, MechanismSpec, offset_logits, weighted_cross_entropy

if TYPE_CHECKING:  # torch and Opacus are imported where DP-SGD trains: the registry stays cheap to import
    import torch
    from opacus.accountants import RDPAccountant
    from torch import Tensor, nn

    from privacy.csprng import SecureRandom

EPSILON_TOLERANCE = 1e-3
"""Calibration stops once target - tolerance < eps(sigma) <= target (Opacus's bisection)."""
GAUSSIAN_EXACT_ORDERS = 256
"""Orders up to which rdp_curve is Opacus's exact `compute_rdp`; above, the bound without subsampling."""

Composition = tuple[float, float, int]
"""One ledger entry of Opacus's RDPAccountant: (noise multiplier, sample rate, steps)."""


def expected_batch_size(sample_rate: float, num_examples: int) -> int:
    """L = round(q * N), at least 1: the fixed denominator of DP-SGD's averaged noisy gradient."""
    return max(1, round(sample_rate * check_integer("num_examples", num_examples, 1)))


def composed(history: list[Composition], noise_multiplier: float, sample_rate: float, steps: int) -> list[Composition]:
    """A new ledger: `history` plus `steps` steps at (noise_multiplier, sample_rate), merged with the last entry
    when it has the same parameters (as RDPAccountant.step merges)."""
    check_integer("steps", steps, 1)
    if history and history[-1][:2] == (noise_multiplier, sample_rate):
        return history[:-1] + [(noise_multiplier, sample_rate, history[-1][2] + steps)]
    return history + [(noise_multiplier, sample_rate, steps)]


def _rdp_accountant() -> RDPAccountant:
    """An empty Opacus RDP ledger (Opacus is imported on first use: it costs seconds and memory)."""
    from opacus.accountants import RDPAccountant

    return RDPAccountant()


class DPSGDMechanism(Mechanism):
    """Per-example clipped, Gaussian-noised SGD steps with an Opacus RDP ledger."""

    name = "dpsgd"
    covers = "the trained weights and every intermediate model (DP-SGD), per example, inputs and labels"
    per_example_gradients = True
    reports_training_loss = False
    rate_key = "dpsgd_learning_rate"
    sgd_rate_grid = (0.05, 0.1, 0.2)

    def __init__(
        self,
        noise_multiplier: float,
        max_grad_norm: float,
        sample_rate: float,
        expected_batch_size: int,
        delta: float,
    ) -> None:
        if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
            raise ValueError(f"noise_multiplier={noise_multiplier!r} is out of range: it must be finite and >= 0")
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = check_positive("max_grad_norm", max_grad_norm)
        self.sample_rate = check_in_open_interval("sample_rate", sample_rate, 0.0, 1.0)
        self.expected_batch_size = check_integer("expected_batch_size", expected_batch_size, 1)
        self.delta = check_in_open_interval("delta", delta, 0.0, 1.0)
        self.accountant = _rdp_accountant()

    @classmethod
    def calibrated(cls, spec: MechanismSpec) -> DPSGDMechanism:
        """The smallest noise multiplier (to EPSILON_TOLERANCE) whose eps over spec.planned_steps is <= target.

        Needs spec.num_examples for the expected batch size. Raises ValueError for a budget Opacus
        cannot reach (sigma above 1e6).
        """
        if spec.num_examples is None:
            raise ValueError("mechanism='dpsgd' needs MechanismSpec.num_examples (the client's training-set size)")
        check_positive("target_epsilon", spec.target_epsilon)
        check_in_open_interval("delta", spec.delta, 0.0, 1.0)
        check_in_open_interval("sample_rate", spec.sample_rate, 0.0, 1.0)
        check_integer("planned_steps", spec.planned_steps, 1)
        from opacus.accountants.utils import get_noise_multiplier

        with warnings.catch_warnings():  # the bisection's first probes (sigma = 20, 40, ...) warn about their order
            warnings.simplefilter("ignore", UserWarning)
            sigma = get_noise_multiplier(
                target_epsilon=spec.target_epsilon,
                target_delta=spec.delta,
                sample_rate=spec.sample_rate,
                steps=spec.planned_steps,
                accountant="rdp",
                epsilon_tolerance=EPSILON_TOLERANCE,
            )
        batch = expected_batch_size(spec.sample_rate, spec.num_examples)
        return cls(sigma, spec.max_grad_norm, spec.sample_rate, batch, spec.delta)

    def parameters(self) -> dict[str, float]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "expected_batch_size": float(self.expected_batch_size),
        }

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """GradSampleModule (per-example gradients of a SUM loss) and DPOptimizer (clip, noise, divide by L;
        its noise from the train step's generator or SecureRandom: privacy/dpsgd_noise.py).

        The returned module holds `model` as `_module` and shares its parameter tensors, so `model`
        itself always holds the current weights (read and save those: the wrapper's state_dict keys
        carry a `_module.` prefix). A model can be wrapped once; wrap a fresh model per training run.
        """
        from opacus import GradSampleModule

        from privacy.dpsgd_noise import SourcedNoiseDPOptimizer

        module = GradSampleModule(model, loss_reduction="sum")
        dp_optimizer = SourcedNoiseDPOptimizer(
            optimizer,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            expected_batch_size=self.expected_batch_size,
            loss_reduction="mean",
        )
        return module, dp_optimizer

    def loss(self, logits: Tensor, labels: Tensor, generator: torch.Generator | SecureRandom | None,
             weights: Tensor | None = None) -> Tensor:
        """Mean cross-entropy, each example's times its weight (DP-SGD privatises the gradient, not the loss)."""
        return weighted_cross_entropy(logits, labels, weights)

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
        """One DP-SGD step, its loss on the logits plus `logit_offsets` (None: the logits); the noise is drawn
        from `generator` (a SecureRandom: the OS's CSPRNG). An empty batch steps on noise alone and returns None
        (no loss); otherwise returns the batch's mean cross-entropy, each example's times its weight (detached).
        A weight or an offset changes an example's gradient before it is clipped, so the clipping bound, and the
        eps, do not change."""
        from opacus.optimizers import DPOptimizer

        if not isinstance(optimizer, DPOptimizer):
            raise TypeError("DPSGDMechanism.train_step needs the optimizer returned by DPSGDMechanism.wrap")
        optimizer.generator = generator
        optimizer.zero_grad(set_to_none=True)
        if labels.numel() == 0:
            for parameter in optimizer.params:
                parameter.grad_sample = parameter.new_zeros((0, *parameter.shape))
            optimizer.step()
            return None
        from torch.nn.functional import cross_entropy

        per_example = cross_entropy(offset_logits(model(inputs), logit_offsets), labels, reduction="none")
        loss = (per_example if weights is None else per_example * weights).sum()
        with warnings.catch_warnings():  # Opacus's hooks on a first layer whose input needs no gradient: benign
            warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
            loss.backward()
        optimizer.step()
        return loss.detach() / labels.numel()

    def epsilon(self, delta: float) -> float:
        return float(self.accountant.get_epsilon(delta))

    def would_exceed(self, steps: int, max_epsilon: float) -> bool:
        """Whether `steps` more steps would take eps (at this mechanism's delta) above max_epsilon; no mutation."""
        projected = _rdp_accountant()
        projected.history = composed(list(self.accountant.history), self.noise_multiplier, self.sample_rate, steps)
        return projected.get_epsilon(self.delta) > max_epsilon

    def rdp_curve(self, orders: np.ndarray) -> np.ndarray:
        """Sum over the ledger's (sigma, q, steps) entries of the subsampled Gaussian curve (Mironov et al.
        2019) at orders > 1: Opacus's exact `compute_rdp` up to order GAUSSIAN_EXACT_ORDERS, above it the
        curve without subsampling, steps * lambda / (2 sigma^2), an upper bound (subsampling only lowers
        RDP) that costs nothing."""
        from opacus.accountants.analysis.rdp import compute_rdp

        orders = np.asarray(orders)
        if orders.ndim != 1 or not np.all(orders > 1):
            raise ValueError(f"orders={orders!r} are not supported: the Gaussian curve is bounded at orders > 1")
        exact = orders <= GAUSSIAN_EXACT_ORDERS
        total = np.zeros(orders.size)
        for sigma, q, steps in self.accountant.history:
            total[exact] += np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders[exact]))
            total[~exact] += math.inf if sigma == 0 else steps * orders[~exact] / (2 * sigma**2)
        return total

    @classmethod
    def joint_epsilon(cls, mechanisms: Sequence[Mechanism], delta: float) -> float | None:
        """Opacus's RDPAccountant over every ledger's history together (its own order grid, finer than the
        integers), so that a site's DP-SGD runs alone cost what Opacus reports for them; None for a set
        that holds another mechanism."""
        dpsgd_mechanisms = [mechanism for mechanism in mechanisms if isinstance(mechanism, DPSGDMechanism)]
        if len(dpsgd_mechanisms) != len(mechanisms):
            return None
        accountant = _rdp_accountant()
        accountant.history = [entry for mechanism in dpsgd_mechanisms for entry in mechanism.accountant.history]
        return float(accountant.get_epsilon(delta))

    def noise_range(self, useful_fraction: float) -> tuple[float, float]:
        """(sigma*, sigma* / useful_fraction): a larger noise multiplier is more private."""
        return self.noise_multiplier, self.noise_multiplier / useful_fraction

    def with_noise(self, noise: float) -> DPSGDMechanism:
        """A copy at noise multiplier `noise` (the ledger of steps already run keeps their own sigma)."""
        return type(self).from_state_dict({**self.state_dict(), "noise_multiplier": noise})

    def record(self, steps: int) -> None:
        if steps > 0:
            self.accountant.history = composed(self.accountant.history, self.noise_multiplier, self.sample_rate, steps)

    @property
    def steps(self) -> int:
        return sum(count for _, _, count in self.accountant.history)

    def state_dict(self) -> dict[str, Any]:
        """Calibration and the RDPAccountant's ledger, as JSON-ready numbers and lists."""
        return {
            "mechanism": self.name,
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "sample_rate": self.sample_rate,
            "expected_batch_size": self.expected_batch_size,
            "delta": self.delta,
            "ledger": {
                "mechanism": self.accountant.mechanism(),
                "history": [[float(sigma), float(q), int(count)] for sigma, q, count in self.accountant.history],
            },
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> DPSGDMechanism:
        """Rebuild from state_dict(); the ledger continues where it stopped (never rebuilt from scratch)."""
        if state.get("mechanism") != cls.name:
            raise ValueError(f"saved state is for mechanism {state.get('mechanism')!r}, not {cls.name!r}")
        mechanism = cls(
            float(state["noise_multiplier"]),
            float(state["max_grad_norm"]),
            float(state["sample_rate"]),
            int(state["expected_batch_size"]),
            float(state["delta"]),
        )
        accountant_state = state["ledger"]
        history = [(float(sigma), float(q), int(count)) for sigma, q, count in accountant_state["history"]]
        mechanism.accountant.load_state_dict({"mechanism": accountant_state["mechanism"], "history": history})
        return mechanism
