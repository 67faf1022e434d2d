"""Reference runs for `dirichlet-fl audit RUN --references K`: K runs of the audited job in the plain loop
(sims/fedavg_loop.py), each on a random half of the run's candidates, so that offline LiRA and RMIA
(privacy.audit.attacks) apply to a real federated run.

Reference k flips a fair coin per pooled candidate (dirichlet_fl.runs.audit): a kept member stays with
its client, a kept test candidate joins a client in proportion to that client's share of its class, and
every client keeps its non-candidate examples. The coins never depend on membership, which keeps the
split-half bound valid. The config is the run's but for the seed (seed + REFERENCE_SEED_OFFSET + k), no
federated evaluation and no server-side SecAgg+ or client-level noise (docs/audit.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from dirichlet_fl.data.split import ClientShard, federated_split
from dirichlet_fl.device import resolve_device
from dirichlet_fl.runs.audit import Candidates, ReferenceModels
from dirichlet_fl.runs.reader import FinishedRun
from privacy.audit.attacks import per_example_losses
from sims.fedavg_loop import FedAvgLoop

REFERENCE_SEED_OFFSET = 1_000_003
"""Reference k runs with the audited run's seed + this + k (never the run's own seed)."""


def reference_coins(candidates: Candidates, seed: int, reference: int) -> np.ndarray:
    """Which candidates (members first, then non-members) reference `reference` trains on: a fair coin each."""
    return np.random.default_rng([REFERENCE_SEED_OFFSET, seed, reference]).random(candidates.size) < 0.5


def reference_parts(run: FinishedRun, candidates: Candidates, coins: np.ndarray, rng: np.random.Generator) -> tuple[
        list[np.ndarray], list[np.ndarray]]:
    """Each client's training examples of one reference run: (indices into the training split, indices into
    the test split)."""
    member_coins, test_coins = coins[: len(candidates.members)], coins[len(candidates.members):]
    dropped = candidates.members[~member_coins]
    train = [np.asarray(part)[~np.isin(part, dropped)] for part in run.train_parts]
    labels = run.data.train_y.numpy()
    shares = np.stack([np.bincount(labels[part], minlength=run.data.num_classes) for part in run.train_parts])
    test: list[list[int]] = [[] for _ in run.train_parts]
    test_labels = run.data.test_y.numpy()
    for index in candidates.nonmembers[test_coins]:
        weights = shares[:, test_labels[index]].astype(np.float64)
        weights = weights / weights.sum() if weights.sum() > 0 else np.full(len(weights), 1.0 / len(weights))
        test[int(rng.choice(len(weights), p=weights))].append(int(index))
    return train, [np.asarray(part, dtype=np.int64) for part in test]


def _shards(run: FinishedRun, train: list[np.ndarray], test: list[np.ndarray]) -> dict[int, ClientShard]:
    """The clients' shards on the run's device: training examples from both splits, and each client's local
    test share of the run without the test examples this reference trains on."""
    device = resolve_device(run.config.device)
    trained = np.concatenate(test)
    local = federated_split(run.config.split_spec(run.num_clients)).test_parts
    data, shards = run.data, {}
    for client, (from_train, from_test) in enumerate(zip(train, test)):
        kept = torch.as_tensor(np.setdiff1d(local[client], trained))
        inputs = torch.cat([data.train_x[torch.as_tensor(from_train)], data.test_x[torch.as_tensor(from_test)]])
        labels = torch.cat([data.train_y[torch.as_tensor(from_train)], data.test_y[torch.as_tensor(from_test)]])
        shards[client] = ClientShard(inputs.to(device), labels.to(device), data.test_x[kept].to(device),
                                     data.test_y[kept].to(device))
    return shards


def _confidence(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """softmax[y] of each example, exp(-loss) from the float64 cross-entropy."""
    return np.exp(-per_example_losses(model, inputs, labels))


def train_reference_models(
    run: FinishedRun, candidates: Candidates, count: int, seed: int = 0, log: Callable[[str], None] = print
) -> ReferenceModels:
    """Train `count` reference runs and return their confidences on the candidates and the population."""
    if count < 2:
        raise ValueError(f"--references={count} is out of range: LiRA and RMIA need at least 2 reference runs")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the app's clients train (one CPU each): small batches run far faster
    try:
        return _train(run, candidates, count, seed, log)
    finally:
        torch.set_num_threads(threads)


def _train(
    run: FinishedRun, candidates: Candidates, count: int, seed: int, log: Callable[[str], None]
) -> ReferenceModels:
    """The reference runs one after another (train_reference_models)."""
    data = run.data
    member_index, test_index = torch.as_tensor(candidates.members), torch.as_tensor(candidates.nonmembers)
    population = torch.as_tensor(candidates.population)
    confidences, masks, population_confidences = [], [], []
    for reference in range(count):
        coins = reference_coins(candidates, seed, reference)
        train, test = reference_parts(run, candidates, coins, np.random.default_rng([REFERENCE_SEED_OFFSET, seed,
                                                                                      reference, 1]))
        config = dataclasses.replace(run.config, seed=run.config.seed + REFERENCE_SEED_OFFSET + reference,
                                     fraction_evaluate=0.0)
        loop = FedAvgLoop(config, run.num_clients, _shards(run, train, test))
        rounds = 0
        for server_round in range(1, config.num_server_rounds + 1):
            if loop.run_round(server_round) is None:
                break
            rounds = server_round
        model = loop.model.cpu().eval()
        confidences.append(np.concatenate([_confidence(model, data.train_x[member_index], data.train_y[member_index]),
                                           _confidence(model, data.test_x[test_index], data.test_y[test_index])]))
        population_confidences.append(_confidence(model, data.test_x[population], data.test_y[population]))
        masks.append(coins)
        log(f"reference run {reference + 1}/{count}: {rounds} rounds, trained on {int(coins.sum())} of "
            f"{candidates.size} candidates")
    return ReferenceModels(candidates, np.stack(confidences), np.stack(masks), np.stack(population_confidences))
