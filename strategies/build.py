"""The run's strategy, composed from the run config.

Flower's own strategy (`strategy`: strategies/flower_strategies.py) aggregates; the client-level DP wrapper
(`client-dp`: strategies/client_dp.py) goes around it when asked; the private wrapper (strategies/private.py)
goes around that, and its training messages travel by the transport (`secure-aggregation`: in the clear, or
SecAgg+, strategies/secagg_plus.py). Each key's values map to what they build here, once.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.serverapp.strategy import Strategy

from dirichlet_fl.config import RunConfig
from strategies.client_dp import ClientLevelDp
from strategies.flower_strategies import flower_strategy
from strategies.private import ClearTransport, PrivateStrategy, Transport
from strategies.secagg_plus import SecAggPlus

CLIENT_DP: dict[str, Callable[[Strategy, RunConfig], ClientLevelDp | None]] = {
    "none": lambda strategy, config: None,
    "central": lambda strategy, config: ClientLevelDp(strategy, config.client_level, config.privacy.delta,
                                                      adaptive=False),
    "adaptive": lambda strategy, config: ClientLevelDp(strategy, config.client_level, config.privacy.delta,
                                                       adaptive=True),
}
"""Each `client-dp` value: the client-level DP wrapper around the aggregating strategy, or none."""
TRANSPORTS: dict[str, Callable[[RunConfig, ClientLevelDp | None], Transport]] = {
    "none": lambda config, client_dp: ClearTransport(),
    "secaggplus": SecAggPlus,
}
"""Each `secure-aggregation` value: how a round's training messages travel."""


def build_strategy(config: RunConfig) -> PrivateStrategy:
    """The private wrapper around (client-level DP around) Flower's strategy, with the run's transport."""
    aggregator = flower_strategy(config.strategy)
    client_dp = CLIENT_DP[config.client_level.mode](aggregator, config)
    transport = TRANSPORTS[config.secagg.mode](config, client_dp)
    return PrivateStrategy(config, client_dp or aggregator, transport)
