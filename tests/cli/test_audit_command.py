"""`dirichlet-fl audit` on a run folder written here (digits, untrained model), and its report lines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cli.audit import add_parser, human_report
from dirichlet_fl.config import RunConfig
from dirichlet_fl.run_audit import RunAudit, audit_run, matched_candidates
from dirichlet_fl.task import build_run_model, federated_split
from privacy.audit import audit
from privacy.registry import covers


def run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dirichlet-fl")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["audit", *argv])
    return args.func(args)


def write_run(folder: Path, mechanism: str, epsilons: list[float | None]) -> Path:
    """A finished-run folder as the server writes it, with an untrained model (it never saw any example)."""
    config = RunConfig(dataset="digits", partitioner="iid", mechanism=mechanism)
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"run_config": config.to_run_config(), "num_clients": len(epsilons)}))
    torch.manual_seed(0)
    model = build_run_model(config, federated_split(config.split_spec(len(epsilons))).data)
    torch.save(model.state_dict(), folder / "model.pt")
    clients = [
        {"id": i, "target_epsilon": 1.0, "epsilon": eps, "delta": config.delta, "steps": 10}
        for i, eps in enumerate(epsilons)
    ]
    (folder / "summary.json").write_text(json.dumps({"clients": clients, "accountant_assumptions_hold": True}))
    return folder


def test_matched_candidates_balance_every_class_under_the_cap():
    rng = np.random.default_rng(0)
    members, nonmembers = rng.integers(0, 3, 500), rng.integers(0, 3, 90)
    chosen_members, chosen_nonmembers = matched_candidates(members, nonmembers, 60, rng)
    assert len(chosen_members) == len(chosen_nonmembers) <= 30
    assert len(np.unique(chosen_members)) == len(chosen_members)
    for c in range(3):
        assert (members[chosen_members] == c).sum() == (nonmembers[chosen_nonmembers] == c).sum()
    uncapped, _ = matched_candidates(members, nonmembers, 10_000, rng)
    assert len(uncapped) == sum(min((members == c).sum(), (nonmembers == c).sum()) for c in range(3))


def test_report_names_delta_and_coverage_and_writes_its_files(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", "dirichlet", [0.8, 0.95])
    assert run_command([str(run_dir), "--max-candidates", "400"]) == 0
    out = capsys.readouterr().out
    assert "delta=1e-05" in out and covers("dirichlet") in out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith(("pooled", "client"))] == [
        "pooled", "client 0", "client 1"
    ]
    assert "claimed eps 0.95 " in out and "claimed eps 0.8 " in out
    assert "VIOLATION" not in out  # the model never saw the members
    saved = json.loads((run_dir / "audit.json").read_text())
    assert saved["claimed_eps"] == 0.95 and saved["num_members"] == saved["num_nonmembers"] <= 200
    assert [client["claimed_eps"] for client in saved["clients"]] == [0.8, 0.95]
    assert (run_dir / "audit_roc.png").read_bytes()[:4] == b"\x89PNG"


def test_json_is_one_object_and_an_infinite_claim_is_null(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", "none", [None, None])
    assert run_command([str(run_dir), "--json", "--max-candidates", "200", "--seed", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"auc", "eps_lower_bound", "claimed_eps", "violation", "delta", "covers", "clients"} <= set(report)
    assert report["claimed_eps"] is None and report["violation"] is False
    assert report["covers"] == covers("none")
    assert abs(report["auc"] - 0.5) < 0.15


def test_audit_run_returns_the_pooled_report_and_is_seeded(tmp_path):
    run_dir = write_run(tmp_path / "run", "dpsgd", [2.0, 3.0])
    first = audit_run(run_dir, max_candidates=300, seed=1)
    again = audit_run(run_dir, max_candidates=300, seed=1)
    assert first.claimed_eps == 3.0 and first.covers == covers("dpsgd")
    assert (first.auc, first.eps_lower_bound) == (again.auc, again.eps_lower_bound)


def test_human_report_has_one_violation_line_per_violating_audit():
    rng = np.random.default_rng(0)
    leaky = audit(rng.normal(3, 1, 400), rng.normal(0, 1, 400), claimed_eps=1.0, delta=1e-5, covers="the outputs", rng=rng)
    safe = audit(rng.normal(0, 1, 400), rng.normal(0, 1, 400), claimed_eps=1.0, delta=1e-5, covers="the outputs", rng=rng)
    text = human_report(Path("runs/x"), RunAudit(leaky, {0: leaky, 1: safe}, "dirichlet", False))
    violations = [line for line in text.splitlines() if line.startswith("VIOLATION:")]
    assert [line.split(":")[1].strip() for line in violations] == ["pooled", "client 0"]
    assert all("delta=1e-05" in line and "the outputs" in line for line in violations)
    assert "broke the accountant's assumptions" in text


@pytest.mark.parametrize("missing", [None, "model.pt", "summary.json"])
def test_missing_folder_or_file_is_one_line_and_exit_code_two(tmp_path, capsys, missing):
    if missing is None:
        run_dir = tmp_path / "absent"
    else:
        run_dir = write_run(tmp_path / "run", "dirichlet", [1.0])
        (run_dir / missing).unlink()
    assert run_command([str(run_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("dirichlet-fl audit: error:") and (missing or "does not exist") in captured.err
