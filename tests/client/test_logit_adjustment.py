"""logit-adjustment (client/logit_adjustment.py): the offsets are tau times the log of a client's add-one-smoothed
class frequencies; every mechanism's step takes its loss on the shifted logits; predictions and ledgers do not
change; the key's errors; the study's flag."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from client.logit_adjustment import adjusted_logit_offsets, logit_offsets
from client.training import PoissonBatches, private_trainer
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import LocalTrainingConfig
from privacy.dpsgd import DPSGDMechanism
from privacy.mechanisms import DirichletMechanism, LossWeighting, Mechanism, NoPrivacy

LABELS = torch.tensor([0] * 30 + [1] * 8 + [2] * 2)


def test_the_offsets_are_tau_log_of_the_smoothed_frequencies() -> None:
    labels = torch.tensor([0] * 6 + [1] * 3 + [3])  # classes 2 and 4 absent: a small, finite prior
    offsets = adjusted_logit_offsets(labels, 5, tau=1.5)
    expected = [1.5 * math.log((n + 1) / (10 + 5)) for n in (6, 3, 0, 1, 0)]
    assert offsets.tolist() == pytest.approx(expected, rel=1e-6)
    assert torch.isfinite(offsets).all() and offsets.dtype == torch.float32
    assert offsets[0] > offsets[1] > offsets[3] > offsets[2] == offsets[4]  # common classes get the largest offset


def test_tau_zero_gives_no_offsets_and_a_positive_tau_the_adjusted_ones() -> None:
    assert logit_offsets(LocalTrainingConfig(), LABELS, 3) is None
    chosen = logit_offsets(LocalTrainingConfig(logit_adjustment=0.5), LABELS, 3)
    assert chosen is not None and torch.equal(chosen, adjusted_logit_offsets(LABELS, 3, 0.5))


MECHANISMS: dict[str, Callable[[], Mechanism]] = {
    "none": lambda: NoPrivacy(0.5),
    "dirichlet": lambda: DirichletMechanism(0.5, 3.0, 0.5, 1e-5, LossWeighting(0.9, 20.0)),
    "dpsgd": lambda: DPSGDMechanism(noise_multiplier=1.0, max_grad_norm=1.0, sample_rate=0.5, expected_batch_size=8,
                                    delta=1e-5),
}


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_a_step_takes_its_loss_on_the_shifted_logits(name: str) -> None:
    """A network whose last layer's bias already holds the offsets, stepped without them, takes exactly the step
    of the bare network stepped with them: the offsets enter the loss and nothing else."""
    offsets = adjusted_logit_offsets(LABELS, 3, 1.0)
    inputs, labels = torch.randn(6, 4, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 0, 1, 1])

    def stepped(in_the_bias: bool, given: torch.Tensor | None) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        shift = offsets if in_the_bias else torch.zeros(3)
        with torch.no_grad():
            model[2].bias += shift
        mechanism = MECHANISMS[name]()
        trainer = private_trainer(mechanism, model, "sgd", 0.1)
        mechanism.train_step(trainer.model, trainer.optimizer, inputs, labels, torch.Generator().manual_seed(3),
                             None, given)
        with torch.no_grad():
            model[2].bias -= shift
        return [p.detach().clone() for p in model.parameters()]

    with_offsets, in_the_bias, without = stepped(False, offsets), stepped(True, None), stepped(False, None)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(with_offsets, in_the_bias))
    assert not all(torch.allclose(a, b) for a, b in zip(with_offsets, without))


def trained(mechanism: Mechanism, offsets: torch.Tensor | None) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    inputs = torch.randn(40, 4, generator=torch.Generator().manual_seed(2))
    trainer = private_trainer(mechanism, model, "sgd", 0.1)
    trainer.train(PoissonBatches(inputs, LABELS, torch.Generator().manual_seed(5), logit_offsets=offsets), 12)
    return model


@pytest.mark.parametrize("name", ["dirichlet", "dpsgd"])
def test_the_offsets_change_the_model_and_no_ledger(name: str) -> None:
    plain, adjusted = MECHANISMS[name](), MECHANISMS[name]()
    plain_model, adjusted_model = trained(plain, None), trained(adjusted, adjusted_logit_offsets(LABELS, 3, 1.0))
    assert json.dumps(adjusted.state_dict(), sort_keys=True) == json.dumps(plain.state_dict(), sort_keys=True)
    assert adjusted.epsilon(1e-5) == plain.epsilon(1e-5) and adjusted.steps == 12
    assert not all(torch.equal(a, b) for a, b in zip(plain_model.parameters(), adjusted_model.parameters()))


@pytest.mark.parametrize("value", [-0.5, 10.5, float("nan")])
def test_a_bad_tau_is_one_line_naming_it(value: float) -> None:
    with pytest.raises(ValueError) as raised:
        RunConfig.from_run_config({"logit-adjustment": value})
    assert f"logit-adjustment={value!r} is out of range: it must lie in [0, 10]" in str(raised.value)


def test_the_study_flag_reaches_every_run_and_study_json(tmp_path: Path) -> None:
    from cli.main import build_parser
    from cli.study import apply_preset
    from sims.study.options import study_of
    from sims.study.plan import cells, run_config
    from sims.study.runner import STUDY_FILE, describe, resumable

    args = build_parser().parse_args(["study", "--data-path", "", "--dataset", "dermamnist", "--logit-adjustment",
                                      "1"])
    apply_preset(args)
    study = study_of(args)
    assert run_config(study, cells(study)[0], 0.05).local.logit_adjustment == 1.0
    recorded = json.loads(describe(study))
    assert recorded["logit_adjustment"] == 1.0
    legacy = {key: value for key, value in recorded.items() if key != "logit_adjustment"}
    (tmp_path / STUDY_FILE).write_text(json.dumps(legacy))  # a folder from before the flag ran none
    with pytest.raises(ValueError, match="--logit-adjustment differ"):
        resumable(tmp_path, study)
