"""Refuse models that break the accountant's assumptions, as Opacus's ModuleValidator does.

Theorem 10 accounts for each example's release p_i ~ Dir(r s(f(x_i)) + alpha) on its own: the
softmax output of example i may depend on x_i only. A layer that mixes examples of a batch
(BatchNorm in training mode normalises with batch statistics) makes every example's output depend on
the whole batch, so one example's input leaks through the others' releases and the bound does not
apply. GroupNorm, LayerNorm and InstanceNorm are per-example and fine.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class IncompatibleModelError(ValueError):
    """The model mixes examples of a batch, so Theorem 10 does not cover its training."""


def batch_dependent_layers(model: nn.Module) -> list[str]:
    """Names of the modules whose output for one example depends on other examples of the batch."""
    return [name or type(model).__name__ for name, module in model.named_modules() if isinstance(module, _BatchNorm)]


def validate_model(model: nn.Module, allow_batch_dependent_layers: bool = False) -> list[str]:
    """Raise IncompatibleModelError for a model with batch-dependent layers unless explicitly allowed.

    Returns the offending layer names (empty for a compatible model). With the opt-in, training
    proceeds but lies outside the accountant's assumptions, and the caller must record that.
    """
    offending = batch_dependent_layers(model)
    if offending and not allow_batch_dependent_layers:
        raise IncompatibleModelError(
            f"model has batch-dependent layers {offending[:5]}{' ...' if len(offending) > 5 else ''}: "
            "BatchNorm normalises each example with statistics of the whole batch, so an example's "
            "released output depends on other examples' inputs and Theorem 10 does not cover it. "
            "Fix: use GroupNorm or no normalisation (every built-in model does unless allow-batch-norm=true), or "
            "opt in explicitly (run config allow-batch-norm=true), which marks the run as outside "
            "the accountant's assumptions"
        )
    return offending
