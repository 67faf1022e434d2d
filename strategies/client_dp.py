"""Client-level DP (DP-FedAvg) as a wrapper around the aggregating strategy, whichever Flower strategy it is.

Every update is clipped to client-clipping-norm C on the client (client/secagg_plus.py: Flower's
`fixedclipping_mod`, or the same FlatClip inside the SecAgg+ bridge), and the sum gets N(0, (z C)^2)
noise, z = client-noise-multiplier:
- without SecAgg+, by this wrapper, on the uniform mean of the k updates it is handed (std z C / k, as
  Flower's `compute_stdv`), each clipped again (FlatClip is idempotent, so a client that skipped it cannot
  raise the sensitivity);
- with SecAgg+, by the clients: each of the m sampled clients adds its share N(0, (z C)^2 / m) before
  masking (noise_shares()), so the server only ever unmasks a noised sum, which the transport hands on as
  one reply (strategies/secagg_plus.py); when only k < m clients contribute, the noise is z sqrt(k / m) C, and
  that smaller multiplier is what the ledger composes.
Adaptive clipping (client-dp = "adaptive", Andrew et al. 2021; the analysis is in privacy/accounting/client_level.py).
C starts at client-clipping-norm and follows the target quantile of the update norms: each round the
server sends the round's C, each sampled client reports whether its update was left unclipped, and the
noised count moves C for the next round. The count's noise is sigma_b = client-clipped-count-stddev (0: the
first round's number of sampled clients / 20, fixed for the run), and the updates get
z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2 so that the round's total noise multiplier stays z. Without SecAgg+ the
bits arrive in the clear (Flower's `adaptiveclipping_mod`) and this wrapper adds N(0, sigma_b^2) to their
count; with SecAgg+ each client adds its share N(0, sigma_b^2 / m) to its bit inside the masked vector.

The wrapped strategy then aggregates the noised mean, handed to it as one reply (the weights sent plus the
noised mean update, weight 1): FedAvg returns it as it is, FedAdam takes it as its pseudo-gradient. All
it sees is the noised release, so its server optimizer is post-processing and costs no client-level eps
(Flower's DifferentialPrivacy*FixedClipping wrappers add the noise after the wrapped strategy's step
instead, which under a server optimizer leaves its moments un-noised). Nor do Flower's wrappers fit the
private wrapper: they skip aggregation whenever any client replies with an error (every budget refusal
would void the round) and average with the example-count weights. Flower's
DifferentialPrivacy*AdaptiveClipping wrappers count the clipped updates but move C as if they were the
unclipped ones (C runs away from the quantile). The ledger is privacy/accounting/client_level.py; the round's
client-level eps reaches the run's records through the aggregate's metrics (private.CLIENT_LEVEL_PREFIX).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import astuple
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.supercore.differential_privacy import (
    KEY_CLIPPING_NORM,
    KEY_NORM_BIT,
    clip_inputs_inplace,
    compute_stdv,
    get_norm,
)

from dirichlet_fl.config_groups import ClientDpConfig
from dirichlet_fl.protocol import CLIPPED_COUNT_NOISE_STD, NOISE_SHARE_STD, Metrics
from privacy.accounting.client_level import (
    AdaptiveClipping,
    ClientLevelAccountant,
    ClientLevelRound,
    add_gaussian_noise,
    update_noise_multiplier,
)
from strategies.flower_strategies import load_strategy_state, strategy_state
from strategies.wrapped import ARRAYS, CLIENT_LEVEL_PREFIX, SECURE_SUM, WEIGHT, OfferedClients, one_reply

NDArrays = list[np.ndarray]
UNCLIPPED_FRACTION = "unclipped-fraction"
"""Metric of a secure-sum reply under client-dp = "adaptive": the noised mean of the clients' unclipped bits."""


def noised_unclipped_count(clipped_bits: list[Any], count_stddev: float) -> float:
    """The number of updates left unclipped (from `adaptiveclipping_mod`'s bits, 1 = clipped) plus
    N(0, sigma_b^2) from OS entropy."""
    count = np.array([float(sum(1 - int(bit) for bit in clipped_bits))])
    add_gaussian_noise([count], count_stddev)
    return float(count[0])


def noised_mean_update(current: NDArrays, weights: list[NDArrays], clipping_norm: float,
                       noise_multiplier: float) -> NDArrays:
    """DP-FedAvg's server step: the uniform mean of the clients' updates (their `weights` minus `current`),
    each clipped to `clipping_norm` (again: the clients already did, and FlatClip is idempotent, so a
    client that skipped it cannot raise the sensitivity), plus N(0, (z C / k)^2) noise (Flower's
    compute_stdv) for k updates."""
    updates = [[np.subtract(new, old, dtype=np.float64) for new, old in zip(client, current)] for client in weights]
    for update in updates:
        if get_norm(update) > clipping_norm:
            clip_inputs_inplace(update, clipping_norm)
    mean = [np.mean([update[i] for update in updates], axis=0) for i in range(len(current))]
    add_gaussian_noise(mean, compute_stdv(noise_multiplier, clipping_norm, len(updates)))
    return mean


def plus_update(arrays: ArrayRecord, update: NDArrays) -> ArrayRecord:
    """The weights `arrays` moved by `update`, in their own dtypes."""
    return ArrayRecord({name: Array(np.asarray(old + delta).astype(old.dtype))
                        for name, old, delta in zip(arrays.keys(), arrays.to_numpy_ndarrays(), update)})


class ClientLevelDp(Strategy):
    """Client-level DP around `strategy` (module docstring): clipping norm out, noised mean in, ledger kept.

    `adaptive`: C follows the target quantile of the update norms (client-dp = "adaptive")."""

    def __init__(self, strategy: Strategy, settings: ClientDpConfig, delta: float, adaptive: bool) -> None:
        self.strategy = strategy
        self.settings = settings
        self.client_level = ClientLevelAccountant(delta)
        self.adapts = adaptive
        self.adaptive: AdaptiveClipping | None = None
        """The adaptive clipping, from the first round's sample on (its sigma_b depends on it)."""
        self.current_arrays = ArrayRecord()
        self.eligible = 0
        self.sampled = 0

    def summary(self) -> None:
        self.strategy.summary()

    def state_dict(self) -> dict[str, Any]:
        """The client-level ledger's rounds and the adaptive clipping (a resumed run keeps composing), with the
        wrapped strategy's state."""
        rounds = [list(astuple(r)) for r in self.client_level.rounds]
        adaptive = None if self.adaptive is None else self.adaptive.state_dict()
        return {"client_level_rounds": rounds, "adaptive_clipping": adaptive, **strategy_state(self.strategy)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for population, sample_size, multiplier in state.get("client_level_rounds", []):
            self.client_level.compose(ClientLevelRound(int(population), int(sample_size), float(multiplier)))
        if state.get("adaptive_clipping"):
            saved = state["adaptive_clipping"]
            self.adaptive = self.settings.adaptive_clipping(float(saved["count_stddev"]))
            self.adaptive.load_state_dict(saved)
        load_strategy_state(self.strategy, state)

    @property
    def clipping_norm(self) -> float:
        """This round's C: client-clipping-norm, or where adaptive clipping has moved it."""
        return self.settings.clipping_norm if self.adaptive is None else self.adaptive.clipping_norm

    @property
    def update_noise_multiplier(self) -> float:
        """The noise multiplier of the update sum: z, or z_delta under adaptive clipping."""
        z = self.settings.noise_multiplier
        return z if self.adaptive is None else update_noise_multiplier(z, self.adaptive.count_stddev)

    def noise_shares(self, sampled: int) -> dict[str, float]:
        """What each of `sampled` clients adds before SecAgg+ masks its vector: its share of the update's noise
        and (adaptive) of the unclipped count's."""
        shares = {NOISE_SHARE_STD: self.update_noise_multiplier * self.clipping_norm / math.sqrt(sampled)}
        if self.adaptive is not None:
            shares[CLIPPED_COUNT_NOISE_STD] = self.adaptive.count_stddev / math.sqrt(sampled)
        return shares

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's messages, the clipping norm riding along (Flower's key); under adaptive
        clipping each client also reports its bit (count noise 0 here: this wrapper noises the count)."""
        self.current_arrays = arrays
        config[KEY_CLIPPING_NORM] = self.clipping_norm
        if self.adapts:
            config[CLIPPED_COUNT_NOISE_STD] = 0.0
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self.sampled = len(messages)
        self.eligible = grid.eligible if isinstance(grid, OfferedClients) else len(list(grid.get_node_ids()))
        if self.adapts and self.adaptive is None and messages:
            self.adaptive = self.settings.adaptive_clipping(self.settings.count_stddev(len(messages)))
        return messages

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's aggregate of the noised mean, and the round's client-level DP as metrics."""
        replies = list(replies)
        if not replies:
            return None, None
        clipping_norm = self.clipping_norm
        secure = replies[0].content.metric_records["metrics"].get(SECURE_SUM) if len(replies) == 1 else None
        if secure is None:  # the clients' own updates: clipped, averaged and noised here
            noised, unclipped = self._noised_mean(replies)
            multiplier = self.settings.noise_multiplier
        else:  # the unmasked sum of `secure` clients' noised updates
            noised = replies
            shown = replies[0].content.metric_records["metrics"].get(UNCLIPPED_FRACTION)
            unclipped = None if shown is None else float(cast(float, shown))
            multiplier = self.settings.noise_multiplier * math.sqrt(int(cast(int, secure)) / self.sampled)
        metrics: Metrics = {"clipping-norm": clipping_norm}
        if self.adaptive is not None and unclipped is not None:
            metrics["unclipped-fraction"] = unclipped
            self.adaptive.update(unclipped)
        self.client_level.compose(ClientLevelRound(self.eligible, self.sampled, multiplier))
        metrics |= {"epsilon": self.client_level.epsilon(), "delta": self.client_level.delta,
                    "sample-rate": self.client_level.max_sample_rate, "rounds": len(self.client_level.rounds)}
        arrays, _ = self.strategy.aggregate_train(server_round, noised)
        return arrays, MetricRecord({f"{CLIENT_LEVEL_PREFIX}{key}": value for key, value in metrics.items()})

    def _noised_mean(self, replies: list[Message]) -> tuple[list[Message], float | None]:
        """Client-level DP without SecAgg+: the weights sent plus the uniform mean of the clipped updates,
        noised here, as one reply; and (adaptive) the noised fraction of updates left unclipped."""
        updates = [reply.content.array_records[ARRAYS].to_numpy_ndarrays() for reply in replies]
        mean = noised_mean_update(self.current_arrays.to_numpy_ndarrays(), updates, self.clipping_norm,
                                  self.update_noise_multiplier)
        unclipped = None
        if self.adaptive is not None:
            bits = [reply.content.metric_records["metrics"][KEY_NORM_BIT] for reply in replies]
            unclipped = noised_unclipped_count(bits, self.adaptive.count_stddev) / len(updates)
        return [one_reply(plus_update(self.current_arrays, mean), {WEIGHT: 1.0})], unclipped
