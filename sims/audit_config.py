"""The audit experiment's parameters (sims/audit_experiment.py), in a module that imports nothing heavy
so that the command line can show their defaults without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

from privacy.analysis import PAPER_DELTA
from privacy.checks import check_in_open_interval, check_integer, check_positive
from privacy.registry import MECHANISMS


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything that determines the experiment's result (saved as config.json next to it)."""

    dataset: str = "mnist-idx"
    data_root: str | None = None
    epsilon: float = 1.0
    delta: float = PAPER_DELTA
    alpha: float = 3.0
    sample_rate: float = 0.01
    steps: int = 4000
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    candidates: int = 1000
    extra_train: int = 0
    model: str = "cnn"
    learning_rate: float = 0.025
    dpsgd_learning_rate: float = 0.005
    optimizer: str = "sgd"
    max_grad_norm: float = 1.0
    mechanisms: tuple[str, ...] = tuple(MECHANISMS)
    workers: int = 2

    def validate_flags(self) -> None:
        """Raise ValueError naming the flag when a value is out of range (before any data is loaded)."""
        check_positive("--epsilon", self.epsilon)
        check_in_open_interval("--delta", self.delta, 0.0, 1.0)
        check_positive("--alpha", self.alpha)
        check_in_open_interval("--sample-rate", self.sample_rate, 0.0, 1.0)
        check_integer("--steps", self.steps, 1)
        check_integer("--workers", self.workers, 1)
        check_positive("--learning-rate", self.learning_rate)
        check_positive("--dpsgd-learning-rate", self.dpsgd_learning_rate)
        check_positive("--max-grad-norm", self.max_grad_norm)
        if not self.seeds:
            raise ValueError("--seeds=0 is out of range: it must be >= 1")
        if self.candidates < 8:
            raise ValueError(f"--candidates={self.candidates} is out of range: it must be >= 8")
        unknown = [name for name in self.mechanisms if name not in MECHANISMS]
        if unknown or not self.mechanisms:
            raise ValueError(f"--mechanisms has unknown {unknown}; valid: {', '.join(MECHANISMS)}")

    def validate(self, num_train: int) -> None:
        """Raise ValueError naming the flag when the split or the plan is impossible."""
        self.validate_flags()
        if self.candidates < 8:
            raise ValueError(f"--candidates={self.candidates} is out of range: it must be >= 8")
        needed = self.candidates + self.candidates // 2 + self.extra_train
        if needed > num_train:
            raise ValueError(
                f"--candidates={self.candidates} and --extra-train={self.extra_train} need {needed} training "
                f"examples (candidates, a control set as large as members + extra), but {self.dataset} has {num_train}"
            )
        if not 0.0 < self.sample_rate < 1.0 or self.steps < 1 or not self.seeds or self.workers < 1:
            raise ValueError("need 0 < --sample-rate < 1, --steps >= 1, at least one seed and --workers >= 1")
        unknown = [name for name in self.mechanisms if name not in MECHANISMS]
        if unknown:
            raise ValueError(f"--mechanisms has unknown {unknown}; valid: {', '.join(MECHANISMS)}")
