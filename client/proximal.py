"""FedProx's proximal term on a client's local objective, under every mechanism (Li et al. 2020).

The local objective becomes F(w) + (mu/2) ||w - w_global||^2, w_global the weights the round started from.
The term's gradient, mu (w - w_global), is added to each parameter's gradient by a step pre-hook on the
plain torch optimizer, right before it steps. For the Dirichlet mechanism and `none` that is exactly the
gradient of the loss plus the term. Under DP-SGD the plain optimizer is the one Opacus's DPOptimizer wraps,
and DPOptimizer.step() runs the hook only after its per-example clipping, summing, noising and scaling
(pre_step), when it calls the plain optimizer's step: the per-example gradients, and so the clipping and
the accountant, never see the term. The term reads no example, only w and w_global (which every client
received), so adding it is post-processing of what the mechanism released: no eps changes, under any
mechanism (docs/privacy.md).
"""

from __future__ import annotations

import torch


def add_proximal_term(optimizer: torch.optim.Optimizer, mu: float) -> None:
    """From now on, every step of `optimizer` adds mu (w - w_global) to each parameter's gradient, w_global
    the parameters' values now (load the global weights first). Nothing at mu = 0: the run is plain FedAvg's
    to the bit. Call it on the plain optimizer, before a mechanism wraps it (DP-SGD: see module docstring)."""
    if mu == 0:
        return
    anchors = [(parameter, parameter.detach().clone()) for group in optimizer.param_groups
               for parameter in group["params"]]

    def pull_towards_global(*_: object) -> None:
        with torch.no_grad():
            for parameter, anchor in anchors:
                if parameter.grad is not None:  # a parameter without gradient does not move: its term is 0
                    parameter.grad.add_(parameter.detach() - anchor, alpha=mu)

    optimizer.register_step_pre_hook(pull_towards_global)
