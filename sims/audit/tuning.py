"""The audit experiment picks its own rates: every arm without a --rate tries the effective SGD rates of
its mechanism's grid (and DP-SGD the clip norms of its grid with each), and keeps the setting whose model
is most accurate on the validation split (ties: the first in grid order).

Why on non-candidates only: a rate chosen by how well a model fits the candidates would depend on
which of them are members, and the audit's bounds assume that nothing but the target's training does.
The tuning models train on the tuning seed's non-candidates (the control's training set, as large as
the arm's) and are scored on the validation split, which no model trains on; the choice is made once,
on the first seed's split, and reused for every seed. `none` and the control share one tuning (the same
mechanism on the same data).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sims.audit.config import DEFAULT_MAX_GRAD_NORM, Arm, ExperimentConfig, reported_clip
from sims.audit.training import Job, Setting, TrainedModel, reference_arm, run_jobs


@dataclass(frozen=True)
class Choice:
    """An arm's setting and where it came from: "tuned" (with its validation accuracy) or "given"."""

    arm: str
    setting: Setting
    source: str
    validation_accuracy: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "rate": self.setting.rate, "clip": self.setting.clip,
                "effective": self.setting.effective, "source": self.source,
                "validation_accuracy": self.validation_accuracy}


def tuned_arms(config: ExperimentConfig) -> list[Arm]:
    """The arms that choose a rate (no --rate for them), each once: the control tunes as `none`."""
    return list(dict.fromkeys(reference_arm(arm) for arm in config.arms() if config.explicit_rate(arm) is None))


def tuning_jobs(config: ExperimentConfig) -> list[Job]:
    """One job per arm that tunes and grid point (rate x clip), on the tuning seed's split."""
    return [
        Job(arm, config.tuning_seed, Setting(rate, clip, effective=True), tuning=True)
        for arm in tuned_arms(config)
        for rate in config.rate_grid(arm.mechanism)
        for clip in config.clips(arm.mechanism)
    ]


def choose(config: ExperimentConfig, models: dict[str, TrainedModel]) -> dict[str, Choice]:
    """Every arm's setting: the given rate (clip --max-grad-norm or DEFAULT_MAX_GRAD_NORM), else the most
    accurate grid point of its tuning models."""
    choices = {}
    for arm in config.arms():
        given = config.explicit_rate(arm)
        if given is not None:
            clip = config.max_grad_norm if config.max_grad_norm is not None else DEFAULT_MAX_GRAD_NORM
            choices[arm.name] = Choice(arm.name, Setting(given, clip, effective=False), "given")
            continue
        tried = [models[job.key] for job in tuning_jobs(config) if job.arm == reference_arm(arm)]
        best = max(tried, key=lambda model: float(model.validation_accuracy or 0.0))
        choices[arm.name] = Choice(arm.name, best.job.setting, f"tuned on seed {config.tuning_seed}",
                                   best.validation_accuracy)
    return choices


def tuning_rows(config: ExperimentConfig, models: dict[str, TrainedModel], choices: dict[str, Choice]) -> list[dict]:
    """Every grid point tried: arm (as tuned), effective rate, the optimizer's rate, clip, validation accuracy,
    and which arms chose it."""
    rows = []
    for job in tuning_jobs(config):
        model = models[job.key]
        chosen = [name for name, choice in choices.items()
                  if choice.source != "given" and reference_arm_name(config, name) == job.arm.name
                  and choice.setting == job.setting]
        rows.append({"arm": job.arm.name, "rate": job.setting.rate, "learning_rate": model.learning_rate,
                     "clip": reported_clip(job.arm, job.setting.clip),
                     "validation_accuracy": model.validation_accuracy, "chosen_by": chosen})
    return rows


def reference_arm_name(config: ExperimentConfig, name: str) -> str:
    """The name of the arm that `name` tunes as."""
    return next(reference_arm(arm).name for arm in config.arms() if arm.name == name)


def choose_settings(
    config: ExperimentConfig, log: Callable[[str], None] = print
) -> tuple[dict[str, Choice], list[dict], dict[str, TrainedModel]]:
    """Train the tuning models and choose: (choices per arm, the tuning rows, the tuning models)."""
    planned = tuning_jobs(config)
    if planned:
        log(f"choosing rates: {len(planned)} tuning models on seed {config.tuning_seed}'s non-candidates")
    models = run_jobs(config, planned, log)
    choices = choose(config, models)
    return choices, tuning_rows(config, models, choices), models
