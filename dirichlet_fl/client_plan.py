"""What the run config plans for each client: whether its shard can train, and its mechanism's spec.

Both follow from q = batch-size / the client's examples, which must be < 1: the server leaves out the
clients that cannot train (too_small_to_train), the pre-flight names them, and every client that can
calibrates its mechanism from mechanism_spec (its q and every step it may run over the budget rounds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dirichlet_fl.config import RunConfig
from privacy.mechanisms import MechanismSpec, loss_weighting

if TYPE_CHECKING:  # the split holds torch tensors; planning a client needs only its size (`check` stays torch-free)
    from dirichlet_fl.data.split import FederatedSplit


def shard_too_small(config: RunConfig, partition_id: int, num_examples: int) -> str | None:
    """Why client `partition_id` cannot train (q = batch-size / examples must be < 1), or None if it can."""
    if num_examples > config.local.batch_size:
        return None
    return (
        f"batch-size={config.local.batch_size:g} needs a sampling rate batch-size/examples < 1, but client "
        f"{partition_id} has {num_examples} examples: lower batch-size below {num_examples}"
    )


def too_small_to_train(config: RunConfig, split: FederatedSplit) -> dict[int, str]:
    """Clients whose shard is too small for the batch size, with the reason: the server never samples
    them (a Dirichlet split over 1,000+ clients leaves some with a handful of examples; they sit out
    rather than stop the run, and the run folder says who and why)."""
    reasons = {i: shard_too_small(config, i, len(part)) for i, part in enumerate(split.train_parts)}
    return {i: reason for i, reason in reasons.items() if reason is not None}


def mechanism_spec(config: RunConfig, partition_id: int, num_examples: int, target_epsilon: float) -> MechanismSpec:
    """A client's mechanism plan: q = batch-size / its examples, every step it may run over the budget rounds."""
    problem = shard_too_small(config, partition_id, num_examples)
    if problem is not None:
        raise ValueError(problem)
    sample_rate = config.local.batch_size / num_examples
    return MechanismSpec(
        name=config.privacy.mechanism,
        target_epsilon=target_epsilon,
        delta=config.privacy.delta,
        sample_rate=sample_rate,
        planned_steps=config.local.steps_per_round(sample_rate) * config.budget_rounds,
        alpha=config.privacy.alpha,
        max_grad_norm=config.privacy.max_grad_norm,
        num_examples=num_examples,
        loss_weighting=loss_weighting(config.privacy.dirichlet_weighting, config.lr.reference_confidence,
                                      config.privacy.dirichlet_weight_cap),
    )
