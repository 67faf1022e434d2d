"""Client-level differential privacy of DP-FedAvg (McMahan, Ramage, Talwar and Zhang, 2018).

Each round the server releases S + N(0, (z C)^2 I), S the sum of the sampled clients' updates clipped to
L2 norm C: a bound on what the global model reveals about one client's whole data set, unlike each
client's per-example eps. Clients are a fixed-size sample without replacement, whose amplification holds
for replace-one neighbours (sensitivity 2C), so a round is SampledWithoutReplacement(n, m, Gaussian(z_eff
/ 2)) with that round's eligible n; adaptive clipping (Andrew et al. 2021) releases the unclipped count
too, and the updates get z_delta so that the round's total multiplier is z. The derivations are in
docs/privacy.md ("Client-level DP and secure aggregation") and docs/secure-aggregation.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dp_accounting import dp_event

from privacy.checks import check_in_open_interval, check_integer, check_positive

COVERS = (
    "a whole client's data (every example it holds): the global model released each round, for "
    "replace-one-client neighbours, clients sampled without replacement"
)
SENSITIVITY_FACTOR = 2.0
"""The sum's sensitivity under replace-one neighbours, in units of the clipping norm C."""


@dataclass(frozen=True)
class ClientLevelRound:
    """One released noised sum: m of n clients sampled without replacement, noise z_eff * C."""

    population: int
    sample_size: int
    noise_multiplier: float

    def __post_init__(self) -> None:
        check_integer("population", self.population, 1)
        check_integer("sample_size", self.sample_size, 1)
        if self.sample_size > self.population:
            raise ValueError(f"sample_size={self.sample_size} exceeds population={self.population}")
        if not self.noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier={self.noise_multiplier!r} is out of range: it must be >= 0")

    @property
    def sample_rate(self) -> float:
        return self.sample_size / self.population

    def dp_event(self) -> dp_event.DpEvent:
        """The dp-accounting event of this round (module docstring)."""
        from dp_accounting import dp_event
        gaussian = dp_event.GaussianDpEvent(self.noise_multiplier / SENSITIVITY_FACTOR)
        return dp_event.SampledWithoutReplacementDpEvent(self.population, self.sample_size, gaussian)


class ClientLevelAccountant:
    """The client-level RDP ledger of a run: one event per round that released a noised sum."""

    def __init__(self, delta: float) -> None:
        self.delta = check_in_open_interval("delta", delta, 0.0, 1.0)
        self.rounds: list[ClientLevelRound] = []
        from dp_accounting.privacy_accountant import NeighboringRelation
        from dp_accounting.rdp import RdpAccountant

        self._backend = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)

    def compose(self, release: ClientLevelRound) -> None:
        self.rounds.append(release)
        if release.noise_multiplier > 0:
            self._backend.compose(release.dp_event())

    def epsilon(self) -> float:
        """eps at `delta` over every composed round; inf once a round added no noise, 0 before any."""
        if not self.rounds:
            return 0.0
        if any(release.noise_multiplier == 0 for release in self.rounds):
            return math.inf
        return float(self._backend.get_epsilon(self.delta))

    @property
    def max_sample_rate(self) -> float:
        """The largest per-round sampling rate m / n so far (nan before any round)."""
        return max((release.sample_rate for release in self.rounds), default=math.nan)


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """z_delta, the update noise that leaves the total noise multiplier at z once the clipped count is
    released with noise sigma_b (module docstring; Andrew et al. 2021, Theorem 1). Refuses z >= 2 sigma_b,
    where the count alone would spend more than the whole budget."""
    if noise_multiplier == 0:
        return 0.0
    if not noise_multiplier < 2 * count_stddev:
        raise ValueError(
            f"client-noise-multiplier={noise_multiplier:g} needs "
            f"client-clipped-count-stddev > {noise_multiplier / 2:g} "
            f"(got {count_stddev:g}): the clipped count's noise sigma_b must exceed z / 2 for adaptive clipping; "
            "raise client-clipped-count-stddev (Andrew et al. suggest the expected number of sampled clients / 20) "
            "or lower client-noise-multiplier"
        )
    return float((noise_multiplier ** -2 - (2 * count_stddev) ** -2) ** -0.5)


@dataclass
class AdaptiveClipping:
    """The clipping norm C of client-dp = "adaptive", moved each round towards the `target_quantile` of the
    update norms (module docstring). State: C; the rest is configuration."""

    clipping_norm: float
    target_quantile: float
    learning_rate: float
    count_stddev: float

    def __post_init__(self) -> None:
        check_positive("client-clipping-norm", self.clipping_norm)
        check_in_open_interval("client-clip-target-quantile", self.target_quantile, 0.0, 1.0)
        check_positive("client-clip-learning-rate", self.learning_rate)
        check_positive("client-clipped-count-stddev", self.count_stddev)

    def update(self, unclipped_fraction: float) -> float:
        """C <- C exp(-eta (b_bar - gamma)) for the noised fraction b_bar of updates left unclipped; returns
        the new C. More updates unclipped than the target -> C shrinks; fewer -> C grows."""
        self.clipping_norm *= math.exp(-self.learning_rate * (unclipped_fraction - self.target_quantile))
        return self.clipping_norm

    def state_dict(self) -> dict[str, float]:
        return {"clipping_norm": self.clipping_norm, "count_stddev": self.count_stddev}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.clipping_norm = float(state["clipping_norm"])
        self.count_stddev = float(state["count_stddev"])


def add_gaussian_noise(arrays: list[np.ndarray], std: float) -> None:
    """Add N(0, std^2) to every entry, in place, from a generator seeded by the OS: the noise must not be
    rebuildable from the run's seed (docs/privacy.md). Flower's helper draws from numpy's global state."""
    if std <= 0:
        return
    rng = np.random.default_rng()
    for array in arrays:
        array += rng.normal(0.0, std, array.shape).astype(array.dtype)
