"""How well a model does on labelled examples: what the server, the clients and the benchmarks report."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


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


@torch.no_grad()
def true_class_confidence(model: nn.Module, inputs: Tensor, labels: Tensor) -> float:
    """Mean softmax probability the model gives the true class (nan without examples)."""
    if labels.numel() == 0:
        return math.nan
    model.eval()
    probabilities = torch.softmax(model(inputs), dim=-1)
    return float(probabilities.gather(1, labels.view(-1, 1)).mean())
