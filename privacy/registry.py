"""Every privacy mechanism by name: the one table that config validation, clients, reports and
benchmarks read (as Opacus's accountants/registry.py does for accountants).

Each class carries its `name`, what its eps `covers` and what it `does_not_cover`, and answers what
the rest of the code would otherwise learn by comparing names (`private`, `has_epsilon_floor`,
`per_example_gradients`, `validates_model`, `reports_training_loss`, `loss_weightings`, `step_rate`:
privacy/mechanisms.py); building, restoring and describing a mechanism all go through here, so a new
mechanism is one class and one line in MECHANISMS. Importing this module imports no torch and no Opacus
(the classes import them where they train), so config validation and the command line stay cheap.
"""

from __future__ import annotations

from typing import Any

from privacy.checks import check_choice
from privacy.dpsgd import DPSGDMechanism
from privacy.mechanisms import DirichletMechanism, Mechanism, MechanismSpec, NoPrivacy

MECHANISMS: dict[str, type[Mechanism]] = {
    cls.name: cls for cls in (DirichletMechanism, DPSGDMechanism, NoPrivacy)
}
BASELINE_FIRST = tuple(sorted(MECHANISMS, key=lambda name: MECHANISMS[name].private))
"""The names with the non-private baseline first, then the private ones in MECHANISMS' order (the study's
axis and tables)."""
PRIVATE_MECHANISMS = tuple(name for name, cls in MECHANISMS.items() if cls.private)


def mechanism_class(name: str) -> type[Mechanism]:
    """The class registered as `name`; a ValueError naming the valid names otherwise."""
    return MECHANISMS[check_choice("mechanism", name, MECHANISMS)]


def covers(name: str) -> str:
    """What the eps of mechanism `name` bounds, in the words every report uses."""
    return mechanism_class(name).covers


def does_not_cover(name: str) -> str | None:
    """What a run of mechanism `name` releases that its eps does not bound; None when it bounds it all."""
    return mechanism_class(name).does_not_cover


def build_mechanism(spec: MechanismSpec) -> Mechanism:
    """Calibrate the named mechanism for one client (raises ValueError for an impossible budget)."""
    return mechanism_class(spec.name).calibrated(spec)


def restore_mechanism(state: dict[str, Any]) -> Mechanism:
    """Rebuild a mechanism, calibration and ledger included, from Mechanism.state_dict()."""
    name = state.get("mechanism")
    if name not in MECHANISMS:
        raise ValueError(f"saved mechanism state names {name!r}; known mechanisms: {', '.join(MECHANISMS)}")
    return MECHANISMS[str(name)].from_state_dict(state)
