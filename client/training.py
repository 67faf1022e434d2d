"""One client's local training and evaluation loops (Algorithm 1), shared by every mechanism.

Data lives on the device as tensors; each step draws a Poisson mask there and gathers the batch by
index (no DataLoader in the hot loop). Losses are summed on the device and read once at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from privacy.mechanisms import Mechanism
from privacy.sampling import poisson_sample


@dataclass(frozen=True)
class TrainStats:
    """What a local training run did: steps run (all accounted), non-empty steps, mean batch loss."""

    steps: int
    updates: int
    mean_loss: float


def make_optimizer(name: str, model: nn.Module, learning_rate: float) -> torch.optim.Optimizer:
    """SGD without momentum (the paper's choice) or Adam."""
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=learning_rate)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=learning_rate)
    raise ValueError(f"optimizer={name!r} is invalid: choose sgd or adam")


def train_locally(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    mechanism: Mechanism,
    inputs: Tensor,
    labels: Tensor,
    steps: int,
    sample_rate: float,
    generator: torch.Generator,
    augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
) -> TrainStats:
    """Run `steps` Poisson-sampled steps, composing each into the mechanism's ledger before it runs,
    so that the ledger holds every step that released anything even if training fails midway."""
    model.train()
    loss_sum = torch.zeros((), device=inputs.device)
    updates = 0
    for _ in range(steps):
        mechanism.record(1)
        index = poisson_sample(labels.shape[0], sample_rate, generator, inputs.device)
        batch = inputs[index]
        if augment is not None and index.numel() > 0:
            batch = augment(batch, generator)
        loss = mechanism.train_step(model, optimizer, batch, labels[index], generator)
        if loss is not None:
            loss_sum += loss
            updates += 1
    mean_loss = float(loss_sum) / updates if updates else float("nan")
    return TrainStats(steps=steps, updates=updates, mean_loss=mean_loss)


@torch.no_grad()
def evaluate(model: nn.Module, inputs: Tensor, labels: Tensor, batch_size: int = 1024) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of the model on (inputs, labels)."""
    model.eval()
    loss_sum = torch.zeros((), device=inputs.device)
    correct = torch.zeros((), device=inputs.device)
    for start in range(0, labels.shape[0], batch_size):
        logits = model(inputs[start : start + batch_size])
        target = labels[start : start + batch_size]
        loss_sum += nn.functional.cross_entropy(logits, target, reduction="sum")
        correct += (logits.argmax(dim=1) == target).sum()
    count = max(labels.shape[0], 1)
    return float(loss_sum) / count, float(correct) / count
