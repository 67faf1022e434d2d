"""The Dirichlet-perturbed loss: Theorem 11 by Monte Carlo, numerical safety, seeding."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from privacy.attenuation import attenuation, private_learning_rate
from privacy.dirichlet import ConfidenceNormalization, dirichlet_nll_loss
from tests.privacy.reference import expected_loss, loss_variance

SAMPLES = 200_000
Z = 5.0  # tolerance in standard errors: a false failure has probability below 1e-6 per check


def _draws(
    r: float, alpha: float, seed: int = 0, normalization: ConfidenceNormalization | None = None, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    generator = torch.Generator().manual_seed(seed)
    base = scale * torch.randn(10, generator=generator, dtype=torch.float64)
    logits = base.repeat(SAMPLES, 1).requires_grad_(True)
    labels = torch.full((SAMPLES,), 3)
    losses = dirichlet_nll_loss(logits, labels, r, alpha, generator, reduction="none", normalization=normalization)
    losses.sum().backward()
    return losses.detach(), logits.grad, torch.softmax(base, 0), float(torch.softmax(base, 0)[3])


@pytest.mark.parametrize("r, alpha", [(0.2349, 3.0), (2.9, 3.0), (0.05, 0.1), (9.0, 10.0)])
def test_theorem_11_moments_and_expected_gradient(r: float, alpha: float) -> None:
    losses, grads, s, s_y = _draws(r, alpha)
    mean, var = losses.mean().item(), losses.var().item()
    fourth = ((losses - mean) ** 4).mean().item()
    assert abs(mean - expected_loss(s_y, r, alpha, 10)) < Z * math.sqrt(var / SAMPLES)
    assert abs(var - loss_variance(s_y, r, alpha, 10)) < Z * math.sqrt((fourth - var**2) / SAMPLES)
    onehot = torch.zeros(10, dtype=torch.float64)
    onehot[3] = 1.0
    expected_grad = attenuation(s_y, r, alpha) * (s - onehot)
    tolerance = Z * grads.std(dim=0) / math.sqrt(SAMPLES)
    assert torch.all((grads.mean(dim=0) - expected_grad).abs() < tolerance)


@pytest.mark.parametrize("r, alpha, s_ref", [(0.2349, 3.0, 0.9), (2.9, 3.0, 0.5), (0.05, 0.1, 1.0)])
def test_normalised_expected_gradient_is_cross_entropys_times_kappa_at_the_reference(
    r: float, alpha: float, s_ref: float
) -> None:
    """Theorem 11 times the detached weight kappa(s_ref)/kappa(s_y): E[dL/dz] = kappa(s_ref) (s - onehot(y))."""
    _, grads, s, s_y = _draws(r, alpha, normalization=ConfidenceNormalization(s_ref, cap=1e6))
    onehot = torch.zeros(10, dtype=torch.float64)
    onehot[3] = 1.0
    expected_grad = attenuation(s_ref, r, alpha) * (s - onehot)
    assert torch.all((grads.mean(dim=0) - expected_grad).abs() < Z * grads.std(dim=0) / math.sqrt(SAMPLES))


def test_the_cap_bounds_the_weight_of_a_confidently_wrong_example() -> None:
    """With s_y near 0 the uncapped weight is huge; the capped one is `cap` and the gradient cap * paper's."""
    r, alpha, cap = 0.2349, 3.0, 20.0
    paper_losses, paper_grads, s, s_y = _draws(r, alpha, scale=6.0)
    losses, grads, _, _ = _draws(r, alpha, normalization=ConfidenceNormalization(0.9, cap), scale=6.0)
    assert attenuation(0.9, r, alpha) / attenuation(s_y, r, alpha) > cap  # the case is one the cap binds
    assert torch.allclose(losses, cap * paper_losses)
    assert torch.allclose(grads, cap * paper_grads)


def test_normalisation_refuses_a_bad_reference_or_cap() -> None:
    with pytest.raises(ValueError, match="reference-confidence"):
        ConfidenceNormalization(0.0)
    with pytest.raises(ValueError, match="dirichlet-weight-cap"):
        ConfidenceNormalization(0.9, cap=0.5)


@pytest.mark.parametrize("alpha", [0.1, 0.5, 3.0, 10.0])
@pytest.mark.parametrize("r_fraction", [0.0, 0.5, 0.999])
def test_float32_loss_and_gradient_are_finite(alpha: float, r_fraction: float) -> None:
    """Gamma(0.1) draws underflow float32 about once in 10^4; the log-space sampler never does."""
    generator = torch.Generator().manual_seed(1)
    logits = (10 * torch.randn(50_000, 10, generator=generator)).requires_grad_(True)
    labels = torch.randint(0, 10, (50_000,), generator=generator)
    loss = dirichlet_nll_loss(logits, labels, r_fraction * alpha, alpha, generator, reduction="none")
    loss.sum().backward()
    assert torch.isfinite(loss).all()
    assert torch.isfinite(logits.grad).all()


def test_same_generator_seed_gives_the_same_draws() -> None:
    logits = torch.randn(64, 10)
    labels = torch.randint(0, 10, (64,))
    first = dirichlet_nll_loss(logits, labels, 0.3, 3.0, torch.Generator().manual_seed(7), reduction="none")
    second = dirichlet_nll_loss(logits, labels, 0.3, 3.0, torch.Generator().manual_seed(7), reduction="none")
    other = dirichlet_nll_loss(logits, labels, 0.3, 3.0, torch.Generator().manual_seed(8), reduction="none")
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_reductions() -> None:
    logits, labels = torch.randn(8, 5), torch.randint(0, 5, (8,))
    per_example = dirichlet_nll_loss(logits, labels, 0.3, 3.0, torch.Generator().manual_seed(0), reduction="none")
    mean = dirichlet_nll_loss(logits, labels, 0.3, 3.0, torch.Generator().manual_seed(0))
    assert per_example.shape == (8,)
    assert mean.item() == pytest.approx(per_example.mean().item(), rel=1e-6)
    with pytest.raises(ValueError, match="reduction"):
        dirichlet_nll_loss(logits, labels, 0.3, 3.0, reduction="max")


def test_private_learning_rate_divides_by_kappa_at_0_9() -> None:
    assert private_learning_rate(0.1, 0.2349, 3.0) == pytest.approx(0.1 / attenuation(0.9, 0.2349, 3.0))
    s_r = 0.9 * 0.2349
    assert attenuation(0.9, 0.2349, 3.0) == pytest.approx(s_r * float(mpmath.polygamma(1, s_r + 3.0)), rel=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_loss_is_finite_and_seeded() -> None:
    logits = torch.randn(1024, 10, device="cuda", requires_grad=True)
    labels = torch.randint(0, 10, (1024,), device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)
    loss = dirichlet_nll_loss(logits, labels, 0.3, 0.1, generator)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


def test_a_normalised_mechanism_keeps_its_weighting_through_its_state_and_steps_at_the_reference() -> None:
    from privacy.mechanisms import DirichletMechanism, LossWeighting
    from privacy.registry import restore_mechanism

    mechanism = DirichletMechanism(0.2349, 3.0, 0.01, 1e-5, LossWeighting(0.8, 10.0))
    restored = restore_mechanism(mechanism.state_dict())
    assert isinstance(restored, DirichletMechanism) and restored.loss_weighting == LossWeighting(0.8, 10.0)
    assert restored.step_rate(0.1, s_y=0.3) == pytest.approx(private_learning_rate(0.1, 0.2349, 3.0, 0.8))
    paper = DirichletMechanism(0.2349, 3.0, 0.01, 1e-5)
    state = paper.state_dict()
    assert "loss-weighting" not in state  # the paper's loss writes the layout earlier versions wrote
    old = restore_mechanism(state)
    assert isinstance(old, DirichletMechanism) and old.loss_weighting is None
    assert old.step_rate(0.1, s_y=0.3) == pytest.approx(private_learning_rate(0.1, 0.2349, 3.0, 0.3))
