"""Error codes a client sends back instead of an update; the strategy tells refusals from failures by them."""

BUDGET_EXHAUSTED = 4001
"""A refusal: the round would take the client past its target eps."""
SETUP_FAILED = 4002
"""The client cannot train with this configuration (e.g. an unreachable eps, a too small shard)."""
TRAINING_FAILED = 4003
"""Training failed midway; the client's ledger still holds every step that ran."""
