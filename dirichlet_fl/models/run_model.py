"""The run's model: the configured network with the normalisation the accountant allows.

Built the same way by the server (its global model and central evaluation), every client and the
audit (dirichlet_fl.models.networks holds the networks themselves).
"""

from __future__ import annotations

import torch
from torch import nn

from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.image_data import ImageData
from dirichlet_fl.models.networks import build_model
from privacy.registry import mechanism_class
from privacy.validation import validate_model


def build_run_model(config: RunConfig, data: ImageData) -> nn.Module:
    """The configured model with its default normalisation (dirichlet_fl.models.networks.MODEL_REGISTRY), or with
    BatchNorm when opted in; refused if it breaks the accountant's assumptions (BatchNorm) unless opted in."""
    network = config.network
    norm = "batch" if network.allow_batch_norm else None if network.norm == "default" else network.norm
    model = build_model(config.network.name, data.in_channels, data.num_classes, data.image_size, norm=norm)
    if mechanism_class(config.privacy.mechanism).validates_model:
        validate_model(model, allow_batch_dependent_layers=config.network.allow_batch_norm)
    return model


def initial_model(config: RunConfig, data: ImageData) -> nn.Module:
    """The global model at round 0, identical for a given seed."""
    torch.manual_seed(config.seed)
    return build_run_model(config, data)
