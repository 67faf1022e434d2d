"""`evaluate` (the benchmarks' and the audit's loss and accuracy), in batches, against an independent count."""

from __future__ import annotations

import pytest
import torch

from dirichlet_fl.metrics import evaluate, evaluate_model


def test_evaluate_counts_correct_predictions_across_batches() -> None:
    """A fixed linear model whose prediction is right on exactly 30 of 40 examples: accuracy 0.75, and
    the mean cross-entropy over all batches (16, 16, 8), the same as evaluate_model's."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    inputs = torch.randn(40, 4)
    with torch.no_grad():
        logits = model(inputs)
    labels = logits.argmax(1)
    labels[:10] = (labels[:10] + 1) % 3  # 10 wrong, 30 right
    loss, accuracy = evaluate(model, inputs, labels, batch_size=16)
    assert accuracy == pytest.approx(0.75, abs=1e-12)
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(logits, labels)), rel=1e-6)
    pooled = evaluate_model(model, inputs, labels, batch_size=16)
    assert (loss, accuracy) == pytest.approx((pooled.loss, pooled.accuracy), rel=1e-6)
