"""Class-balanced loss weights from a client's own labels (run-config key class-weighting).

Under label skew a client holds a few examples of its rare classes, and an unweighted loss lets the common
classes pull every shared logit their way. `balanced` weighs each example of class k by n / (K n_k), the
weight scikit-learn's class_weight="balanced" uses, over the K classes the client holds; a weight is capped
at class-weight-cap (one example of a class must not make a step tens of times larger than the others), and
the weights are then scaled so that the client's examples weigh 1 on average: the expected step, and so the
tuned learning rate, stays that of the unweighted loss. Labels are public (the Dirichlet mechanism
privatises inputs only), so the weights change no eps; they never leave the client.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dirichlet_fl.config_groups import LocalTrainingConfig


def class_weights(local: LocalTrainingConfig, labels: Tensor, num_classes: int) -> Tensor | None:
    """The loss's weight of each class for a client with `labels` under the run's class-weighting: None for
    none (every example weighs 1), balanced_class_weights for balanced."""
    if local.class_weighting == "none":
        return None
    return balanced_class_weights(labels, num_classes, local.class_weight_cap)

def balanced_class_weights(labels: Tensor, num_classes: int, cap: float) -> Tensor:
    """Each class's weight (num_classes,) on `labels`' device: n / (K n_k) capped at `cap`, scaled so that the
    examples' mean weight is 1; 0 for a class the client does not hold (no example of it is ever weighted)."""
    if labels.numel() == 0:
        return torch.ones(num_classes, device=labels.device)
    counts = torch.bincount(labels, minlength=num_classes).double()
    held = counts > 0
    raw = torch.where(held, labels.numel() / (int(held.sum()) * counts.clamp_min(1.0)), 0.0)
    capped = raw.clamp(max=cap)
    scaled = capped * (labels.numel() / float((capped * counts).sum()))
    return scaled.float()
