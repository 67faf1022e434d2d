"""What the server, the clients and the tools share about a run: its data split, its model, its device.

The split is a pure function of the run config and the number of clients, so the server (central
test set), every client (its own shard) and the audit (members per client) all derive the same one.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from dirichlet_fl.config import RunConfig, SplitSpec
from dirichlet_fl.data import (
    AUGMENTED_BY_DEFAULT,
    ImageData,
    load_dataset,
    load_site_file,
    random_crop_flip,
    stratified_split,
)
from dirichlet_fl.models import build_model
from dirichlet_fl.partition import partition_indices
from privacy.mechanisms import LossWeighting, Mechanism, MechanismSpec
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


def federated_split(spec: SplitSpec) -> FederatedSplit:
    """The run's split: the data set and each client's training and local test indices. Cached per
    process, keyed by the SplitSpec alone (Ray actors serve many clients of one run)."""
    return _split(spec)


@functools.lru_cache(maxsize=2)
def _split(spec: SplitSpec) -> FederatedSplit:
    data = load_dataset(spec.dataset, spec.data_root or None, download=spec.download)
    if spec.validation_fraction > 0:
        data = hold_out_validation(data, spec.validation_fraction, spec.seed)
    train_parts = partition_indices(
        data.train_y.numpy(),
        spec.num_clients,
        spec.partitioner,
        beta=spec.beta,
        classes_per_client=spec.classes_per_client,
        seed=spec.seed,
        site_file=spec.site_file or None,
    )
    test_parts = partition_indices(data.test_y.numpy(), spec.num_clients, "iid", seed=spec.seed)
    return FederatedSplit(data, train_parts, test_parts)


def hold_out_validation(data: ImageData, fraction: float, seed: int) -> ImageData:
    """The data with a stratified `fraction` of its training set (fixed by `seed`) as its test set, and
    the real test set dropped: for tuning (learning rates, rounds) without ever looking at the test set."""
    kept, held = (torch.as_tensor(part) for part in stratified_split(data.train_y.numpy(), fraction, seed))
    return replace(data, name=f"{data.name} (validation)", train_x=data.train_x[kept], train_y=data.train_y[kept],
                   test_x=data.train_x[held], test_y=data.train_y[held], val_x=None, val_y=None)


def client_shard(spec: SplitSpec, partition_id: int, device: torch.device) -> ClientShard:
    """Client `partition_id`'s shard, moved to its device once and kept there."""
    if not 0 <= partition_id < spec.num_clients:
        raise ValueError(f"partition-id={partition_id} is out of range: it must lie in [0, {spec.num_clients})")
    return _shard(spec, partition_id, str(device))


@functools.lru_cache(maxsize=16)
def _shard(spec: SplitSpec, partition_id: int, device: str) -> ClientShard:
    split = federated_split(spec)
    train = torch.as_tensor(split.train_parts[partition_id])
    test = torch.as_tensor(split.test_parts[partition_id])
    data = split.data
    return ClientShard(
        train_x=data.train_x[train].to(device),
        train_y=data.train_y[train].to(device),
        test_x=data.test_x[test].to(device),
        test_y=data.test_y[test].to(device),
    )


def cached_client_shard(
    spec: SplitSpec, partition_id: int, device: torch.device, cache_dir: Path
) -> tuple[ClientShard, ImageData]:
    """Client `partition_id`'s shard and the data's shape, from a cache file on the node if present.

    On Flower's Deployment Engine every message starts a fresh process; rebuilding the split each
    time (loading the data set, importing its reader, partitioning) costs more than the round's
    training on small data. The cache file, `<cache_dir>/shard-<key>.pt` keyed by the SplitSpec and
    the partition, holds only this client's shard; an unreadable cache file is rebuilt (it is a
    copy, not a record)."""
    key = hashlib.sha256(repr((spec, partition_id)).encode()).hexdigest()[:16]
    path = cache_dir / f"shard-{key}.pt"
    saved = None
    if path.is_file():
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a truncated or foreign file: rebuild it below
            saved = None
    if saved is None:
        shard = client_shard(spec, partition_id, torch.device("cpu"))
        saved = {
            "train_x": shard.train_x, "train_y": shard.train_y, "test_x": shard.test_x, "test_y": shard.test_y,
            "num_classes": federated_split(spec).data.num_classes,
        }  # fmt: skip
        cache_dir.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(saved, temporary)
        os.replace(temporary, path)
    num_classes = int(saved["num_classes"])
    data = ImageData(
        name=spec.dataset, train_x=saved["train_x"], train_y=saved["train_y"], test_x=saved["test_x"],
        test_y=saved["test_y"], num_classes=num_classes, class_names=tuple(str(c) for c in range(num_classes)),
    )  # fmt: skip
    shard = ClientShard(data.train_x.to(device), data.train_y.to(device), data.test_x.to(device), data.test_y.to(device))
    return shard, data


def site_shard(data_file: str, num_classes: int, device: torch.device) -> tuple[ClientShard, ImageData]:
    """A site's shard from its own data file (dirichlet_fl.data.load_site_file), and the data it came
    from (for the model's input shape). Cached per process by the file's path, size and mtime."""
    stat = Path(data_file).stat() if Path(data_file).is_file() else None
    key = (data_file, stat.st_size, stat.st_mtime_ns) if stat else (data_file, -1, -1)
    return _site_shard(key, num_classes, str(device))


@functools.lru_cache(maxsize=4)
def _site_shard(key: tuple[str, int, int], num_classes: int, device: str) -> tuple[ClientShard, ImageData]:
    data = load_site_file(key[0], num_classes)
    shard = ClientShard(data.train_x.to(device), data.train_y.to(device), data.test_x.to(device), data.test_y.to(device))
    return shard, data


def build_run_model(config: RunConfig, data: ImageData) -> nn.Module:
    """The configured model with its default normalisation (dirichlet_fl.models.MODEL_REGISTRY), or with
    BatchNorm when opted in; refused if it breaks the accountant's assumptions (BatchNorm) unless opted in."""
    norm = "batch" if config.allow_batch_norm else None if config.norm == "default" else config.norm
    model = build_model(config.model, data.in_channels, data.num_classes, data.image_size, norm=norm)
    if config.mechanism == "dirichlet":
        validate_model(model, allow_batch_dependent_layers=config.allow_batch_norm)
    return model


def initial_model(config: RunConfig, data: ImageData) -> nn.Module:
    """The global model at round 0, identical for a given seed."""
    torch.manual_seed(config.seed)
    return build_run_model(config, data)


def augmentation(config: RunConfig) -> Callable[[Tensor, torch.Generator], Tensor] | None:
    """The on-device augmentation for this run, or None (auto: on for CIFAR10 and SVHN, as in the paper)."""
    enabled = config.augment == "on" or (config.augment == "auto" and config.data.dataset in AUGMENTED_BY_DEFAULT)
    return random_crop_flip if enabled else None


def resolve_device(name: str) -> torch.device:
    """auto: the GPU when there is one (several clients may share it), else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} requested but no CUDA device is available; use device='auto' or 'cpu'")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so that a timer measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def shard_too_small(config: RunConfig, partition_id: int, num_examples: int) -> str | None:
    """Why client `partition_id` cannot train (q = batch-size / examples must be < 1), or None if it can."""
    if num_examples > config.batch_size:
        return None
    return (
        f"batch-size={config.batch_size:g} needs a sampling rate batch-size/examples < 1, but client "
        f"{partition_id} has {num_examples} examples: lower batch-size below {num_examples}"
    )


def too_small_to_train(config: RunConfig, split: FederatedSplit) -> dict[int, str]:
    """Clients whose shard is too small for the batch size, with the reason: the server never samples
    them (a Dirichlet split over 1,000+ clients leaves some with a handful of examples; they sit out
    rather than stop the run, and the run folder says who and why)."""
    reasons = {i: shard_too_small(config, i, len(part)) for i, part in enumerate(split.train_parts)}
    return {i: reason for i, reason in reasons.items() if reason is not None}


def mechanism_spec(config: RunConfig, partition_id: int, num_examples: int, target_epsilon: float) -> MechanismSpec:
    """A client's mechanism plan: q = batch-size / its examples, every step it may run over the budget rounds."""
    problem = shard_too_small(config, partition_id, num_examples)
    if problem is not None:
        raise ValueError(problem)
    sample_rate = config.batch_size / num_examples
    return MechanismSpec(
        name=config.mechanism,
        target_epsilon=target_epsilon,
        delta=config.delta,
        sample_rate=sample_rate,
        planned_steps=config.local_steps_per_round(sample_rate) * config.budget_rounds,
        alpha=config.alpha,
        max_grad_norm=config.max_grad_norm,
        num_examples=num_examples,
        loss_weighting=loss_weighting(config),
    )


def loss_weighting(config: RunConfig) -> LossWeighting | None:
    """The Dirichlet NLL's confidence normalisation of this run (dirichlet-weighting), None for the paper's."""
    if config.dirichlet_weighting == "paper":
        return None
    return LossWeighting(config.lr.reference_confidence, config.dirichlet_weight_cap)


def client_learning_rate(config: RunConfig, mechanism: Mechanism, model: nn.Module, shard: ClientShard) -> float:
    """The optimizer rate of one client in one round; the one place this rule lives.

    raw: learning-rate itself. effective: the rate at which the client's private step moves on
    average like a plain cross-entropy step at learning-rate (Theorem 11): learning-rate / kappa_i(s_y)
    for a Dirichlet client with its own r*_i, at the fixed reference confidence s_y. adaptive: the
    same with s_y the global `model`'s mean confidence in the true class on the client's local test
    share (never on its training examples, so the eps of those is unchanged), measured each round
    (reference-confidence when the client holds no test examples).
    DP-SGD and none take learning-rate as given in every mode, and so does Adam: it divides each step
    by a running root-mean-square of the gradients, so a constant factor kappa on the gradient cancels
    and dividing the rate by kappa would multiply Adam's step by 1/kappa."""
    if config.lr.mode == "raw" or config.lr.optimizer == "adam":
        return config.lr.rate
    s_y = config.lr.reference_confidence
    measured = true_class_confidence(model, shard.test_x, shard.test_y) if config.lr.mode == "adaptive" else math.nan
    if math.isfinite(measured):  # a client without local test examples keeps the reference s_y
        s_y = max(measured, MIN_CONFIDENCE)
    return mechanism.step_rate(config.lr.rate, s_y)


MIN_CONFIDENCE = 1e-3
"""Floor of the measured s_y in adaptive mode: kappa(s_y) -> 0 as s_y -> 0, and the rate with it -> inf."""


@torch.no_grad()
def true_class_confidence(model: nn.Module, inputs: Tensor, labels: Tensor) -> float:
    """Mean softmax probability the model gives the true class (nan without examples)."""
    if labels.numel() == 0:
        return math.nan
    model.eval()
    probabilities = torch.softmax(model(inputs), dim=-1)
    return float(probabilities.gather(1, labels.view(-1, 1)).mean())


def client_generator(
    config: RunConfig,
    partition_id: int,
    server_round: int,
    device: torch.device,
    secret: bytes | None = None,
    nonce: int = 0,
) -> torch.Generator:
    """The client's randomness for one round: every Poisson mask, Dirichlet/Gamma draw and DP-SGD noise.

    Without `secret` it is fixed by (seed, client, round): reproducible research, and predictable by
    anyone who knows the run config (the coordinator included). With a node's `secret` (bytes that
    never leave the node) the seed is HMAC-SHA256(secret, client/round/nonce), where `nonce` is the
    number of steps the node's ledger held before this round, so that no two rounds of a node's
    lifetime share noise, even a round the server sends twice."""
    generator = torch.Generator(device=device)
    if secret is None:
        seed = int(np.random.SeedSequence([config.seed, partition_id, server_round]).generate_state(1)[0])
    else:
        message = f"dirichlet-fl/{partition_id}/{server_round}/{nonce}".encode()
        seed = int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:8], "big")
    generator.manual_seed(seed)
    return generator


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
