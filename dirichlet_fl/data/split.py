"""The run's data split and each client's shard of it: a pure function of the split spec.

The split depends only on the SplitSpec (the data set, the partitioner, the seed, the number of
clients), so the server (central test set), every client (its own shard) and the audit (members per
client) all derive the same one. Shards are cached per process, and on a node in a cache file.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from dirichlet_fl.config_groups import SYNTHETIC
from dirichlet_fl.config import SplitSpec
from dirichlet_fl.data.loaders import load_dataset
from dirichlet_fl.data.stratified import stratified_split
from dirichlet_fl.files import atomic_path
from dirichlet_fl.data.image_data import ImageData
from dirichlet_fl.data.partition import partition_indices
from dirichlet_fl.data.data_file import load_site_file
from dirichlet_fl.data.synthetic import SyntheticSpec, client_data, held_out_data


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


def run_data(spec: SplitSpec) -> ImageData:
    """The data set as the server needs it (the model's shape, the central test set): the split's data,
    or for dataset = "synthetic" the held-out clients' examples (no client's shard is built)."""
    if spec.dataset == SYNTHETIC:
        return held_out_data(synthetic_spec(spec))
    return federated_split(spec).data


def synthetic_spec(spec: SplitSpec) -> SyntheticSpec:
    """The generator's spec of a dataset = "synthetic" split spec."""
    alpha, beta, examples = spec.synthetic
    return SyntheticSpec(spec.seed, alpha, beta, examples)


@functools.lru_cache(maxsize=16)
def synthetic_client(spec: SplitSpec, partition_id: int) -> ImageData:
    """Client `partition_id`'s generated examples (dataset = "synthetic"), on the CPU; cached per process."""
    return client_data(synthetic_spec(spec), partition_id)


@functools.lru_cache(maxsize=2)
def _split(spec: SplitSpec) -> FederatedSplit:
    if spec.dataset == SYNTHETIC:
        raise ValueError("dataset='synthetic' has no global split: each client's examples are generated on demand "
                         "(client_shard)")
    data = load_dataset(spec.dataset, spec.data_root or None, download=spec.download, data_path=spec.data_path or None)
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
    if spec.dataset == SYNTHETIC:
        return _on_device(synthetic_client(spec, partition_id), device)
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
        with atomic_path(path) as temporary:
            torch.save(saved, temporary)
    num_classes = int(saved["num_classes"])
    data = ImageData(
        name=spec.dataset, train_x=saved["train_x"], train_y=saved["train_y"], test_x=saved["test_x"],
        test_y=saved["test_y"], num_classes=num_classes, class_names=tuple(str(c) for c in range(num_classes)),
    )  # fmt: skip
    return _on_device(data, device), data


def _on_device(data: ImageData, device: torch.device | str) -> ClientShard:
    """All of `data`'s training and test examples as a shard on `device`."""
    return ClientShard(data.train_x.to(device), data.train_y.to(device), data.test_x.to(device), data.test_y.to(device))


def site_shard(data_file: str, num_classes: int, device: torch.device) -> tuple[ClientShard, ImageData]:
    """A site's shard from its own data file (dirichlet_fl.data.data_file.load_site_file), and the data it came
    from (for the model's input shape). Cached per process by the file's path, size and mtime."""
    stat = Path(data_file).stat() if Path(data_file).is_file() else None
    key = (data_file, stat.st_size, stat.st_mtime_ns) if stat else (data_file, -1, -1)
    return _site_shard(key, num_classes, str(device))


@functools.lru_cache(maxsize=4)
def _site_shard(key: tuple[str, int, int], num_classes: int, device: str) -> tuple[ClientShard, ImageData]:
    data = load_site_file(key[0], num_classes)
    return _on_device(data, device), data
