"""FedProx's proximal term (client/proximal.py): the gradient of (mu/2)||w - w_global||^2 on plain SGD, nothing
at mu = 0, and under DP-SGD added after Opacus's per-example clipping and noise, unclipped and un-noised."""

from __future__ import annotations

import torch
from torch import nn

from client.proximal import add_proximal_term
from client.training import private_trainer
from privacy.dpsgd import DPSGDMechanism

MU, RATE = 0.3, 0.1


def model_and_batch(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    return model, torch.randn(8, 6), torch.randint(0, 3, (8,))


def shifted(model: nn.Module, seed: int = 1) -> dict[str, torch.Tensor]:
    """Move every weight away from where the term is anchored (it is 0 at the anchor); returns the shift."""
    generator = torch.Generator().manual_seed(seed)
    shifts = {name: 0.05 * torch.randn(p.shape, generator=generator) for name, p in model.named_parameters()}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.add_(shifts[name])
    return shifts


def test_sgd_steps_on_the_loss_plus_the_proximal_term() -> None:
    hooked, x, y = model_and_batch()
    anchor = {name: p.detach().clone() for name, p in hooked.named_parameters()}
    optimizer = torch.optim.SGD(hooked.parameters(), lr=RATE)
    add_proximal_term(optimizer, MU)
    reference, _, _ = model_and_batch()
    shifted(hooked), shifted(reference)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=RATE)
    for model, opt, proximal in ((hooked, optimizer, False), (reference, reference_optimizer, True)):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if proximal:  # the objective written out, differentiated by autograd
            loss = loss + MU / 2 * sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())
        loss.backward()
        opt.step()
    for (name, a), b in zip(hooked.named_parameters(), reference.parameters()):
        assert torch.allclose(a, b, atol=1e-7), name


def test_mu_zero_adds_nothing() -> None:
    model, _, _ = model_and_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=RATE)
    add_proximal_term(optimizer, 0.0)
    assert not optimizer._optimizer_step_pre_hooks  # plain FedAvg's optimizer, to the bit


def dpsgd_step(mu: float) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], DPSGDMechanism]:
    """One DP-SGD step (tight clipping, noise from a fixed seed) from shifted weights; returns the weights
    after it, the shift, and the mechanism."""
    model, x, y = model_and_batch()
    mechanism = DPSGDMechanism(noise_multiplier=0.8, max_grad_norm=0.01, sample_rate=0.5, expected_batch_size=8,
                               delta=1e-5)
    trainer = private_trainer(mechanism, model, "sgd", RATE, proximal_mu=mu)  # the term on the plain optimizer
    shift = shifted(model)
    mechanism.record(1)
    trainer.step(x, y, torch.Generator().manual_seed(7))
    return {name: p.detach().clone() for name, p in model.named_parameters()}, shift, mechanism


def test_under_dpsgd_the_term_joins_after_the_per_example_clipping_and_the_noise() -> None:
    """Same data, same noise: the two steps differ by exactly -rate * mu * shift. Had the term entered the
    per-example gradients, the clipping to 0.01 would have cut it down to nearly nothing."""
    with_term, shift, mechanism = dpsgd_step(MU)
    without, _, plain_mechanism = dpsgd_step(0.0)
    for name in with_term:
        assert torch.allclose(with_term[name] - without[name], -RATE * MU * shift[name], atol=1e-6), name
    term_step = RATE * MU * torch.cat([s.flatten() for s in shift.values()]).norm()
    assert term_step > 5 * RATE * 0.01  # 0.01: the most the clipped examples' mean gradient can weigh
    assert (mechanism.steps, mechanism.epsilon(1e-5)) == (plain_mechanism.steps, plain_mechanism.epsilon(1e-5))
