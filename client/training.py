"""One client's private trainer and its local training loop (Algorithm 1), shared by every mechanism.

`private_trainer` assembles a mechanism with its model and optimizer, for the client round (client/round.py),
the audit (sims/audit/training.py), the benchmarks (sims/bench/steps.py) and the GPU script
(sims/gpu_cifar10.py): what they train or time is what a client runs.
Data lives on the device as tensors; each step draws a Poisson mask there and gathers the batch by
index (no DataLoader in the hot loop). Losses are summed on the device and read once at the end.
With a `privacy_rng` (run-config `secure-rng`) the masks and the mechanism's draws come from the OS's
CSPRNG (privacy/csprng.py); augmentation, which no eps depends on, keeps the seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from client.proximal import add_proximal_term
from privacy.csprng import SecureRandom
from privacy.mechanisms import Mechanism
from privacy.sampling import poisson_sample


def make_optimizer(name: str, model: nn.Module, learning_rate: float) -> torch.optim.Optimizer:
    """SGD without momentum (the paper's choice) or Adam."""
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=learning_rate)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=learning_rate)
    raise ValueError(f"optimizer={name!r} is invalid: choose one of sgd, adam")


Augment = Callable[[Tensor, torch.Generator], Tensor]
"""An on-device augmentation of a sampled batch, drawing from the round's generator."""


@dataclass(frozen=True)
class PoissonBatches:
    """Where a client's minibatches come from: its examples on the device, the generator of the round,
    the augmentation of each drawn batch (from the generator), under secure-rng the CSPRNG that the
    Poisson masks and the mechanism's draws come from instead of the generator, the weight of each
    class in the loss (client/class_balance.py; None: 1) and what the loss adds to every example's logits
    (client/logit_adjustment.py; None: nothing). The sampling rate is the mechanism's own q, so no step runs at
    a rate it did not account."""

    inputs: Tensor
    labels: Tensor
    generator: torch.Generator
    augment: Augment | None = None
    privacy_rng: SecureRandom | None = None
    class_weights: Tensor | None = None
    logit_offsets: Tensor | None = None

    @property
    def draws(self) -> torch.Generator | SecureRandom:
        """The source of every privacy draw: the CSPRNG when given, else the round's generator."""
        return self.generator if self.privacy_rng is None else self.privacy_rng


def train_locally(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    mechanism: Mechanism,
    batches: PoissonBatches,
    steps: int,
    *,
    on_step: Callable[[int], None] | None = None,
) -> float:
    """Run `steps` Poisson-sampled steps at the mechanism's rate q, composing each into the mechanism's
    ledger before it runs, so that the ledger holds every step that released anything even if training
    fails midway; `on_step(k)`, if given, is told before step k runs (a round's progress file,
    client/progress.py). Returns the mean loss over the non-empty batches (nan when every batch was empty)."""
    model.train()
    inputs, labels, generator, draws = batches.inputs, batches.labels, batches.generator, batches.draws
    loss_sum = torch.zeros((), device=inputs.device)
    updates = 0
    for step in range(steps):
        mechanism.record(1)
        if on_step is not None:
            on_step(step + 1)
        index = poisson_sample(labels.shape[0], mechanism.sample_rate, draws, inputs.device)
        batch = inputs[index]
        if batches.augment is not None and index.numel() > 0:
            batch = batches.augment(batch, generator)
        batch_labels = labels[index]
        weights = None if batches.class_weights is None else batches.class_weights[batch_labels]
        loss = mechanism.train_step(model, optimizer, batch, batch_labels, draws, weights, batches.logit_offsets)
        if loss is not None:
            loss_sum += loss
            updates += 1
    return float(loss_sum) / updates if updates else float("nan")


@dataclass(frozen=True)
class PrivateTrainer:
    """A mechanism with the model and optimizer it wraps (under DP-SGD Opacus's GradSampleModule and
    DPOptimizer; the unwrapped model keeps the weights): what every private training run steps."""

    mechanism: Mechanism
    model: nn.Module
    optimizer: torch.optim.Optimizer

    def train(self, batches: PoissonBatches, steps: int, *, on_step: Callable[[int], None] | None = None) -> float:
        """`steps` Poisson-sampled steps from `batches` (train_locally); the mean loss of the non-empty batches."""
        return train_locally(self.model, self.optimizer, self.mechanism, batches, steps, on_step=on_step)

    def step(self, inputs: Tensor, labels: Tensor, draws: torch.Generator | SecureRandom) -> Tensor | None:
        """One train_step on a given batch (the benchmarks time it)."""
        return self.mechanism.train_step(self.model, self.optimizer, inputs, labels, draws)


def private_trainer(
    mechanism: Mechanism, model: nn.Module, optimizer: str, learning_rate: float, *, proximal_mu: float = 0.0
) -> PrivateTrainer:
    """The one assembly of a private trainer: the named optimizer at `learning_rate` on `model` (load its
    starting weights first), FedProx's proximal term at `proximal_mu` (0: none) on the plain optimizer, and
    the mechanism's wrapping of both. Draws no randomness, so callers keep their draws in the same order."""
    plain = make_optimizer(optimizer, model, learning_rate)
    add_proximal_term(plain, proximal_mu)  # before a mechanism wraps it (client/proximal.py)
    wrapped, wrapped_optimizer = mechanism.wrap(model, plain)
    return PrivateTrainer(mechanism, wrapped, wrapped_optimizer)
