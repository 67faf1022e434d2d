"""What the server, the clients and the tools share about a run: its data split, its model, its device.

The split is a pure function of the run config and the number of clients, so the server (central
test set), every client (its own shard) and the audit (members per client) all derive the same one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from dirichlet_fl.config import RunConfig
from dirichlet_fl.data import AUGMENTED_BY_DEFAULT, ImageData, load_dataset, random_crop_flip
from dirichlet_fl.models import build_model
from dirichlet_fl.partition import partition_indices
from privacy.mechanisms import MechanismSpec
from privacy.validation import validate_model


@dataclass(frozen=True)
class FederatedSplit:
    """The data set and each client's training indices (train_parts) and local test indices (test_parts)."""

    data: ImageData
    train_parts: list[np.ndarray]
    test_parts: list[np.ndarray]


@dataclass(frozen=True)
class ClientShard:
    """One client's data, held on its device as tensors."""

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor

    @property
    def num_examples(self) -> int:
        return int(self.train_y.shape[0])


def federated_split(config: RunConfig, num_clients: int) -> FederatedSplit:
    """The run's split (cached per process: Ray actors serve many clients of one run)."""
    return _split(
        config.dataset,
        config.data_root,
        config.data_download,
        config.partitioner,
        config.beta,
        config.classes_per_client,
        config.site_file,
        config.seed,
        num_clients,
    )


@functools.lru_cache(maxsize=2)
def _split(
    dataset: str,
    data_root: str,
    download: bool,
    partitioner: str,
    beta: float,
    classes_per_client: int,
    site_file: str,
    seed: int,
    num_clients: int,
) -> FederatedSplit:
    data = load_dataset(dataset, data_root or None, download=download)
    train_parts = partition_indices(
        data.train_y.numpy(),
        num_clients,
        partitioner,
        beta=beta,
        classes_per_client=classes_per_client,
        seed=seed,
        site_file=site_file or None,
    )
    test_parts = partition_indices(data.test_y.numpy(), num_clients, "iid", seed=seed)
    return FederatedSplit(data, train_parts, test_parts)


@functools.lru_cache(maxsize=16)
def _shard(config: RunConfig, partition_id: int, num_clients: int, device: str) -> ClientShard:
    split = federated_split(config, num_clients)
    train = torch.as_tensor(split.train_parts[partition_id])
    test = torch.as_tensor(split.test_parts[partition_id])
    data = split.data
    return ClientShard(
        train_x=data.train_x[train].to(device),
        train_y=data.train_y[train].to(device),
        test_x=data.test_x[test].to(device),
        test_y=data.test_y[test].to(device),
    )


def client_shard(config: RunConfig, partition_id: int, num_clients: int) -> ClientShard:
    """Client `partition_id`'s shard, moved to its device once and kept there."""
    if not 0 <= partition_id < num_clients:
        raise ValueError(f"partition-id={partition_id} is out of range: it must lie in [0, {num_clients})")
    return _shard(config, partition_id, num_clients, str(resolve_device(config.device)))


def build_run_model(config: RunConfig, data: ImageData) -> nn.Module:
    """The configured model, refused if it breaks the accountant's assumptions (BatchNorm) unless opted in."""
    norm = "batch" if config.allow_batch_norm else "group"
    model = build_model(config.model, data.in_channels, data.num_classes, data.image_size, norm=norm)
    if config.mechanism == "dirichlet":
        validate_model(model, allow_batch_dependent_layers=config.allow_batch_norm)
    return model


def initial_model(config: RunConfig, data: ImageData) -> nn.Module:
    """The global model at round 0, identical for a given seed."""
    torch.manual_seed(config.seed)
    return build_run_model(config, data)


def augmentation(config: RunConfig):
    """The on-device augmentation for this run, or None (auto: on for CIFAR10 and SVHN, as in the paper)."""
    enabled = config.augment == "on" or (config.augment == "auto" and config.dataset in AUGMENTED_BY_DEFAULT)
    return random_crop_flip if enabled else None


def resolve_device(name: str) -> torch.device:
    """auto: the GPU when there is one (several clients may share it), else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} requested but no CUDA device is available; use device='auto' or 'cpu'")
    return torch.device(name)


def mechanism_spec(config: RunConfig, partition_id: int, num_examples: int, target_epsilon: float) -> MechanismSpec:
    """A client's mechanism plan: q = batch-size / its examples, every step it may run over the budget rounds."""
    sample_rate = config.batch_size / num_examples
    if not 0.0 < sample_rate < 1.0:
        raise ValueError(
            f"batch-size={config.batch_size:g} needs a sampling rate batch-size/examples < 1, but client "
            f"{partition_id} has {num_examples} examples: lower batch-size below {num_examples}"
        )
    return MechanismSpec(
        name=config.mechanism,
        target_epsilon=target_epsilon,
        delta=config.delta,
        sample_rate=sample_rate,
        planned_steps=config.local_steps_per_round(sample_rate) * config.budget_rounds,
        alpha=config.alpha,
        max_grad_norm=config.max_grad_norm,
        num_examples=num_examples,
    )


def client_generator(config: RunConfig, partition_id: int, server_round: int, device: torch.device) -> torch.Generator:
    """The client's randomness for one round (sampling, Dirichlet draws, noise), fixed by (seed, client, round)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(int(np.random.SeedSequence([config.seed, partition_id, server_round]).generate_state(1)[0]))
    return generator
