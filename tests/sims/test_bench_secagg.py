"""`bench secagg` and `bench client-dp` end to end at a tiny size: documented keys and relations that hold
whatever the load; no timing is asserted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.sims.test_benchmarks import run_bench


def test_secagg_protocol_reports_both_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_bench(["secagg", "--runs", "2", "--clients", "3", "--out", str(tmp_path)], capsys)
    assert len(report["protocol_runs"]) == 2 and report["config"]["clients"] == 3
    assert report["protocol"]["parameters"] == report["protocol_runs"][0]["parameters"] > 1000
    assert report["protocol"]["secaggplus_seconds"] > 0 and report["protocol"]["plain_seconds"] > 0
    assert "flower" not in report


def test_client_dp_sweep_reports_the_client_level_eps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["client-dp", "--dataset", "digits", "--clients", "3", "--rounds", "1", "--noise-multipliers", "0,50",
            "--local-steps", "2",
            "--out", str(tmp_path)]
    off, noised = run_bench(argv, capsys)["cells"]
    assert "client_level_epsilon" not in off and off["rounds"] == noised["rounds"] == 1
    assert 0 < noised["client_level_epsilon"] < 1 and noised["client_level_sample_rate"] == 1.0
    assert noised["median_update_norm"] > 0 and not math.isnan(noised["final_accuracy"])
    assert off["max_example_epsilon"] == noised["max_example_epsilon"]  # same per-example ledgers


def test_client_dp_sweep_with_adaptive_clipping_moves_c_towards_the_norms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """C starts 1000x above every update norm: the clients' bits say 'unclipped', and each of the 3 rounds
    shrinks C by about exp(-0.2 * 0.5) (count noise sigma_b = 20 / 20 = 1 on the count of 20)."""
    argv = ["client-dp", "--dataset", "digits", "--clients", "20", "--rounds", "3", "--noise-multipliers", "1",
            "--clipping", "adaptive", "--clipping-norm", "1000", "--local-steps", "1", "--out", str(tmp_path)]
    (cell,) = run_bench(argv, capsys)["cells"]
    assert cell["median_update_norm"] < 10
    assert 1000 * math.exp(-0.1 * 2) * 0.8 < cell["last_clipping_norm"] < 1000 * math.exp(-0.1 * 2) * 1.2
    assert 0 < cell["client_level_epsilon"] < math.inf


def test_client_dp_sweep_aggregates_with_the_runs_strategy() -> None:
    """The sweep wraps the run's own Flower strategy, as the app does: under fedadam its server optimizer
    takes the noised mean as its pseudo-gradient (its first moment is set after a round)."""
    from flwr.serverapp.strategy import FedAdam

    from dirichlet_fl.config import RunConfig
    from sims.client_dp_sweep import ClientDPLoop

    config = RunConfig.from_run_config({"dataset": "digits", "strategy": "fedadam", "client-dp": "central",
                                        "client-noise-multiplier": 1.0, "local-steps": 2, "fraction-evaluate": 0.0})
    loop = ClientDPLoop(config, 3)
    assert isinstance(loop.client_dp.strategy, FedAdam) and loop.client_dp.strategy.m_t is None
    assert loop.run_round(1) is not None
    assert loop.client_dp.strategy.m_t is not None and len(loop.client_dp.client_level.rounds) == 1
    assert len(loop.update_norms) == 3 and loop.clipping_norms == [config.client_level.clipping_norm]
