"""dataset = "synthetic": FedProx's Synthetic(alpha, beta) (Li et al. 2020), generated one client at a time.

Client k's examples come from its own generator, seeded by (seed, k) alone, so a client's shard is built
on demand in O(its examples) and no array of the whole population ever exists (a run samples 10 of
100,000 clients a round and builds only theirs):

    u_k ~ N(0, alpha),  W_k ~ N(u_k, 1) (10 x 60),  b_k ~ N(u_k, 1) (10)     the client's own model
    B_k ~ N(0, beta),   v_k ~ N(B_k, 1) (60),        x ~ N(v_k, Sigma)       its own features
    Sigma = diag(j^-1.2), j = 1..60,                 y = argmax softmax(W_k x + b_k)

alpha (synthetic-alpha) sets how much the clients' labelling models differ, beta (synthetic-beta) how
much their features do; as in FedProx's code the second parameter of N(., .) is a standard deviation.
Each client holds synthetic-examples training examples and a quarter as many local test examples. The
central test set is HELD_OUT_CLIENTS further clients drawn from a fixed seed on a stream of their own,
so it is the same for every run and no training client ever shares their examples. The clients share no
labelling model (each W_k is drawn on its own), so the central accuracy on these unseen clients stays
near chance whatever the training: the measure of learning is the federated accuracy, on each sampled
client's own local test examples (FedProx evaluates the same way). Features are
shaped N x 60 x 1 x 1, so every shard, batch sampler and accountant of the image data sets applies
unchanged, with the softmax model `logreg` (dirichlet_fl.models.networks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dirichlet_fl.data.image_data import ImageData

NUM_FEATURES = 60
NUM_CLASSES = 10
HELD_OUT_CLIENTS = 20
"""Clients whose examples form the central test set."""
HELD_OUT_EXAMPLES = 100
"""Examples of each held-out client: 2,000 central test examples."""
HELD_OUT_SEED = 20_200_307
"""The fixed seed of the held-out clients (not the run's seed: every run is tested on the same examples)."""
_TRAIN_STREAM, _HELD_OUT_STREAM = 1, 2
"""First word of every generator's seed: a training client's key can never equal a held-out one's."""
_COVARIANCE = np.arange(1, NUM_FEATURES + 1, dtype=np.float64) ** -1.2


@dataclass(frozen=True)
class SyntheticSpec:
    """What fixes every client's examples: the run's seed, the non-IID knobs and the shard size."""

    seed: int
    alpha: float
    beta: float
    examples: int

    @property
    def test_examples(self) -> int:
        """Each client's local test examples: a quarter of its training examples, at least one."""
        return max(1, self.examples // 4)


def _examples(key: list[int], alpha: float, beta: float, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` examples of the client whose generator is seeded by `key` (the module docstring's model)."""
    rng = np.random.default_rng(key)
    u, b_mean = rng.normal(0.0, alpha), rng.normal(0.0, beta)
    weights = rng.normal(u, 1.0, (NUM_CLASSES, NUM_FEATURES))
    bias = rng.normal(u, 1.0, NUM_CLASSES)
    v = rng.normal(b_mean, 1.0, NUM_FEATURES)
    x = rng.normal(v, np.sqrt(_COVARIANCE), (count, NUM_FEATURES))
    y = np.argmax(x @ weights.T + bias, axis=1)
    return x.astype(np.float32), y.astype(np.int64)


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(x).reshape(-1, NUM_FEATURES, 1, 1), torch.from_numpy(y)


def client_data(spec: SyntheticSpec, client: int) -> ImageData:
    """Client `client`'s training and local test examples, from (seed, client) alone."""
    if client < 0:
        raise ValueError(f"client={client} must be >= 0")
    x, y = _examples([_TRAIN_STREAM, spec.seed, client], spec.alpha, spec.beta, spec.examples + spec.test_examples)
    train_x, train_y = _tensors(x[: spec.examples], y[: spec.examples])
    test_x, test_y = _tensors(x[spec.examples:], y[spec.examples:])
    return _image_data(train_x, train_y, test_x, test_y)


def held_out_data(spec: SyntheticSpec) -> ImageData:
    """The central test set: HELD_OUT_CLIENTS clients of HELD_OUT_EXAMPLES each, from HELD_OUT_SEED (the
    knobs are the run's: the same kind of population, other clients). Its training split is empty."""
    parts = [_examples([_HELD_OUT_STREAM, HELD_OUT_SEED, i], spec.alpha, spec.beta, HELD_OUT_EXAMPLES)
             for i in range(HELD_OUT_CLIENTS)]
    test_x, test_y = _tensors(np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]))
    return _image_data(test_x[:0], test_y[:0], test_x, test_y)


def _image_data(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor) -> ImageData:
    return ImageData(name="synthetic", train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                     num_classes=NUM_CLASSES, class_names=tuple(str(c) for c in range(NUM_CLASSES)))
