"""docs/privacy.md, "What the weights' guarantee is": the two facts its counterexample rests on, checked on
the project's own Dirichlet step.

1. A Dirichlet per-example gradient r J(x)^T u lies in the row space of J(x) (the logits' Jacobian with
   respect to the parameters), with 1^T u = 0.
2. One Poisson-sampled step of a linear model on D' = {x1} never moves the weights off span{x1}; on
   D = {x1, x} (x orthogonal to x1) it does whenever x is sampled, so P_D(E) = q while P_D'(E) = 0 for
   the event E = "the step has a component along x": no (eps, delta) holds with delta < q.
"""

from __future__ import annotations

import torch
from torch import nn

from privacy.dirichlet import dirichlet_nll_loss
from privacy.mechanisms import DirichletMechanism
from privacy.sampling import poisson_sample

R, ALPHA = 0.3, 3.0


def test_a_dirichlet_gradient_lies_in_the_row_space_of_the_logits_jacobian():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)).double()
    parameters = dict(model.named_parameters())
    x, y = torch.randn(1, 6, dtype=torch.float64), torch.tensor([2])

    def logits(values: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(model, values, (x,)).squeeze(0)

    jacobian = torch.func.jacrev(logits)({name: p.detach() for name, p in parameters.items()})
    rows = torch.cat([jacobian[name].reshape(4, -1) for name in parameters], dim=1)  # J(x): [K, d]
    for draw in range(5):
        generator = torch.Generator().manual_seed(draw)
        model.zero_grad()
        dirichlet_nll_loss(model(x), y, R, ALPHA, generator).backward()
        gradient = torch.cat([p.grad.reshape(-1) for p in parameters.values()])
        coefficients = torch.linalg.lstsq(rows.T, gradient.unsqueeze(1)).solution.squeeze(1)
        residual = gradient - rows.T @ coefficients
        assert gradient.norm() > 1e-8
        assert residual.norm() <= 1e-10 * gradient.norm()
        assert abs(float(coefficients.sum())) <= 1e-10 * float(coefficients.abs().sum())  # 1^T u = 0


def _step_along_x(dataset: torch.Tensor, labels: torch.Tensor, seed: int, q: float) -> tuple[float, bool]:
    """|W1 x - W0 x| after one Poisson-sampled Dirichlet SGD step of a bias-free linear model, and whether
    example 1 (x, when the data set holds it) was in the batch."""
    torch.manual_seed(1)
    model = nn.Linear(3, 2, bias=False)
    before = model.weight.detach().clone()
    mechanism = DirichletMechanism(r=R, alpha=ALPHA, sample_rate=q, delta=1e-5)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    generator = torch.Generator().manual_seed(seed)
    index = poisson_sample(len(labels), q, generator)
    mechanism.train_step(model, optimizer, dataset[index], labels[index], generator)
    x = torch.tensor([0.0, 1.0, 0.0])
    return float(((model.weight.detach() - before) @ x).abs().max()), bool((index == 1).any())


def test_one_step_moves_the_weights_off_the_neighbours_subspace_only_when_the_example_is_sampled():
    q, trials = 0.25, 400
    x1, x = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.0, 1.0, 0.0]])
    without = [_step_along_x(x1, torch.tensor([0]), seed, q) for seed in range(trials)]
    with_x = [_step_along_x(torch.cat([x1, x]), torch.tensor([0, 1]), seed, q) for seed in range(trials)]
    assert all(value == 0.0 for value, _ in without)  # P_D'(E) = 0: W stays in W0 + span{(1,-1) x1^T}
    assert all((value > 0.0) == sampled for value, sampled in with_x)  # E happens exactly when x is sampled
    assert abs(sum(sampled for _, sampled in with_x) / trials - q) < 0.07  # P_D(E) = q
