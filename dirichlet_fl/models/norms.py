"""The models and the normalisation layers they may use, by name; torch-free so that config validation and
the command line stay cheap (dirichlet_fl/models/networks.py builds the networks themselves).

none and GroupNorm keep each example's forward pass independent of the rest of its batch (per-example
accounting and DP-SGD need that); BatchNorm only by explicit opt-in (allow-batch-norm).
"""

from __future__ import annotations

MODELS = ("cnn", "lenet", "resnet9", "resnet18", "inception", "logreg")
"""Every network dirichlet_fl.models.networks.build_model builds (its MODEL_REGISTRY holds one entry per name)."""
NORMS = ("none", "group", "batch")
"""Also accepted: `group-K`, GroupNorm with K channels per group (e.g. group-8, group-16)."""


def group_size(norm: str) -> int | None:
    """K of `group-K` (0 for plain `group`), None for the other norms; a ValueError for a malformed one."""
    if norm == "group":
        return 0
    if not norm.startswith("group-"):
        return None
    text = norm.removeprefix("group-")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"norm={norm!r} is invalid: group-K needs a whole K >= 1 channels per group, e.g. group-8")
    return int(text)


def check_norm(norm: str) -> str:
    """`norm` itself if it is one of NORMS or group-K; a ValueError naming the valid values otherwise."""
    if norm not in NORMS and group_size(norm) is None:
        raise ValueError(f"norm={norm!r} is unknown; valid: {', '.join(NORMS)} or group-K (K channels per group)")
    return norm
