"""`dirichlet-fl audit` on a run folder written here (digits, untrained model), and its report lines."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from cli.audit import add_parser
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import DataConfig, LocalTrainingConfig, OutputConfig, PrivacyConfig
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.metrics import evaluate
from dirichlet_fl.models.run_model import build_run_model
from dirichlet_fl.runs.audit import audit_run, matched_candidates, pooled_candidates
from dirichlet_fl.runs.reader import CHECKPOINT, load_run
from dirichlet_fl.runs.writer import ClientStanding, save_round_updates
from privacy.audit.verdict import VERDICTS
from privacy.registry import covers
from sims.audit.reference_runs import reference_coins, reference_parts

IID_DIGITS = DataConfig(dataset="digits", partitioner="iid")


def run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dirichlet-fl")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["audit", *argv])
    return args.func(args)


def write_run(
    folder: Path,
    mechanism: str,
    epsilons: list[float | None],
    *,
    state: dict[str, torch.Tensor] | None = None,
    final_accuracy: float = 0.1,
    keep_updates: bool = False,
    rounds: int = 5,
    local_steps: int = 0,
) -> Path:
    """A finished-run folder as the server writes it; an untrained model (it never saw any example)
    unless `state` plants other weights. `local_steps` (0: the job's epochs) is what reference runs train."""
    config = RunConfig(data=IID_DIGITS, num_server_rounds=rounds, privacy=PrivacyConfig(mechanism=mechanism),
                       output=OutputConfig(keep_updates=keep_updates), local=LocalTrainingConfig(steps=local_steps))
    folder.mkdir()
    saved = {"run_config": config.to_run_config(), "num_clients": len(epsilons)}
    (folder / "config.json").write_text(json.dumps(saved))
    torch.manual_seed(0)
    model = build_run_model(config, federated_split(config.split_spec(len(epsilons))).data)
    torch.save(state if state is not None else model.state_dict(), folder / "model.pt")
    clients = [
        {"id": i, "target_epsilon": 1.0, "epsilon": eps, "delta": config.privacy.delta, "steps": 10}
        for i, eps in enumerate(epsilons)
    ]
    summary = {"clients": clients, "accountant_assumptions_hold": True, "final_accuracy": final_accuracy}
    (folder / "summary.json").write_text(json.dumps(summary))
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
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("final-model")] == [
        f"final-model / {name} / {scope}" for scope in ("pooled", "client 0", "client 1")
        for name in ("loss", "one-run loss")
    ]
    assert "claimed eps 0.95 " in out and "claimed eps 0.8 " in out
    assert "VIOLATION" not in out  # the model never saw the members
    assert "no control run given" in out and out.splitlines()[-2].startswith("verdict: inconclusive")
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
    assert report["verdict"] == "no violation"  # no claim to violate; a none run is its own control
    names = {(a["name"], a["view"]) for a in report["attacks"]}
    assert names == {("loss", "final-model"), ("one-run loss", "final-model")}
    assert all({"eps_lower_bound", "auc", "verdict", "tpr_at_fpr_01pct"} <= set(a) for a in report["attacks"])


def test_audit_run_returns_every_attack_and_is_seeded(tmp_path):
    run_dir = write_run(tmp_path / "run", "dpsgd", [2.0, 3.0])
    first = audit_run(run_dir, max_candidates=300, seed=1)
    again = audit_run(run_dir, max_candidates=300, seed=1)
    assert first.pooled.claimed_eps == 3.0 and first.pooled.covers == covers("dpsgd")
    assert [(a.name, a.view, a.scope) for a in first.attacks] == [
        (name, "final-model", scope) for scope in ("pooled", "client 0", "client 1")
        for name in ("loss", "one-run loss")
    ]
    assert [a.eps_lower_bound for a in first.attacks] == [a.eps_lower_bound for a in again.attacks]
    # no control run: a clean audit cannot be called "no violation"
    assert first.verdict().label == "inconclusive" and "no control run" in first.verdict().reason


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


# ---------------------------------------------------------------------------------------------
# Planted cases through the real run-audit path: memorising -> violation, a fitted model at matched
# utility -> no violation, an underfit model -> inconclusive; the update view per client.
# ---------------------------------------------------------------------------------------------

def run_split(num_clients: int):
    return federated_split(RunConfig(data=IID_DIGITS).split_spec(num_clients))


@pytest.fixture(scope="module")
def memorised() -> tuple[dict[str, torch.Tensor], float]:
    """The run's model trained by Adam, full batch, to near-zero loss on client 0's ~144 examples only (10
    clients): it memorises client 0's members, and never sees clients 1-9's, whose audit is a control."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    split = run_split(10)
    torch.manual_seed(0)
    model = build_run_model(RunConfig(data=IID_DIGITS), split.data)
    part = torch.as_tensor(split.train_parts[0])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for _ in range(150):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(split.data.train_x[part]), split.data.train_y[part]).backward()
        optimizer.step()
    _, accuracy = evaluate(model, split.data.test_x, split.data.test_y)
    torch.set_num_threads(threads)
    return model.state_dict(), accuracy


@pytest.mark.usefixtures("single_torch_thread")
def test_memorised_members_violate_a_small_claim_and_unseen_ones_do_not(tmp_path, memorised, capsys):
    state, accuracy = memorised
    control = write_run(tmp_path / "control", "none", [None] * 10, state=state, final_accuracy=accuracy)
    run_dir = write_run(tmp_path / "run", "dirichlet", [0.5] * 10, state=state, final_accuracy=accuracy)
    assert run_command([str(run_dir), "--json", "--control", str(control)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "violation" and report["violation"] is True
    assert report["utility"]["matched"] is True and report["utility"]["control_accuracy"] == accuracy
    by_scope = {(a["scope"], a["name"]): a for a in report["attacks"]}
    for name in ("loss", "one-run loss"):  # client 0 was memorised: every attack convicts it
        assert by_scope["client 0", name]["verdict"] == "violation"
        assert by_scope["client 0", name]["eps_lower_bound"] > 0.5
        # client 1 never trained: the model is its control, at matched utility
        assert by_scope["client 1", name]["verdict"] == "no violation"
        assert by_scope["client 1", name]["eps_lower_bound"] <= 0.5
    assert report["eps_lower_bound"] == max(a["eps_lower_bound"] for a in report["attacks"] if a["scope"] == "pooled")


def test_an_underfit_model_is_inconclusive_whatever_its_bound(tmp_path, memorised, capsys):
    _, accuracy = memorised
    control = write_run(tmp_path / "control", "none", [None] * 2, final_accuracy=accuracy)
    underfit = write_run(tmp_path / "underfit", "dirichlet", [4.0, 4.0], final_accuracy=0.1)  # untrained weights
    assert run_command([str(underfit), "--control", str(control), "--max-candidates", "400"]) == 0
    out = capsys.readouterr().out
    assert f"inconclusive: the model underfits (acc 0.100 vs control {accuracy:.3f})" in out
    assert "NOT matched" in out and out.splitlines()[-2].startswith("verdict: inconclusive")


def test_a_control_that_is_not_the_same_job_without_privacy_is_refused(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", "dirichlet", [1.0, 1.0])
    other = write_run(tmp_path / "other", "dpsgd", [1.0, 1.0])
    assert run_command([str(run_dir), "--control", str(other)]) == 2
    assert "mechanism none" in capsys.readouterr().err


@pytest.mark.usefixtures("single_torch_thread")
def test_the_update_view_convicts_the_client_whose_updates_carry_its_examples_gradients(tmp_path, capsys):
    """20 clients. Client 0 sends, round after round, one SGD step on two of its examples (the coordinator
    sees every member's gradient in some round); client 1 sends noise once. The coordinator's view must
    convict client 0 of a small claim and not client 1."""
    run_dir = write_run(tmp_path / "run", "dirichlet", [0.3] * 20, final_accuracy=0.1, keep_updates=True)
    split = run_split(20)
    torch.manual_seed(0)
    model = build_run_model(RunConfig(data=IID_DIGITS), split.data)
    sent = {key: value.clone() for key, value in model.state_dict().items()}
    part = torch.as_tensor(split.train_parts[0])
    noise = torch.Generator().manual_seed(1)
    for server_round, start in enumerate(range(0, len(part), 2), start=1):
        model.zero_grad()
        batch = part[start : start + 2]
        logits = model(split.data.train_x[batch])
        torch.nn.functional.cross_entropy(logits, split.data.train_y[batch], reduction="sum").backward()
        stepped = {name: sent[name] - 0.01 * parameter.grad for name, parameter in model.named_parameters()}
        returned = {0: ArrayRecord(stepped)}
        if server_round == 1:
            returned[1] = ArrayRecord({name: value + 0.01 * torch.randn(value.shape, generator=noise)
                                       for name, value in sent.items()})
        save_round_updates(run_dir, server_round, ArrayRecord(sent), returned)
    assert run_command([str(run_dir), "--json", "--view", "updates"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {a["view"] for a in report["attacks"]} == {"updates"} and len(report["attacks"]) == 20
    views = {a["scope"]: a for a in report["attacks"]}
    assert views["client 0"]["name"] == "canary-gradient" and views["client 0"]["verdict"] == "violation"
    assert views["client 0"]["eps_lower_bound"] > 0.3 >= views["client 1"]["eps_lower_bound"]
    assert views["client 1"]["verdict"] == "inconclusive"  # no leak shown, and no control to match utility
    assert report["verdict"] == "violation"


def test_the_update_view_of_a_run_without_kept_updates_names_the_fix(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", "dirichlet", [1.0])
    assert run_command([str(run_dir), "--view", "updates"]) == 2
    assert "keep-updates=true" in capsys.readouterr().err


def test_a_killed_run_is_audited_from_its_last_checkpoint(tmp_path, capsys):
    """No summary.json (the server was killed): the checkpoint's ledgers give the claimed eps."""
    run_dir = write_run(tmp_path / "run", "dirichlet", [1.0, 2.0])
    (run_dir / "summary.json").unlink()
    ledgers = {str(c): asdict(ClientStanding(target_epsilon=4.0, epsilon=eps, steps=7, sample_rate=0.1))
               for c, eps in enumerate([0.5, 0.75])}
    torch.save({"round": 2, "clients": ledgers}, run_dir / CHECKPOINT)
    (run_dir / "rounds.csv").write_text("round,central_accuracy\n1,0.25\n2,0.5\n")
    run = load_run(run_dir)
    assert run.summary["status"] == "interrupted" and run.summary["rounds"] == 2
    assert run.summary["final_accuracy"] == 0.5
    assert [c["epsilon"] for c in run.summary["clients"]] == [0.5, 0.75]
    assert run_command([str(run_dir), "--json", "--max-candidates", "200"]) == 0
    assert json.loads(capsys.readouterr().out)["claimed_eps"] == 0.75


# ---------------------------------------------------------------------------------------------
# Reference runs (--references K): LiRA and RMIA on a federated run's final model.
# ---------------------------------------------------------------------------------------------

def test_a_reference_run_keeps_its_half_of_the_candidates_and_every_other_example(tmp_path):
    run = load_run(write_run(tmp_path / "run", "dirichlet", [1.0] * 4))
    candidates = pooled_candidates(run, 200, seed=0)
    coins = reference_coins(candidates, 0, 1)
    assert 0.3 < coins.mean() < 0.7 and not np.array_equal(coins, reference_coins(candidates, 0, 2))
    train, test = reference_parts(run, candidates, coins, np.random.default_rng(0))
    members = len(candidates.members)
    kept = set(np.concatenate(train).tolist())
    assert kept == set(np.concatenate(run.train_parts).tolist()) - set(candidates.members[~coins[:members]].tolist())
    assert sorted(np.concatenate(test).tolist()) == sorted(candidates.nonmembers[coins[members:]].tolist())
    labels, test_labels = run.data.train_y.numpy(), run.data.test_y.numpy()
    for client, part in enumerate(test):  # a test candidate joins a client that holds its class
        assert set(test_labels[part]) <= set(labels[run.train_parts[client]])
    assert not np.intersect1d(candidates.population, candidates.nonmembers).size


@pytest.mark.usefixtures("single_torch_thread")
def test_references_add_lira_and_rmia_with_finite_bounds_and_verdicts(tmp_path, capsys):
    """The digits job's 10 clients, cut to 2 rounds of 6 steps; two reference runs in the plain loop (seconds)."""
    run_dir = write_run(tmp_path / "run", "dirichlet", [1.0] * 10, rounds=2, local_steps=6)
    assert run_command([str(run_dir), "--json", "--references", "2", "--max-candidates", "400"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    found = {a["name"]: a for a in report["attacks"] if a["scope"] == "pooled"}
    for name in ("lira", "rmia"):
        attack = found[name]
        assert attack["view"] == "final-model" and attack["references"] == 2
        assert math.isfinite(attack["eps_lower_bound"]) and attack["verdict"] in VERDICTS
        assert attack["num_members"] == found["loss"]["num_members"]  # the loss attack's candidates
    assert captured.err.count("reference run") == 2
    assert run_command([str(run_dir), "--references", "1"]) == 2
    assert "--references=1 is out of range" in capsys.readouterr().err
