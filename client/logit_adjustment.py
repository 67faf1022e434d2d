"""Logit-adjusted local losses from a client's own labels (run-config key logit-adjustment).

Under label skew each client's data says "my common classes are likely", and a plain loss teaches the shared
model exactly that: the clients without a class push its logit down at every step, and the few clients that hold
it cannot push it back up, least of all through the Dirichlet loss's weak, noisy gradient. With tau > 0 a client
trains on `logits + tau * log(pi)`, `pi` its own class frequencies (add-one smoothed, so a class it does not hold
has a small, finite prior): the prior that its data adds is explained by the offset, so the network's own logits
learn what the clients share (logit adjustment, Menon et al. 2021, computed per client as in FedLC, Zhang et al.
2022). Predictions use the network's logits alone. Labels are public (the Dirichlet mechanism privatises inputs
only), so the offsets change no eps; they never leave the client.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dirichlet_fl.config_groups import LocalTrainingConfig


def logit_offsets(local: LocalTrainingConfig, labels: Tensor, num_classes: int) -> Tensor | None:
    """What the client's training loss adds to every example's logits under the run's logit-adjustment tau:
    None at tau 0 (the plain loss, bit for bit), else adjusted_logit_offsets."""
    if local.logit_adjustment == 0:
        return None
    return adjusted_logit_offsets(labels, num_classes, local.logit_adjustment)


def adjusted_logit_offsets(labels: Tensor, num_classes: int, tau: float) -> Tensor:
    """tau * log((n_k + 1) / (n + K)) for each class k (num_classes,), on `labels`' device: the log of the
    client's add-one-smoothed class frequencies, scaled by tau."""
    counts = torch.bincount(labels, minlength=num_classes).double()
    prior = (counts + 1.0) / (float(labels.numel()) + num_classes)
    return (tau * prior.log()).float()
