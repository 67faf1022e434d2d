"""Every privacy mechanism by name: the one table that config validation, clients, reports and
benchmarks read (as Opacus's accountants/registry.py does for accountants).

Each class carries its `name`, what its eps `covers` and what it `does_not_cover`; building,
restoring and describing a mechanism all go through here, so a new mechanism is one class and one
line in MECHANISMS.
"""

from __future__ import annotations

from typing import Any

from privacy.checks import check_choice
from privacy.dpsgd import DPSGDMechanism
from privacy.mechanisms import DirichletMechanism, Mechanism, MechanismSpec, NoPrivacy

MECHANISMS: dict[str, type[Mechanism]] = {
    cls.name: cls for cls in (DirichletMechanism, DPSGDMechanism, NoPrivacy)
}


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
