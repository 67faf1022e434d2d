"""SecAgg+ end to end on Flower's simulation engine (Ray): the same run, with and without it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from dirichlet_fl.simulation import simulate


def test_secaggplus_run_matches_the_plain_run_with_identical_eps(tmp_path: Path) -> None:
    """A small version of the default job (non-IID digits), on Flower's simulation engine, with and without
    SecAgg+: the same accuracy within 1 point and the same per-client eps, round by round."""
    small = {"num-server-rounds": 2, "local-steps": 10, "learning-rate": 0.5, "fraction-evaluate": 0.0,
             "results-dir": str(tmp_path)}
    for name, mode in (("plain", "none"), ("secure", "secaggplus")):
        simulate(small | {"run-name": name, "secure-aggregation": mode}, num_supernodes=3, ray_num_cpus=1)
    plain, secure = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("plain", "secure"))
    assert (plain["secure_aggregation"], secure["secure_aggregation"]) == ("none", "secaggplus")
    assert abs(plain["final_accuracy"] - secure["final_accuracy"]) <= 0.01
    assert [c["epsilon"] for c in plain["clients"]] == [c["epsilon"] for c in secure["clients"]]
    ledgers = [(tmp_path / name / "ledger.csv").read_text() for name in ("plain", "secure")]
    assert ledgers[0] == ledgers[1]
    rounds = (tmp_path / "secure" / "rounds.csv").read_text().splitlines()
    assert ("client_level_epsilon,client_level_delta,client_level_sample_rate,client_level_rounds,"
            "client_level_clipping_norm,client_level_unclipped_fraction,") in rounds[0]
    assert ",nan," in rounds[1]  # train_loss: the clients withheld it


def test_adaptive_client_dp_under_secaggplus_on_the_simulation_engine(tmp_path: Path) -> None:
    """client-dp = "adaptive" with SecAgg+: C starts at client-clipping-norm, every update is clipped to it
    (norms far above 1e-3), so the noised unclipped fraction is near 0 and C grows for round 2; the
    client-level eps is finite and labelled, per round, in rounds.csv and summary.json."""
    config = {"num-server-rounds": 2, "local-steps": 5, "fraction-evaluate": 0.0, "results-dir": str(tmp_path),
              "run-name": "adaptive", "secure-aggregation": "secaggplus", "client-dp": "adaptive",
              "client-clipping-norm": 1e-3, "client-noise-multiplier": 0.2}
    simulate(config, num_supernodes=3, ray_num_cpus=1)
    summary = json.loads((tmp_path / "adaptive" / "summary.json").read_text())
    level = summary["client_level"]
    assert level["clipping"] == "adaptive" and level["initial_clipping_norm"] == 1e-3 and level["rounds"] == 2
    assert 0 < level["epsilon"] < float("inf") and "whole client" in level["covers"]
    with open(tmp_path / "adaptive" / "rounds.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    norms = [float(row["client_level_clipping_norm"]) for row in rows]
    fractions = [float(row["client_level_unclipped_fraction"]) for row in rows]
    assert norms[0] == 1e-3 and norms[1] > norms[0]
    assert all(abs(f) < 0.5 for f in fractions)  # 0 unclipped, plus count noise of std (3 / 20) / 3 on the mean
