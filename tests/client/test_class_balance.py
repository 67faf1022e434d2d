"""class-weighting (client/class_balance.py): the balanced weights, capped and of mean 1 over a client's examples;
the weighted loss of every mechanism; no change to any ledger; the key's errors; the study's flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from client.class_balance import balanced_class_weights, class_weights
from client.training import PoissonBatches, private_trainer
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import LocalTrainingConfig
from privacy.dpsgd import DPSGDMechanism
from privacy.mechanisms import DirichletMechanism, LossWeighting, Mechanism, NoPrivacy


def test_balanced_weights_are_n_over_k_n_k_and_weigh_the_examples_one_on_average() -> None:
    labels = torch.tensor([0] * 6 + [1] * 3 + [3])  # class 2 absent, class 4 absent
    weights = balanced_class_weights(labels, 5, cap=10.0)
    assert torch.allclose(weights, torch.tensor([10 / 18, 10 / 9, 0.0, 10 / 3, 0.0]))
    assert torch.isclose(weights[labels].mean(), torch.tensor(1.0))


def test_a_capped_weight_is_cut_then_every_weight_rescaled_to_mean_one() -> None:
    labels = torch.tensor([0] * 6 + [1] * 3 + [2])
    weights = balanced_class_weights(labels, 3, cap=2.0)
    uncapped = torch.tensor([10 / 18, 10 / 9, 2.0])
    assert torch.allclose(weights, uncapped * 10 / float((uncapped * torch.tensor([6.0, 3.0, 1.0])).sum()))
    assert torch.isclose(weights[labels].mean(), torch.tensor(1.0))
    assert weights[2] / weights[0] == pytest.approx(2.0 / (10 / 18))  # the cap bounds the ratio


def test_one_class_and_no_example_weigh_one() -> None:
    assert torch.equal(balanced_class_weights(torch.tensor([2, 2, 2]), 3, cap=10.0), torch.tensor([0.0, 0.0, 1.0]))
    assert torch.equal(balanced_class_weights(torch.tensor([], dtype=torch.long), 3, cap=10.0), torch.ones(3))


def test_none_gives_no_weights_and_balanced_the_balanced_ones() -> None:
    labels = torch.tensor([0, 0, 0, 1])
    assert class_weights(LocalTrainingConfig(), labels, 2) is None
    chosen = class_weights(LocalTrainingConfig(class_weighting="balanced", class_weight_cap=3.0), labels, 2)
    assert chosen is not None and torch.equal(chosen, balanced_class_weights(labels, 2, 3.0))


MECHANISMS: list[Mechanism] = [
    NoPrivacy(0.5), DirichletMechanism(0.5, 3.0, 0.5, 1e-5, LossWeighting(0.9, 20.0)),
    DirichletMechanism(0.5, 3.0, 0.5, 1e-5), DPSGDMechanism(noise_multiplier=1.0, max_grad_norm=1.0, sample_rate=0.5,
                                                            expected_batch_size=8, delta=1e-5),
]


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_every_loss_is_the_mean_of_the_weighted_example_losses(mechanism: Mechanism) -> None:
    torch.manual_seed(0)
    logits, labels = torch.randn(6, 3), torch.tensor([0, 1, 2, 0, 1, 1])
    weights = torch.tensor([0.5, 2.0, 1.0, 0.0, 3.0, 1.5])

    def loss(w: torch.Tensor | None, rows: slice = slice(None)) -> torch.Tensor:
        return mechanism.loss(logits[rows], labels[rows], torch.Generator().manual_seed(3),
                              None if w is None else w[rows])

    assert torch.allclose(loss(torch.ones(6)), loss(None))
    if isinstance(mechanism, DirichletMechanism):  # one draw per row: the rows' own losses come from the same draws
        from privacy.dirichlet import ConfidenceNormalization, dirichlet_nll_loss

        weighting = mechanism.loss_weighting
        normalization = None if weighting is None else ConfidenceNormalization(weighting.reference_confidence,
                                                                               weighting.cap)
        rows = dirichlet_nll_loss(logits, labels, 0.5, 3.0, torch.Generator().manual_seed(3), reduction="none",
                                  normalization=normalization)
    else:
        rows = nn.functional.cross_entropy(logits, labels, reduction="none")
    assert torch.allclose(loss(weights), (rows * weights).mean())


def trained(mechanism: Mechanism, per_class: torch.Tensor | None) -> tuple[nn.Module, Mechanism]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    inputs, labels = torch.randn(40, 4), torch.tensor([0] * 30 + [1] * 8 + [2] * 2)
    trainer = private_trainer(mechanism, model, "sgd", 0.1)
    trainer.train(PoissonBatches(inputs, labels, torch.Generator().manual_seed(5), class_weights=per_class), 12)
    return model, mechanism


@pytest.mark.parametrize("name", ["dirichlet", "dpsgd"])
def test_the_weights_change_the_model_and_no_ledger(name: str) -> None:
    def fresh() -> Mechanism:
        if name == "dirichlet":
            return DirichletMechanism(0.5, 3.0, 0.2, 1e-5, LossWeighting(0.9, 20.0))
        return DPSGDMechanism(noise_multiplier=1.0, max_grad_norm=1.0, sample_rate=0.2, expected_batch_size=8,
                              delta=1e-5)

    labels = torch.tensor([0] * 30 + [1] * 8 + [2] * 2)
    plain_model, plain = trained(fresh(), None)
    weighted_model, weighted = trained(fresh(), balanced_class_weights(labels, 3, 10.0))
    assert json.dumps(weighted.state_dict(), sort_keys=True) == json.dumps(plain.state_dict(), sort_keys=True)
    assert weighted.epsilon(1e-5) == plain.epsilon(1e-5) and weighted.steps == 12
    assert not all(torch.equal(a, b) for a, b in zip(plain_model.parameters(), weighted_model.parameters()))


@pytest.mark.parametrize(("run_config", "words"), [
    ({"class-weighting": "inverse"}, "class-weighting='inverse' is invalid: choose one of none, balanced"),
    ({"class-weight-cap": 0.5}, "class-weight-cap=0.5 is out of range: it must lie in [1, 1e+06]"),
])
def test_a_bad_key_is_one_line_naming_it(run_config: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError) as raised:
        RunConfig.from_run_config(run_config)
    assert words in str(raised.value)


def test_the_study_flag_reaches_every_run_and_study_json(tmp_path: Path) -> None:
    from cli.main import build_parser
    from cli.study import apply_preset
    from sims.study.options import study_of
    from sims.study.plan import cells, run_config
    from sims.study.runner import STUDY_FILE, describe, resumable

    args = build_parser().parse_args(["study", "--data-path", "", "--dataset", "dermamnist", "--class-weighting",
                                      "balanced", "--class-weight-cap", "4"])
    apply_preset(args)
    study = study_of(args)
    config = run_config(study, cells(study)[0], 0.05)
    assert (config.local.class_weighting, config.local.class_weight_cap) == ("balanced", 4.0)
    recorded = json.loads(describe(study))
    assert (recorded["class_weighting"], recorded["class_weight_cap"]) == ("balanced", 4.0)
    legacy = {key: value for key, value in recorded.items() if not key.startswith("class_weight")}
    (tmp_path / STUDY_FILE).write_text(json.dumps(legacy))  # a folder from before the flag ran none
    with pytest.raises(ValueError, match="--class-weighting differ"):
        resumable(tmp_path, study)
