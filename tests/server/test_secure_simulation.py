"""SecAgg+ end to end on Flower's simulation engine (Ray): the same run, with and without it."""

from __future__ import annotations

import json
from pathlib import Path

from dirichlet_fl.simulation import simulate


def test_secaggplus_run_matches_the_plain_run_with_identical_eps(tmp_path: Path) -> None:
    """A small version of the default job (non-IID digits), on Flower's simulation engine, with and without
    SecAgg+: the same accuracy within 1 point and the same per-client eps, round by round."""
    small = {"num-server-rounds": 2, "local-steps": 10, "learning-rate": 0.5, "fraction-evaluate": 0.0,
             "results-dir": str(tmp_path)}
    for name, mode in (("plain", "none"), ("secure", "secaggplus")):
        simulate(small | {"run-name": name, "secure-aggregation": mode}, num_supernodes=3)
    plain, secure = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("plain", "secure"))
    assert (plain["secure_aggregation"], secure["secure_aggregation"]) == ("none", "secaggplus")
    assert abs(plain["final_accuracy"] - secure["final_accuracy"]) <= 0.01
    assert [c["epsilon"] for c in plain["clients"]] == [c["epsilon"] for c in secure["clients"]]
    ledgers = [(tmp_path / name / "ledger.csv").read_text() for name in ("plain", "secure")]
    assert ledgers[0] == ledgers[1]
    rounds = (tmp_path / "secure" / "rounds.csv").read_text().splitlines()
    assert rounds[0].endswith("client_level_epsilon,client_level_delta,client_level_sample_rate,client_level_rounds")
    assert ",nan," in rounds[1]  # train_loss: the clients withheld it
