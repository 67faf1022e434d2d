"""The CSPRNG source (privacy/csprng.py): its distributions, Theorem 11 under it, DP-SGD's noise, wiring.

Nothing here depends on a drawn value: every check is a moment or a rate within Z standard errors
(as tests/privacy/test_dirichlet.py does), or a property that fails with probability below 2^-200.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from torch import nn

from privacy.attenuation import attenuation
from privacy.csprng import SecureRandom, secure_standard_gamma
from privacy.dirichlet import dirichlet_nll_loss
from privacy.dpsgd import DPSGDMechanism
from privacy.sampling import poisson_sample
from tests.privacy.reference import expected_loss

SAMPLES = 200_000
Z = 5.0  # tolerance in standard errors: a false failure has probability below 1e-6 per check


def _close(estimate: float, truth: float, standard_error: float) -> bool:
    return abs(estimate - truth) < Z * standard_error


def test_uniforms_lie_in_0_1_and_have_the_uniform_moments() -> None:
    u = SecureRandom(chunk_words=1000).uniform64(SAMPLES)  # a small chunk: many refills
    assert u.min() > 0 and u.max() <= 1
    assert _close(u.mean(), 0.5, math.sqrt(1 / 12 / SAMPLES))
    assert _close(u.var(), 1 / 12, math.sqrt((1 / 80 - 1 / 144) / SAMPLES))


def test_normals_have_mean_0_variance_1_and_normal_kurtosis() -> None:
    z = SecureRandom().normal((SAMPLES + 1,), torch.float64, "cpu")  # an odd count: half a pair is dropped
    assert z.shape == (SAMPLES + 1,)
    assert _close(z.mean().item(), 0.0, math.sqrt(1 / SAMPLES))
    assert _close(z.var().item(), 1.0, math.sqrt(2 / SAMPLES))
    assert _close((z**4).mean().item(), 3.0, math.sqrt(96 / SAMPLES))


@pytest.mark.parametrize("rate", [0.005, 0.3, 1.0])
def test_poisson_masks_from_the_csprng_have_rate_q(rate: float) -> None:
    index = poisson_sample(SAMPLES, rate, SecureRandom(), "cpu")
    assert index.dtype == torch.int64 and torch.all(index[1:] > index[:-1])
    assert _close(index.numel(), rate * SAMPLES, math.sqrt(SAMPLES * rate * (1 - rate)) + 1e-9)


@pytest.mark.parametrize("shape", [0.1, 0.5, 1.0, 3.2, 12.0])
def test_gamma_draws_have_the_gamma_mean_and_variance(shape: float) -> None:
    """E[G] = a, Var[G] = a; the sample variance's own variance uses mu_4 = 3a(a + 2)."""
    g = SecureRandom().standard_gamma64(np.full(SAMPLES, shape))
    assert np.all(g > 0)
    assert _close(g.mean(), shape, math.sqrt(shape / SAMPLES))
    assert _close(g.var(), shape, math.sqrt((3 * shape * (shape + 2) - shape**2) / SAMPLES))


@pytest.mark.parametrize("shape", [0.3, 1.0, 4.0])
def test_the_pathwise_gradient_matches_the_derivatives_of_the_moments(shape: float) -> None:
    """d E[G]/da = 1 and d E[G^2]/da = 2a + 1: the means of dG/da and d(G^2)/da over many draws."""
    a = torch.full((SAMPLES,), shape, dtype=torch.float64, requires_grad=True)
    g = secure_standard_gamma(a, SecureRandom())
    (first,) = torch.autograd.grad(g.sum(), a, retain_graph=True)
    (second,) = torch.autograd.grad((g**2).sum(), a)
    assert _close(first.mean().item(), 1.0, first.std().item() / math.sqrt(SAMPLES))
    assert _close(second.mean().item(), 2 * shape + 1, second.std().item() / math.sqrt(SAMPLES))


@pytest.mark.parametrize("r, alpha", [(0.2349, 3.0), (0.05, 0.1)])
def test_theorem_11_expected_gradient_and_mean_loss_under_the_csprng(r: float, alpha: float) -> None:
    base = torch.randn(10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    logits = base.repeat(SAMPLES, 1).requires_grad_(True)
    losses = dirichlet_nll_loss(logits, torch.full((SAMPLES,), 3), r, alpha, SecureRandom(), reduction="none")
    losses.sum().backward()
    s = torch.softmax(base, 0)
    s_y = float(s[3])
    assert _close(losses.mean().item(), expected_loss(s_y, r, alpha, 10), losses.std().item() / math.sqrt(SAMPLES))
    onehot = torch.zeros(10, dtype=torch.float64)
    onehot[3] = 1.0
    expected_grad = attenuation(s_y, r, alpha) * (s - onehot)
    assert logits.grad is not None
    tolerance = Z * logits.grad.std(dim=0) / math.sqrt(SAMPLES)
    assert torch.all((logits.grad.mean(dim=0) - expected_grad).abs() < tolerance)


def test_float32_loss_and_gradient_are_finite_under_the_csprng() -> None:
    logits = (10 * torch.randn(50_000, 10)).requires_grad_(True)
    labels = torch.randint(0, 10, (50_000,))
    loss = dirichlet_nll_loss(logits, labels, 0.05, 0.1, SecureRandom(), reduction="none")
    loss.sum().backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss).all()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_a_forked_child_never_replays_its_parents_buffered_bits() -> None:
    rng = SecureRandom()
    rng.words(1)  # fills the buffer: the next words are already in memory
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.write(write, rng.words(4).tobytes())
        os._exit(0)
    os.close(write)
    child_words = os.read(read, 32)
    os.close(read)
    os.waitpid(child, 0)
    assert len(child_words) == 32 and child_words != rng.words(4).tobytes()


def _noise_only_step(generator: torch.Generator | SecureRandom) -> torch.Tensor:
    """p.grad after one DP-SGD step on an empty batch: pure noise N(0, (sigma C)^2) / L."""
    model = nn.Linear(400, 100)
    mechanism = DPSGDMechanism(noise_multiplier=2.0, max_grad_norm=1.5, sample_rate=0.01, expected_batch_size=3,
                               delta=1e-5)
    wrapped, optimizer = mechanism.wrap(model, torch.optim.SGD(model.parameters(), lr=0.0))
    empty = torch.zeros(0, 400), torch.zeros(0, dtype=torch.int64)
    assert mechanism.train_step(wrapped, optimizer, *empty, generator) is None
    assert model.weight.grad is not None
    return model.weight.grad.flatten().double()


def test_dpsgd_noise_from_the_csprng_has_the_calibrated_scale() -> None:
    noise = _noise_only_step(SecureRandom())
    std = 2.0 * 1.5 / 3
    assert _close(noise.mean().item(), 0.0, std / math.sqrt(noise.numel()))
    assert _close(noise.var().item(), std**2, std**2 * math.sqrt(2 / noise.numel()))


def test_dpsgd_with_a_seeded_generator_is_unchanged_and_reproducible() -> None:
    first = _noise_only_step(torch.Generator().manual_seed(3))
    assert torch.equal(first, _noise_only_step(torch.Generator().manual_seed(3)))


def test_train_locally_draws_its_privacy_randomness_from_the_csprng_not_the_seed() -> None:
    """Two runs from the same seeded generator and weights diverge under secure-rng; the ledger still composes."""
    from client.training import PoissonBatches, train_locally
    from privacy.mechanisms import DirichletMechanism

    data = torch.Generator().manual_seed(0)
    inputs, labels = torch.randn(200, 6, generator=data), torch.randint(0, 3, (200,), generator=data)
    torch.manual_seed(0)
    initial = nn.Linear(6, 3).state_dict()
    weights = []
    for _ in range(2):
        model = nn.Linear(6, 3)
        model.load_state_dict(initial)
        mechanism = DirichletMechanism(0.5, 3.0, 0.1, 1e-5)
        batches = PoissonBatches(inputs, labels, torch.Generator().manual_seed(1), privacy_rng=SecureRandom())
        loss = train_locally(model, torch.optim.SGD(model.parameters(), lr=0.5), mechanism, batches, 5)
        assert mechanism.steps == 5 and math.isfinite(loss)
        weights.append(model.weight.detach().clone())
    assert not torch.equal(weights[0], weights[1])


def test_secure_rng_is_a_run_config_key_and_the_summary_says_secure() -> None:
    from dirichlet_fl.config import RunConfig
    from dirichlet_fl.protocol import NOISE_FROM_SECRET, NOISE_FROM_SEED, NOISE_SECURE
    from dirichlet_fl.runs.writer import RoundRecord

    assert RunConfig.from_run_config({"secure-rng": "true", "mechanism": "dpsgd"}).randomness.secure_rng
    assert not RunConfig().randomness.secure_rng
    with pytest.raises(ValueError, match="secure-rng='maybe' is invalid"):
        RunConfig.from_run_config({"secure-rng": "maybe"})
    record = RoundRecord(1, trained={0: {"secure-rng": 1, "node-secret": 1}, 1: {"node-secret": 1}, 2: {}})
    assert record.noise == {NOISE_SECURE, NOISE_FROM_SECRET, NOISE_FROM_SEED}
    assert NOISE_SECURE == "secure (CSPRNG)"


@pytest.mark.parametrize("mechanism", ["dirichlet", "dpsgd"])
def test_a_client_trains_under_secure_rng_and_says_so(mechanism: str) -> None:
    """The ClientApp end to end: secure-rng=true trains, composes its steps and reports secure-rng = 1."""
    from flwr.app import ArrayRecord

    import client.client_app as client_app
    from dirichlet_fl.config import RunConfig
    from dirichlet_fl.data.split import federated_split
    from dirichlet_fl.models.run_model import initial_model
    from tests.helpers import client_context, train_message

    context = client_context({"local-steps": 4, "partitioner": "iid", "mechanism": mechanism, "secure-rng": True})
    config = RunConfig.from_run_config(context.run_config)
    arrays = ArrayRecord(initial_model(config, federated_split(config.split_spec(2)).data).state_dict())
    reply = client_app.train(train_message(arrays, 1), context)
    assert not reply.has_error()
    metrics = reply.content["metrics"]
    assert metrics["secure-rng"] == 1 and metrics["steps"] == 4 and 0 < metrics["epsilon"] <= 1.0
