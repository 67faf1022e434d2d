"""The run folder: written round by round, consistent after every round."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import OutputConfig
from dirichlet_fl.runs import plots
from dirichlet_fl.runs.reader import load_round_updates, read_rows
from dirichlet_fl.runs.writer import RoundRecord, RunWriter


def trained(partition: int, eps: float, steps: int) -> dict[str, float]:
    return {
        "num-examples": 10 * (partition + 1), "partition-id": partition, "train-loss": 1.0 + partition,
        "epsilon": eps, "target-epsilon": 1.0, "delta": 1e-5, "steps": steps, "sample-rate": 0.1, "r": 0.3,
        "learning-rate": 2.0 + partition,
    }


def weights(value: float) -> ArrayRecord:
    return ArrayRecord({"w": torch.full((2,), value)})


def test_each_round_is_on_disk_before_the_next(tmp_path) -> None:
    config = RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="run"))
    writer = RunWriter.create(config, num_clients=2, covers="the outputs")
    first = RoundRecord(
        1, trained={0: trained(0, 0.5, 10), 1: trained(1, 0.4, 5)}, central={"accuracy": 0.5, "loss": 1.0}
    )
    writer.record_round(first, weights(1.0), {})
    # a crash here leaves round 1 complete
    with open(tmp_path / "run" / "rounds.csv") as handle:
        rounds = list(csv.DictReader(handle))
    assert [row["round"] for row in rounds] == ["1"]
    assert float(rounds[0]["train_loss"]) == pytest.approx((1.0 * 10 + 2.0 * 20) / 30)
    assert float(rounds[0]["max_epsilon"]) == 0.5
    assert torch.equal(torch.load(tmp_path / "run" / "model.pt")["w"], torch.full((2,), 1.0))
    assert json.loads((tmp_path / "run" / "config.json").read_text())["run_config"]["run-name"] == "run"

    second = RoundRecord(2, trained={0: trained(0, 0.9, 20)}, refused={1: "budget spent"}, central={"accuracy": 0.6})
    writer.record_round(second, weights(2.0), {})
    summary = writer.finish({"accuracy": 0.6, "loss": 0.9}, assumptions_hold=True)
    with open(tmp_path / "run" / "ledger.csv") as handle:
        ledger = [(row["round"], row["client"], row["status"], row["epsilon"]) for row in csv.DictReader(handle)]
    assert ledger == [("1", "0", "trained", "0.5"), ("1", "1", "trained", "0.4"),
                      ("2", "0", "trained", "0.9"), ("2", "1", "refused", "0.4")]
    with open(tmp_path / "run" / "ledger.csv") as handle:
        assert [row["learning_rate"] for row in csv.DictReader(handle)] == ["2.0", "3.0", "2.0", "3.0"]
    assert (tmp_path / "run" / "curves.png").stat().st_size > 1000  # drawn when the run finishes
    clients = {client["id"]: client for client in summary["clients"]}
    assert clients[0]["epsilon"] == 0.9 and clients[0]["steps"] == 20
    assert clients[1]["refused_rounds"] == 1 and clients[1]["epsilon"] == 0.4
    assert summary["max_epsilon"] == 0.9 and summary["rounds"] == 2
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary


def test_curves_are_redrawn_once_their_interval_passed_and_always_at_the_end(tmp_path, monkeypatch) -> None:
    """Fast rounds are not each drawn (a drawing costs as much as a small round); a run that never finishes still
    gets its picture once the interval passed; the finished run's picture shows every round."""
    drawn: list[int] = []
    monkeypatch.setattr(plots, "plot_runs",
                        lambda dirs, path: drawn.append(len(read_rows(dirs[0] / "rounds.csv"))))
    now = [0.0]
    monkeypatch.setattr(plots.time, "monotonic", lambda: now[0])
    config = RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="run"))
    writer = RunWriter.create(config, num_clients=1, covers="the outputs")  # at 0 s

    def round_at(seconds: float, server_round: int) -> None:
        now[0] = seconds
        writer.record_round(RoundRecord(server_round, trained={0: trained(0, 0.1 * server_round, 1)}), weights(1.0), {})

    round_at(1.0, 1)
    round_at(9.9, 2)
    assert drawn == []
    round_at(10.0, 3)
    assert drawn == [3]  # 10 s after the start: rounds 1 to 3
    round_at(12.0, 4)
    assert drawn == [3]
    now[0] = 13.0
    writer.finish({"accuracy": 0.5}, assumptions_hold=True)
    assert drawn == [3, 4]  # the end: every round
    writer.finish({"accuracy": 0.5}, assumptions_hold=True)
    assert drawn == [3, 4]  # nothing new: not drawn again
    assert plots.CURVES_EVERY_S == 10.0  # README.md and docs/run-folder.md say 10 s


def test_a_second_run_with_the_same_name_gets_its_own_folder(tmp_path) -> None:
    config = RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="same"))
    first = RunWriter.create(config, 1, "x").directory
    second = RunWriter.create(config, 1, "x").directory
    assert first != second and first.is_dir() and second.is_dir()


def test_clients_that_never_trained_report_zero_and_no_rate(tmp_path) -> None:
    writer = RunWriter.create(RunConfig(output=OutputConfig(results_dir=str(tmp_path))), 1, "x")
    summary = writer.finish({"accuracy": 0.1, "loss": 2.3}, assumptions_hold=False)
    assert summary["clients"][0]["epsilon"] == 0.0 and summary["clients"][0]["sample_rate"] is None
    assert summary["accountant_assumptions_hold"] is False


def test_resume_cuts_rows_past_the_checkpoint_and_restores_every_ledger(tmp_path) -> None:
    config = RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="run"))
    writer = RunWriter.create(config, num_clients=2, covers="x")
    writer.record_round(RoundRecord(1, trained={0: trained(0, 0.5, 10)}), weights(1.0), {"exhausted": [1]})
    with open(tmp_path / "run" / "rounds.csv", "a") as handle:  # a kill after round 2's rows, before its checkpoint
        handle.write("2,0.5,1.0,,,1.0,1,0,0,0.6,3.0\n")
    resumed = RunConfig(device="cpu", output=OutputConfig(results_dir=str(tmp_path), resume_from=str(tmp_path / "run")))
    again, checkpoint = RunWriter.resume(resumed, 2, "x")
    assert checkpoint["round"] == 1 and checkpoint["strategy"] == {"exhausted": [1]}
    assert torch.equal(checkpoint["weights"]["w"], torch.full((2,), 1.0))
    assert [row["round"] for row in again.rounds] == ["1"]
    with open(tmp_path / "run" / "rounds.csv") as handle:
        assert [row["round"] for row in csv.DictReader(handle)] == ["1"]
    assert again.clients[0].epsilon == 0.5 and again.clients[0].steps == 10


@pytest.mark.parametrize(("key", "value"), [("batch-size", 16), ("mechanism", "dpsgd"), ("partitioner", "iid"),
                                            ("seed", 1), ("dataset", "mnist"), ("num-server-rounds", 20)])
def test_resume_refuses_a_config_that_changes_the_accounting(tmp_path, key: str, value) -> None:
    writer = RunWriter.create(RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="run")), 1, "x")
    writer.record_round(RoundRecord(1), weights(1.0), {})
    changed = RunConfig.from_run_config({key: value, "resume-from": str(tmp_path / "run")})
    with pytest.raises(ValueError, match=f"^{key}="):
        RunWriter.resume(changed, 1, "x")


def test_resume_without_a_checkpoint_or_with_a_corrupt_config_names_the_file(tmp_path) -> None:
    RunWriter.create(RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="run")), 1, "x")
    with pytest.raises(ValueError, match="checkpoint.pt"):
        RunWriter.resume(RunConfig(output=OutputConfig(resume_from=str(tmp_path / "run"))), 1, "x")
    writer = RunWriter.create(RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="two")), 1, "x")
    writer.record_round(RoundRecord(1), weights(1.0), {})
    (tmp_path / "two" / "config.json").write_text("{\n")
    with pytest.raises(ValueError, match="config.json is corrupt"):
        RunWriter.resume(RunConfig(output=OutputConfig(resume_from=str(tmp_path / "two"))), 1, "x")


def test_a_failed_append_leaves_no_partial_row(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = RunWriter.create(RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="run")), 1, "x")
    before = (tmp_path / "run" / "rounds.csv").read_text()
    import dirichlet_fl.files

    fsync, calls = dirichlet_fl.files.os.fsync, []

    def full_disk_after_the_weights(descriptor: int) -> None:
        calls.append(descriptor)
        if len(calls) == 3:  # model.pt and its folder are synced; the append of the round's row fails
            raise OSError(28, "No space left on device")
        fsync(descriptor)

    monkeypatch.setattr(dirichlet_fl.files.os, "fsync", full_disk_after_the_weights)
    with pytest.raises(OSError, match="No space"):
        writer.record_round(RoundRecord(1), weights(1.0), {})
    assert (tmp_path / "run" / "rounds.csv").read_text() == before
    expected = ["config.json", "ledger.csv", "model.pt", "rounds.csv"]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == expected


def test_the_ledger_holds_events_only_and_the_summary_every_client(tmp_path) -> None:
    """A client that was not sampled writes no row (10,000 clients sampled 10 at a time write 10 rows a
    round); a skipped client one row at round 0; summary.json still lists every client."""
    config = RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="run"))
    writer = RunWriter.create(config, num_clients=4, covers="x")
    writer.record_skipped({3: "too few examples"})
    writer.record_round(RoundRecord(1, trained={1: trained(1, 0.2, 4)}, failed={2: "boom"}), weights(1.0), {})
    writer.record_round(RoundRecord(2, trained={0: trained(0, 0.3, 4)}), weights(2.0), {})
    summary = writer.finish({"accuracy": 0.5, "loss": 1.0}, assumptions_hold=True)
    with open(tmp_path / "run" / "ledger.csv") as handle:
        ledger = [(row["round"], row["client"], row["status"], row["reason"][:16]) for row in csv.DictReader(handle)]
    assert ledger == [("0", "3", "skipped", "too few examples"), ("1", "1", "trained", ""),
                      ("1", "2", "failed", "boom (the client"), ("2", "0", "trained", "")]
    assert [client["id"] for client in summary["clients"]] == [0, 1, 2, 3]
    assert summary["clients"][2]["failed_rounds"] == 1 and summary["clients"][3]["steps"] == 0


def test_kept_updates_hold_the_sent_weights_and_each_trainers_difference(tmp_path) -> None:
    config = RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="run", keep_updates=True))
    writer = RunWriter.create(config, num_clients=2, covers="the outputs")
    for server_round in (1, 2):
        record = RoundRecord(server_round, trained={0: trained(0, 0.5, 10)}, sent=weights(1.0),
                             returned={0: weights(1.5), 1: weights(0.25 * server_round)})
        writer.record_round(record, weights(2.0), {})
    rounds = load_round_updates(tmp_path / "run")
    assert [kept.server_round for kept in rounds] == [1, 2]
    assert np.array_equal(rounds[0].global_weights, [1.0, 1.0])
    assert np.allclose(rounds[1].updates[0], [0.5, 0.5]) and np.allclose(rounds[1].updates[1], [-0.5, -0.5])
    assert sorted(p.name for p in (tmp_path / "run" / "updates").iterdir()) == ["round-0001.npz", "round-0002.npz"]


def test_updates_are_not_kept_unless_asked(tmp_path) -> None:
    config = RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="run"))
    writer = RunWriter.create(config, num_clients=1, covers="x")
    writer.record_round(RoundRecord(1, trained={0: trained(0, 0.5, 10)}, sent=weights(1.0), returned={0: weights(2.0)}),
                        weights(2.0), {})
    assert not (tmp_path / "run" / "updates").exists()
    with pytest.raises(FileNotFoundError, match="keep-updates=true"):
        load_round_updates(tmp_path / "run")


def test_a_hundred_thousand_clients_keep_ledgers_for_the_sampled_only_and_list_them_in_clients_csv(tmp_path) -> None:
    from dirichlet_fl.runs.reader import read_summary
    from dirichlet_fl.runs.writer import CLIENTS_FILE, CLIENTS_IN_SUMMARY

    config = RunConfig(output=OutputConfig(results_dir=str(tmp_path), run_name="big"))
    writer = RunWriter.create(config, num_clients=100_000, covers="x")
    record = RoundRecord(1, trained={99_999: trained(99_999, 0.5, 4), 7: trained(7, 0.25, 4)},
                         refused={3: "budget spent"}, spent={3})
    writer.record_round(record, weights(1.0), {})
    assert sorted(writer.clients) == [3, 7, 99_999]  # ledgers of the clients heard of, not of the population
    checkpoint = torch.load(writer.directory / "checkpoint.pt", weights_only=False)
    assert sorted(checkpoint["clients"]) == ["3", "7", "99999"]
    summary = writer.finish({"accuracy": 0.5, "loss": 1.0}, assumptions_hold=True)
    stored = json.loads((writer.directory / "summary.json").read_text())
    assert 100_000 > CLIENTS_IN_SUMMARY and "clients" not in stored and stored["clients_file"] == CLIENTS_FILE
    assert stored["num_clients"] == 100_000 and stored["clients_listed"] == 3 and stored["max_epsilon"] == 0.5
    with open(writer.directory / CLIENTS_FILE) as handle:
        rows = list(csv.DictReader(handle))
    assert [row["id"] for row in rows] == ["3", "7", "99999"] and rows[2]["epsilon"] == "0.5"
    assert read_summary(writer.directory)["clients"] == summary["clients"]
    assert [client["steps"] for client in summary["clients"]] == [0, 4, 4]
