"""What a client sets up for one round besides its mechanism: its learning rate and its randomness."""

from __future__ import annotations

import hashlib
import hmac
import math

import numpy as np
import torch
from torch import nn

from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.split import ClientShard
from dirichlet_fl.metrics import true_class_confidence
from privacy.mechanisms import Mechanism

MIN_CONFIDENCE = 1e-3
"""Floor of the measured s_y in adaptive mode: kappa(s_y) -> 0 as s_y -> 0, and the rate with it -> inf."""


def client_learning_rate(
    config: RunConfig, mechanism: Mechanism, model: nn.Module, shard: ClientShard, server_round: int
) -> float:
    """The optimizer rate of one client in `server_round`; the one place this rule lives: the mode's rate
    times the warm-up's share of it in that round (Training.warmup_factor, every mechanism alike).

    raw: learning-rate itself. effective: the rate at which the client's private step moves on
    average like a plain cross-entropy step at learning-rate (Theorem 11): learning-rate / kappa_i(s_y)
    for a Dirichlet client with its own r*_i, at the fixed reference confidence s_y. adaptive: the
    same with s_y the global `model`'s mean confidence in the true class on the client's local test
    share (never on its training examples, so the eps of those is unchanged), measured each round
    (reference-confidence when the client holds no test examples).
    DP-SGD and none take learning-rate as given in every mode, and so does Adam: it divides each step
    by a running root-mean-square of the gradients, so a constant factor kappa on the gradient cancels
    and dividing the rate by kappa would multiply Adam's step by 1/kappa."""
    training = config.training  # the network's own optimizer, rate and warm-up unless the keys say otherwise
    warmup = training.warmup_factor(server_round)
    if config.lr.mode == "raw" or training.optimizer == "adam":
        return training.rate * warmup
    s_y = config.lr.reference_confidence
    adaptive = config.lr.mode == "adaptive"
    measured = true_class_confidence(model, shard.test_x, shard.test_y) if adaptive else math.nan
    if math.isfinite(measured):  # a client without local test examples keeps the reference s_y
        s_y = max(measured, MIN_CONFIDENCE)
    return mechanism.step_rate(training.rate, s_y) * warmup


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
