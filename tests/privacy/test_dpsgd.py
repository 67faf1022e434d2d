"""DP-SGD mechanism: calibration, ledger (against Opacus and dp-accounting), state, and the step itself."""

from __future__ import annotations

import json

import dp_accounting
import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant
from torch import nn

from dirichlet_fl.models.networks import build_model
from privacy.dpsgd import EPSILON_TOLERANCE, DPSGDMechanism, expected_batch_size
from privacy.mechanisms import MechanismSpec
from privacy.registry import build_mechanism, restore_mechanism

DELTA = 1e-5


def spec(
    target: float = 1.0, steps: int = 1000, sample_rate: float = 0.01, num_examples: int | None = 500
) -> MechanismSpec:
    return MechanismSpec("dpsgd", target, DELTA, sample_rate, steps, max_grad_norm=1.0, num_examples=num_examples)


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("target, steps, sample_rate", [(1.0, 1000, 0.01), (4.0, 4000, 0.01), (0.5, 300, 0.05)])
def test_calibrated_noise_spends_just_under_the_target_over_the_planned_steps(target, steps, sample_rate):
    mechanism = build_mechanism(spec(target, steps, sample_rate))
    assert isinstance(mechanism, DPSGDMechanism)
    mechanism.record(steps)
    assert target - EPSILON_TOLERANCE <= mechanism.epsilon(DELTA) <= target
    less_noise = DPSGDMechanism(mechanism.noise_multiplier * 0.99, 1.0, sample_rate, 5, DELTA)
    less_noise.record(steps)
    assert less_noise.epsilon(DELTA) > target


def test_expected_batch_size_is_the_rounded_expectation():
    assert build_mechanism(spec(num_examples=537)).expected_batch_size == 5
    assert expected_batch_size(0.01, 560) == 6
    assert expected_batch_size(0.001, 100) == 1
    with pytest.raises(ValueError, match="num_examples"):
        expected_batch_size(0.01, 0)


def test_calibration_needs_the_clients_example_count():
    with pytest.raises(ValueError, match="num_examples"):
        build_mechanism(spec(num_examples=None))


def test_epsilon_after_record_matches_opacus_stepping_and_dp_accounting():
    sigma, q, delta = 1.1, 0.02, 1e-6
    mechanism = DPSGDMechanism(sigma, 1.0, q, 10, delta)
    mechanism.record(300)
    mechanism.record(200)

    opacus = RDPAccountant()
    for _ in range(500):
        opacus.step(noise_multiplier=sigma, sample_rate=q)

    independent = dp_accounting.rdp.RdpAccountant(orders=RDPAccountant.DEFAULT_ALPHAS)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    independent.compose(event, 500)

    assert mechanism.steps == 500
    assert mechanism.epsilon(delta) == pytest.approx(opacus.get_epsilon(delta), rel=1e-12)
    assert mechanism.epsilon(delta) == pytest.approx(independent.get_epsilon(delta), rel=1e-6)


def test_state_round_trips_through_json_and_the_ledger_continues():
    mechanism = build_mechanism(spec())
    mechanism.record(120)
    restored = restore_mechanism(json.loads(json.dumps(mechanism.state_dict())))
    assert isinstance(restored, DPSGDMechanism)
    assert restored.state_dict() == mechanism.state_dict()
    assert restored.parameters() == mechanism.parameters()
    assert restored.epsilon(DELTA) == mechanism.epsilon(DELTA)

    restored.record(80)
    straight = DPSGDMechanism(mechanism.noise_multiplier, 1.0, 0.01, mechanism.expected_batch_size, DELTA)
    straight.record(200)
    assert restored.steps == 200
    assert restored.epsilon(DELTA) == pytest.approx(straight.epsilon(DELTA), rel=1e-12)


def test_restore_refuses_another_mechanisms_state():
    state = build_mechanism(spec()).state_dict()
    with pytest.raises(ValueError, match="dirichlet"):
        DPSGDMechanism.from_state_dict({**state, "mechanism": "dirichlet"})
    with pytest.raises(ValueError):
        DPSGDMechanism.from_state_dict({**state, "ledger": {"mechanism": "prv", "history": []}})


def test_would_exceed_projects_without_mutating():
    mechanism = build_mechanism(spec(steps=1000))
    assert not mechanism.would_exceed(1000, 1.0)
    assert mechanism.would_exceed(1200, 1.0)
    assert mechanism.steps == 0 and mechanism.epsilon(DELTA) == 0

    mechanism.record(900)
    before = mechanism.state_dict()
    assert not mechanism.would_exceed(100, 1.0)
    assert mechanism.would_exceed(300, 1.0)
    assert mechanism.state_dict() == before


def test_empty_batch_steps_on_the_gaussian_noise_alone():
    sigma, clip, batch, lr, seed = 1.3, 0.7, 5, 0.5, 123
    model = tiny_model()
    start = [p.detach().clone() for p in model.parameters()]
    mechanism = DPSGDMechanism(sigma, clip, 0.01, batch, DELTA)
    wrapped, optimizer = mechanism.wrap(model, torch.optim.SGD(model.parameters(), lr=lr))
    empty_x, empty_y = torch.zeros(0, 1, 2, 2), torch.zeros(0, dtype=torch.int64)

    assert mechanism.train_step(wrapped, optimizer, empty_x, empty_y, torch.Generator().manual_seed(seed)) is None

    replay = torch.Generator().manual_seed(seed)
    for before, after in zip(start, model.parameters()):
        noise = torch.normal(0.0, sigma * clip, size=before.shape, generator=replay)
        torch.testing.assert_close(after.detach() - before, -lr * noise / batch)


def test_empty_batch_without_noise_leaves_the_weights_unchanged():
    model = tiny_model()
    start = flat(model)
    mechanism = DPSGDMechanism(0.0, 1.0, 0.01, 5, DELTA)
    wrapped, optimizer = mechanism.wrap(model, torch.optim.SGD(model.parameters(), lr=1.0))
    mechanism.train_step(wrapped, optimizer, torch.zeros(0, 1, 2, 2), torch.zeros(0, dtype=torch.int64), None)
    assert torch.equal(flat(model), start)


def test_without_noise_the_update_is_the_sum_of_clipped_per_example_gradients_over_the_expected_batch():
    clip, batch, lr = 0.5, 10, 0.3
    inputs = 100.0 * torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 2])
    model = tiny_model()
    reference = tiny_model()
    start = flat(model)

    clipped_sum = torch.zeros_like(start)
    for x, y in zip(inputs, labels):
        reference.zero_grad()
        nn.functional.cross_entropy(reference(x[None]), y[None]).backward()
        grad = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        assert grad.norm() > 10 * clip  # clipping is active for every example
        clipped_sum += grad * min(1.0, clip / float(grad.norm()))

    mechanism = DPSGDMechanism(0.0, clip, 0.01, batch, DELTA)
    wrapped, optimizer = mechanism.wrap(model, torch.optim.SGD(model.parameters(), lr=lr))
    mechanism.train_step(wrapped, optimizer, inputs, labels, None)

    step = flat(model) - start
    torch.testing.assert_close(step, -lr * clipped_sum / batch, rtol=1e-4, atol=1e-6)
    assert step.norm() <= lr * len(labels) * clip / batch * (1 + 1e-5)


def test_wrapped_module_shares_the_original_models_parameters():
    torch.manual_seed(0)
    model = build_model("cnn", 1, 10, 8)
    mechanism = DPSGDMechanism(1.0, 1.0, 0.1, 4, DELTA)
    wrapped, optimizer = mechanism.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert all(a is b for a, b in zip(model.parameters(), wrapped.parameters()))

    before = flat(model)
    inputs, labels = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    loss = mechanism.train_step(wrapped, optimizer, inputs, labels, torch.Generator().manual_seed(0))
    assert loss is not None and torch.isfinite(loss)
    assert not torch.equal(flat(model), before)

    fresh = build_model("cnn", 1, 10, 8)
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(flat(fresh), flat(model))


def test_train_step_refuses_an_optimizer_that_was_not_wrapped():
    model = tiny_model()
    mechanism = DPSGDMechanism(1.0, 1.0, 0.1, 4, DELTA)
    with pytest.raises(TypeError, match="wrap"):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        mechanism.train_step(model, optimizer, torch.zeros(1, 1, 2, 2), torch.tensor([0]), None)


def test_rdp_curve_is_opacus_up_to_order_256_and_the_unsampled_bound_above() -> None:
    from opacus.accountants.analysis.rdp import compute_rdp

    mechanism = DPSGDMechanism(1.1, 1.0, 0.02, 10, DELTA)
    mechanism.record(300)
    mechanism = mechanism.with_noise(2.0).after(100)
    low, high = np.array([1.5, 2.0, 17.0, 256.0]), np.array([257.0, 1000.0])
    expected = [compute_rdp(q=0.02, noise_multiplier=s, steps=n, orders=low) for s, n in ((1.1, 300), (2.0, 100))]
    np.testing.assert_array_equal(mechanism.rdp_curve(low), np.zeros(4) + expected[0] + expected[1])
    np.testing.assert_array_equal(mechanism.rdp_curve(high), 300 * high / (2 * 1.1**2) + 100 * high / (2 * 2.0**2))
    subsampled = np.asarray(compute_rdp(q=0.02, noise_multiplier=1.1, steps=300, orders=high))
    assert np.all(mechanism.rdp_curve(high) > subsampled)
