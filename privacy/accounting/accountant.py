"""One client's privacy ledger for the Dirichlet mechanism: composes the steps it actually ran.

Shaped like Flower 1.42's `flwr.serverapp` PrivacyAccountant protocol (config, num_releases,
compose(event, count), get_epsilon(delta), get_privacy_spent(delta),
would_exceed(event, max_epsilon, count), state_dict / load_state_dict), with immutable event
records and an explicit neighbouring relation as in Google's dp-accounting. The curve itself comes
from privacy.accounting.analysis (Theorem 10); events with different (r, alpha, q) compose by adding their RDP
curves on the orders admissible for all of them (Lemma 12).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from privacy.accounting.rdp import DEFAULT_MAX_ORDER, PrivacyCurve, rdp_to_epsilon, subsampled_rdp
from privacy.checks import check_in_open_interval, check_integer, check_positive

NEIGHBOURING_RELATION = "add-or-remove-one"
"""The only relation Theorem 10 is proved for: datasets differing by one example."""

ACCOUNTING_METHOD = "rdp-dirichlet-theorem10"
_STATE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class DirichletEvent:
    """One step of Algorithm 1: a Poisson(q)-subsampled release of Dir(r s(f(x)) + alpha) per example."""

    r: float
    alpha: float
    sample_rate: float

    def __post_init__(self) -> None:
        check_positive("alpha", self.alpha)
        check_in_open_interval("r", self.r, 0.0, self.alpha)
        check_in_open_interval("sample_rate", self.sample_rate, 0.0, 1.0)


@dataclass(frozen=True)
class AccountantConfig:
    """What a ledger reports against: its delta, its budget, and the neighbouring relation."""

    target_delta: float
    max_epsilon: float | None = None
    neighbouring_relation: str = NEIGHBOURING_RELATION
    max_order: int = DEFAULT_MAX_ORDER

    def __post_init__(self) -> None:
        check_in_open_interval("target_delta", self.target_delta, 0.0, 1.0)
        if self.max_epsilon is not None:
            check_positive("max_epsilon", self.max_epsilon)
        if self.neighbouring_relation != NEIGHBOURING_RELATION:
            raise ValueError(
                f"neighbouring_relation={self.neighbouring_relation!r} is not supported: Theorem 10 "
                f"is proved for {NEIGHBOURING_RELATION!r} only"
            )
        if self.max_order < 2:
            raise ValueError(f"max_order={self.max_order!r} is out of range: it must be >= 2")


@dataclass(frozen=True)
class PrivacySpent:
    """Cumulative spend: (epsilon, delta) at the best order, after num_releases steps."""

    epsilon: float
    delta: float
    num_releases: int
    accounting_method: str
    optimal_order: int


class DirichletAccountant:
    """Composes DirichletEvents; never forgets or reorders what was composed."""

    def __init__(self, config: AccountantConfig) -> None:
        self._config = config
        self._compositions: list[tuple[DirichletEvent, int]] = []

    @property
    def config(self) -> AccountantConfig:
        return self._config

    @property
    def num_releases(self) -> int:
        """Steps composed so far."""
        return sum(count for _, count in self._compositions)

    def compose(self, event: DirichletEvent, count: int = 1) -> None:
        """Record `count` steps of `event` (merged with the last record when identical)."""
        check_integer("count", count, 1)
        if self._compositions and self._compositions[-1][0] == event:
            self._compositions[-1] = (event, self._compositions[-1][1] + count)
        else:
            self._compositions.append((event, count))

    def get_epsilon(self, delta: float) -> float:
        return self.get_privacy_spent(delta).epsilon

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        """(eps, delta) of everything composed; eps = 0 for an empty ledger."""
        delta = self._config.target_delta if delta is None else check_in_open_interval("delta", delta, 0.0, 1.0)
        if not self._compositions:
            return PrivacySpent(0.0, delta, 0, ACCOUNTING_METHOD, 0)
        spent = rdp_to_epsilon(_total_curve(self._compositions, self._config.max_order), delta)
        return PrivacySpent(spent.epsilon, delta, self.num_releases, ACCOUNTING_METHOD, spent.order)

    def would_exceed(self, event: DirichletEvent, max_epsilon: float | None = None, count: int = 1) -> bool:
        """Whether composing `count` more steps of `event` would take eps above the limit (no mutation)."""
        check_integer("count", count, 1)
        limit = self._config.max_epsilon if max_epsilon is None else max_epsilon
        if limit is None:
            raise ValueError("max_epsilon must be given here or in AccountantConfig")
        projected = self._compositions + [(event, count)]
        spent = rdp_to_epsilon(_total_curve(projected, self._config.max_order), self._config.target_delta)
        return spent.epsilon > limit

    def rdp_curve(self, orders: np.ndarray) -> np.ndarray:
        """Sum over the ledger of count * Theorem 10's per-step curve at integer `orders` >= 2 (Lemma 12),
        inf at an order some event does not admit: what a lifetime ledger adds to other mechanisms' curves."""
        orders = integer_orders(orders)
        total = np.zeros(orders.size)
        if orders.size == 0:
            return total
        top = int(orders.max())
        for event, count in self._compositions:
            curve = per_step_curve(event, top)
            per_step = np.full(orders.size, math.inf)
            admitted = orders <= curve.orders[-1]
            per_step[admitted] = curve.rdp[orders[admitted] - 2]
            total += count * per_step
        return total

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the config and the event ledger (the curve is rebuilt from it)."""
        return {
            "schema_version": _STATE_SCHEMA_VERSION,
            "accounting_method": ACCOUNTING_METHOD,
            "config": asdict(self._config),
            "compositions": [{"event": asdict(event), "count": count} for event, count in self._compositions],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict(); refuses another schema, method or configuration."""
        if state.get("schema_version") != _STATE_SCHEMA_VERSION:
            raise ValueError(f"unsupported accountant state schema_version={state.get('schema_version')!r}")
        if state.get("accounting_method") != ACCOUNTING_METHOD:
            raise ValueError(f"accountant state is from {state.get('accounting_method')!r}, not {ACCOUNTING_METHOD!r}")
        if AccountantConfig(**state["config"]) != self._config:
            raise ValueError(f"accountant state config {state['config']} does not match {asdict(self._config)}")
        compositions = [(DirichletEvent(**item["event"]), int(item["count"])) for item in state["compositions"]]
        for _, count in compositions:
            check_integer("count", count, 1)
        self._compositions = compositions


def integer_orders(orders: np.ndarray) -> np.ndarray:
    """`orders` as an int64 array if every one is an integer >= 2 (the only orders Theorem 10 bounds)."""
    values = np.asarray(orders)
    whole = values.astype(np.int64)
    if values.ndim != 1 or not np.array_equal(whole, values) or (whole.size and whole.min() < 2):
        raise ValueError(f"orders={values!r} are not supported: Theorem 10 bounds integer orders >= 2 only")
    return whole


@functools.lru_cache(maxsize=256)
def per_step_curve(event: DirichletEvent, max_order: int) -> PrivacyCurve:
    """Theorem 10's curve of one step of `event` over orders 2..max_order (or fewer, as admitted), cached
    and read-only: a lifetime calibration evaluates the same earlier runs many times."""
    curve = subsampled_rdp(event.r, event.alpha, event.sample_rate, max_order)
    curve.orders.setflags(write=False)
    curve.rdp.setflags(write=False)
    return curve


def _total_curve(compositions: list[tuple[DirichletEvent, int]], max_order: int) -> PrivacyCurve:
    """Sum of count * per-step curve over the orders admissible for every event (Lemma 12)."""
    curves = [(per_step_curve(event, max_order), count) for event, count in compositions]
    top = min(int(curve.orders[-1]) if curve.orders.size else 1 for curve, _ in curves)
    orders = np.arange(2, top + 1)
    total = np.zeros(orders.size)
    for curve, count in curves:
        total += count * curve.rdp[: orders.size]
    return PrivacyCurve(orders, total)
