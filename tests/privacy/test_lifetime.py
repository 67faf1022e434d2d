"""A site's lifetime spend: runs composed on one RDP curve, calibration for what remains, refusals."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest

import privacy.accounting.lifetime
from privacy.accounting.accountant import AccountantConfig, DirichletAccountant, DirichletEvent
from privacy.accounting.lifetime import (
    USEFUL_FRACTION,
    LifetimeBudgetSpent,
    calibrate_within_lifetime,
    composed_epsilon,
    lifetime_epsilon,
)
from privacy.accounting.rdp import PrivacyCurve, rdp_to_epsilon, subsampled_rdp
from privacy.dpsgd import DPSGDMechanism
from privacy.mechanisms import DirichletMechanism, Mechanism, MechanismSpec, NoPrivacy
from privacy.registry import MECHANISMS, build_mechanism, restore_mechanism
from tests.privacy.reference import theorem10_epsilon

DELTA = 1e-5


def dirichlet_run(r: float, steps: int, q: float = 0.02) -> dict:
    mechanism = DirichletMechanism(r, 3.0, q, DELTA)
    mechanism.record(steps)
    return mechanism.state_dict()


def spec(name: str = "dirichlet", target: float = 1.0, steps: int = 100) -> MechanismSpec:
    return MechanismSpec(name, target, DELTA, 0.02, steps, num_examples=400)


def test_one_run_costs_what_its_own_ledger_says() -> None:
    state = dirichlet_run(0.3, 100)
    assert lifetime_epsilon([state], DELTA) == pytest.approx(DirichletMechanism.from_state_dict(state).epsilon(DELTA))
    assert lifetime_epsilon([], DELTA) == 0.0


def test_two_runs_compose_on_one_curve_not_by_adding_eps() -> None:
    first, second = dirichlet_run(0.3, 100), dirichlet_run(0.2, 150)
    together = lifetime_epsilon([first, second], DELTA)
    accountant = DirichletAccountant(AccountantConfig(target_delta=DELTA))
    accountant.compose(DirichletEvent(0.3, 3.0, 0.02), 100)
    accountant.compose(DirichletEvent(0.2, 3.0, 0.02), 150)
    assert together == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-12)
    alone = [lifetime_epsilon([state], DELTA) for state in (first, second)]
    assert max(alone) < together < sum(alone)


def test_dpsgd_runs_compose_exactly_as_opacus_and_mix_with_dirichlet() -> None:
    from opacus.accountants import RDPAccountant

    dpsgd = build_mechanism(spec("dpsgd", steps=50))
    dpsgd.record(50)
    twice = lifetime_epsilon([dpsgd.state_dict(), dpsgd.state_dict()], DELTA)
    reference = RDPAccountant()
    reference.history = [(dpsgd.noise_multiplier, 0.02, 50), (dpsgd.noise_multiplier, 0.02, 50)]  # type: ignore[attr-defined]
    assert twice == pytest.approx(reference.get_epsilon(DELTA), rel=1e-12)
    mixed = lifetime_epsilon([dpsgd.state_dict(), dirichlet_run(0.3, 100)], DELTA)
    assert math.isfinite(mixed) and mixed > lifetime_epsilon([dirichlet_run(0.3, 100)], DELTA)


def test_a_non_private_run_spends_everything_and_an_unknown_ledger_is_refused() -> None:
    none = build_mechanism(spec("none"))
    none.record(5)
    assert lifetime_epsilon([none.state_dict(), dirichlet_run(0.3, 10)], DELTA) == math.inf
    with pytest.raises(ValueError, match="'laplace'"):
        lifetime_epsilon([{"mechanism": "laplace", "steps": 3}], DELTA)


def test_a_run_is_calibrated_for_what_the_lifetime_budget_still_allows() -> None:
    plan = spec(target=1.0, steps=100)
    fresh = calibrate_within_lifetime(plan, [], 3.0, DELTA)
    assert fresh.parameters()["r"] == build_mechanism(plan).parameters()["r"]  # the run's target binds
    prior = [dirichlet_run(fresh.parameters()["r"], 100), dirichlet_run(fresh.parameters()["r"], 100)]
    three = lifetime_epsilon([*prior, dirichlet_run(fresh.parameters()["r"], 100)], DELTA)
    budget = lifetime_epsilon(prior, DELTA) + 0.5 * (three - lifetime_epsilon(prior, DELTA))
    squeezed = calibrate_within_lifetime(plan, prior, budget, DELTA)
    assert squeezed.parameters()["r"] < fresh.parameters()["r"]
    squeezed.record(100)
    assert budget - 1e-3 < lifetime_epsilon([*prior, squeezed.state_dict()], DELTA) <= budget
    spent = lifetime_epsilon(prior, DELTA)
    with pytest.raises(LifetimeBudgetSpent, match=r"lifetime budget spent: eps .* of lifetime-epsilon="):
        calibrate_within_lifetime(plan, prior, spent * 1.001, DELTA)


EARLIER_RUNS = {  # Mechanism.state_dict() layouts as earlier runs wrote them to a site's ledger file
    "dirichlet": {
        "mechanism": "dirichlet", "event": {"r": 0.2, "alpha": 3.0, "sample_rate": 0.02},
        "ledger": {
            "schema_version": 1, "accounting_method": "rdp-dirichlet-theorem10",
            "config": {"target_delta": 1e-05, "max_epsilon": None, "neighbouring_relation": "add-or-remove-one",
                       "max_order": 4096},
            "compositions": [{"event": {"r": 0.25, "alpha": 3.0, "sample_rate": 0.02}, "count": 40},
                             {"event": {"r": 0.2, "alpha": 3.0, "sample_rate": 0.02}, "count": 10}],
        },
    },
    "dpsgd": {
        "mechanism": "dpsgd", "noise_multiplier": 1.25, "max_grad_norm": 1.0, "sample_rate": 0.02,
        "expected_batch_size": 8, "delta": 1e-05, "ledger": {"mechanism": "rdp", "history": [[1.25, 0.02, 30]]},
    },
    "none": {"mechanism": "none", "sample_rate": 0.02, "steps": 3},
}  # fmt: skip


def dpsgd_run(sigma: float, q: float, *steps: int) -> dict:
    mechanism = DPSGDMechanism(sigma, 1.0, q, 8, DELTA)
    for count in steps:
        mechanism.record(count)
    return mechanism.state_dict()


def none_run(steps: int) -> dict:
    mechanism = NoPrivacy(0.02)
    mechanism.record(steps)
    return mechanism.state_dict()


def reference_lifetime_epsilon(states: list[dict], delta: float) -> float:
    """The lifetime eps as privacy/accounting/lifetime.py computed it before mechanisms answered for themselves, read
    straight off the JSON states: inf once a `none` run trained; DP-SGD alone by Opacus's RDPAccountant;
    otherwise the sum over orders 2..4096 of Theorem 10's curves (inf beyond an event's admissible order)
    and the subsampled Gaussian curves (Opacus's compute_rdp up to order 256, lam/(2 sigma^2) above)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    def steps(state: dict) -> int:
        if state["mechanism"] == "none":
            return state["steps"]
        if state["mechanism"] == "dpsgd":
            return sum(int(entry[2]) for entry in state["ledger"]["history"])
        return sum(int(item["count"]) for item in state["ledger"]["compositions"])

    active = [state for state in states if steps(state) > 0]
    names = {state["mechanism"] for state in active}
    if not active:
        return 0.0
    if "none" in names:
        return math.inf
    if names == {"dpsgd"}:
        accountant = RDPAccountant()
        accountant.history = [tuple(entry) for state in active for entry in state["ledger"]["history"]]
        return float(accountant.get_epsilon(delta))
    orders = np.arange(2, 4097)
    total = np.zeros(orders.size)
    for state in active:
        curve = np.zeros(orders.size)
        if state["mechanism"] == "dirichlet":
            for item in state["ledger"]["compositions"]:
                event = item["event"]
                step = subsampled_rdp(event["r"], event["alpha"], event["sample_rate"], 4096)
                per_step = np.full(orders.size, math.inf)
                per_step[: step.rdp.size] = step.rdp
                curve += int(item["count"]) * per_step
        else:
            exact = orders <= 256
            for sigma, q, count in state["ledger"]["history"]:
                curve[exact] += np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=count, orders=orders[exact]))
                curve[~exact] += count * orders[~exact] / (2 * sigma**2)
        total += curve
    finite = np.isfinite(total)
    return rdp_to_epsilon(PrivacyCurve(orders[finite], total[finite]), delta).epsilon


GOLDEN_HISTORIES = {
    "dirichlet and dpsgd, an untrained none": lambda: [
        EARLIER_RUNS["dirichlet"], dpsgd_run(0.9, 0.05, 20, 5), none_run(0), EARLIER_RUNS["dpsgd"],
    ],
    "a tiny r and a large sigma: the best order is 256, where the Gaussian curve turns to its bound": lambda: [
        dirichlet_run(0.004, 10, q=0.001), dpsgd_run(100.0, 0.01, 100),
    ],
    "a large r admits orders 2 and 3 only": lambda: [dirichlet_run(1.0, 20, q=0.01), EARLIER_RUNS["dirichlet"]],
    "dpsgd runs alone, one untrained none": lambda: [EARLIER_RUNS["dpsgd"], none_run(0), dpsgd_run(0.9, 0.05, 20)],
    "a none run that trained": lambda: [EARLIER_RUNS["dirichlet"], EARLIER_RUNS["dpsgd"], EARLIER_RUNS["none"]],
    "nothing trained": lambda: [none_run(0), dpsgd_run(1.0, 0.02)],
}  # fmt: skip


@pytest.mark.parametrize("delta", [DELTA, 1e-3])
@pytest.mark.parametrize("history", GOLDEN_HISTORIES.values(), ids=GOLDEN_HISTORIES.keys())
def test_lifetime_epsilon_is_exactly_what_it_was_before_mechanisms_answered_for_themselves(history, delta) -> None:
    states = history()
    assert lifetime_epsilon(states, delta) == reference_lifetime_epsilon(states, delta)


def test_the_golden_reference_agrees_with_theorem10_and_dp_accounting() -> None:
    """The reference above is itself right: Dirichlet ledgers against the mpmath evaluation of Theorem 10,
    DP-SGD ledgers against dp-accounting's RDP accountant (a second, independent Gaussian analysis)."""
    import dp_accounting

    assert reference_lifetime_epsilon([dirichlet_run(0.3, 100)], DELTA) == pytest.approx(
        theorem10_epsilon(0.3, 3.0, 0.02, 100, DELTA), rel=1e-9
    )
    independent = dp_accounting.rdp.RdpAccountant(orders=list(np.arange(2, 257)))
    independent.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(0.9)), 25)
    independent.compose(dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.25)), 30)
    mixed_in = [dpsgd_run(0.9, 0.05, 25), EARLIER_RUNS["dpsgd"], dirichlet_run(0.01, 1, q=1e-9)]  # adds ~1e-27
    assert reference_lifetime_epsilon(mixed_in, DELTA) == pytest.approx(independent.get_epsilon(DELTA), rel=1e-6)


def test_earlier_ledgers_load_and_write_back_unchanged() -> None:
    for name, state in EARLIER_RUNS.items():
        restored = restore_mechanism(json.loads(json.dumps(state)))
        assert restored.name == name and restored.state_dict() == state


def test_the_calibration_raises_sigma_for_a_dpsgd_run_and_refuses_a_run_without_noise() -> None:
    plan = spec("dpsgd", target=1.0, steps=100)
    own = build_mechanism(plan)
    assert isinstance(own, DPSGDMechanism)
    prior = [EARLIER_RUNS["dpsgd"], dpsgd_run(0.9, 0.05, 20)]
    alone = lifetime_epsilon([*prior, own.after(100).state_dict()], DELTA)
    budget = lifetime_epsilon(prior, DELTA) + 0.5 * (alone - lifetime_epsilon(prior, DELTA))
    squeezed = calibrate_within_lifetime(plan, prior, budget, DELTA)
    assert isinstance(squeezed, DPSGDMechanism)
    assert own.noise_multiplier < squeezed.noise_multiplier <= own.noise_multiplier / USEFUL_FRACTION
    assert budget - 1e-3 < lifetime_epsilon([*prior, squeezed.after(100).state_dict()], DELTA) <= budget
    with pytest.raises(LifetimeBudgetSpent, match="steps of none"):
        calibrate_within_lifetime(spec("none"), [], 100.0, DELTA)


class ConstantRdp(Mechanism):
    """A mechanism lifetime.py has never heard of: eps(lam) = 0.01 lam per step (a Gaussian with sigma^2 = 50,
    unsampled), with no noise parameter to raise: proof that a new mechanism needs no lifetime code."""

    name = "constant-rdp"
    covers = "a test"

    def __init__(self, steps: int = 0) -> None:
        self.sample_rate = 0.5
        self._steps = steps

    def parameters(self) -> dict[str, float]:
        return {}

    def loss(self, logits, labels, generator):  # type: ignore[no-untyped-def]
        raise NotImplementedError("never trains")

    def epsilon(self, delta: float) -> float:
        return composed_epsilon([self], delta)

    def would_exceed(self, steps: int, max_epsilon: float) -> bool:
        return self.after(steps).epsilon(DELTA) > max_epsilon

    def record(self, steps: int) -> None:
        self._steps += steps

    @property
    def steps(self) -> int:
        return self._steps

    def rdp_curve(self, orders: np.ndarray) -> np.ndarray:
        return 0.01 * self._steps * np.asarray(orders, dtype=float)

    def state_dict(self) -> dict:
        return {"mechanism": self.name, "steps": self._steps}

    @classmethod
    def calibrated(cls, spec: MechanismSpec) -> ConstantRdp:
        return cls()

    @classmethod
    def from_state_dict(cls, state: dict) -> ConstantRdp:
        return cls(int(state["steps"]))


def test_a_new_mechanism_is_one_class_and_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MECHANISMS, ConstantRdp.name, ConstantRdp)
    new = ConstantRdp(100).state_dict()
    orders = np.arange(2, 4097)
    alone = rdp_to_epsilon(PrivacyCurve(orders, 1.0 * orders), DELTA).epsilon
    assert lifetime_epsilon([new], DELTA) == alone
    dirichlet = DirichletMechanism.from_state_dict(EARLIER_RUNS["dirichlet"])
    both = rdp_to_epsilon(PrivacyCurve(orders[:14], 1.0 * orders[:14] + dirichlet.rdp_curve(orders[:14])), DELTA)
    assert lifetime_epsilon([new, EARLIER_RUNS["dirichlet"]], DELTA) == pytest.approx(both.epsilon, rel=1e-12)
    with pytest.raises(LifetimeBudgetSpent, match="steps of constant-rdp"):
        calibrate_within_lifetime(MechanismSpec(ConstantRdp.name, 1.0, DELTA, 0.5, 10_000), [new], alone + 1, DELTA)


def test_lifetime_accounting_never_compares_a_mechanism_name() -> None:
    source = Path(privacy.accounting.lifetime.__file__).read_text()
    constants = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)}
    assert not constants & set(MECHANISMS), "privacy/accounting/lifetime.py names a mechanism: ask the mechanism"
