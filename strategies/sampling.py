"""Who a round asks: a sample of the clients that can still train, fixed by (seed, purpose, round), so that a
resumed run, the plain loop of the study (sims/fedavg_loop.py) and `flwr run` ask the same clients."""

from __future__ import annotations

import random

from dirichlet_fl.config import clients_per_round


def seeded_sample(key: tuple[int, str, int], ordered: list[int], population: int, fraction: float) -> list[int]:
    """max(1, int(population * fraction)) of `ordered` (at most all), fixed by key = (seed, purpose, round)."""
    seed, purpose, server_round = key
    size = clients_per_round(population, fraction, len(ordered))
    return random.Random(f"{seed}/{purpose}/{server_round}").sample(ordered, size)
