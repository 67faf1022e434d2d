"""Every `dirichlet-fl bench` benchmark end to end at a tiny size: it runs, writes its folder and prints the
documented JSON keys. No timing is asserted (the machine's load decides those); relations that hold
whatever the load (ratios of the reported medians, r* equal to the reference's, the loop reproducing
Flower's accuracy) are."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
from flwr.app import ArrayRecord, ConfigRecord

from cli import bench
from cli.main import OneLineErrorParser
from dirichlet_fl.client_plan import too_small_to_train
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import DataConfig, LocalTrainingConfig
from dirichlet_fl.data.split import federated_split
from sims.fedavg_loop import FedAvgLoop
from strategies.private import PrivateStrategy
from strategies.sampling import seeded_sample
from tests.helpers import set_task_identity


def run_bench(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    """Run `dirichlet-fl bench ...` through a parser built as the CLI builds it; return its --json output."""
    parser = OneLineErrorParser(prog="dirichlet-fl")
    bench.add_parser(parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser))
    args = parser.parse_args(["bench", *argv, "--json"])
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


def test_steps_reports_medians_ratios_and_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["steps", "--repeats", "3", "--warmup", "1", "--batch-size", "4", "--image-size", "8", "--profile",
            "--out", str(tmp_path)]
    report = run_bench(argv, capsys)

    medians = report["median_seconds"]
    samples = report["step_seconds"]  # the raw timings: the medians and ratios are recomputed from them here
    assert {name: len(values) for name, values in samples.items()} == {
        "plain": 3, "dirichlet": 3, "dirichlet-csprng": 3, "normalized": 3, "opacus": 3}
    csprng = statistics.median(samples["dirichlet-csprng"]) / statistics.median(samples["dirichlet"])
    assert report["csprng_over_dirichlet"] == pytest.approx(csprng)
    assert medians == {name: statistics.median(values) for name, values in samples.items()}
    ratio = statistics.median(samples["dirichlet"]) / statistics.median(samples["plain"])
    assert report["dirichlet_over_plain"] == pytest.approx(ratio)
    assert report["targets"]["dirichlet_over_plain"]["met"] == (ratio <= 1.10)
    normalized = statistics.median(samples["normalized"]) / statistics.median(samples["plain"])
    assert report["normalized_over_plain"] == pytest.approx(normalized)
    assert report["config"]["batch_size"] == 4 and report["config"]["input"] == [1, 8, 8]
    assert set(report["profile_median_seconds"]["opacus"]) == {"forward", "loss", "backward", "optimizer_step"}
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["options"]["repeats"] == 3 and config["machine"]["cores"] >= 1
    assert json.loads((tmp_path / "results.json").read_text())["median_seconds"] == medians


def test_accountant_matches_the_reference_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["accountant", "--groups", "paper,issue-33", "--repeats", "1", "--reference-configs", "1",
            "--out", str(tmp_path)]
    report = run_bench(argv, capsys)

    assert report["configurations"] == report["solves"] + report["unreachable"] == 36
    assert set(report["groups"]) == {"paper", "issue-33"} and report["groups"]["issue-33"]["solves"] == 4
    solved = [row for row in report["grid"] if not row["unreachable"]]
    assert report["max_warm_seconds"] == max(row["warm_seconds"] for row in solved)
    assert report["median_cold_cpu_seconds"] == statistics.median(row["cold_cpu_seconds"] for row in solved)
    assert report["targets"]["median_warm_seconds"]["met"] == (report["median_warm_seconds"] <= 0.005)
    assert report["over_target"] == 0 and all(row["epsilon_at_r_star"] <= row["epsilon"] for row in solved)
    assert len(report["reference"]) == 1
    assert report["reference_max_abs_r_difference"] < 1e-9
    assert report["speedup_over_reference"] > 0
    assert all(0 < row["r_star"] < row["alpha"] for row in solved)
    issue = [row for row in solved if row["group"] == "issue-33"]
    assert [row["order"] for row in issue] == [3327, 3310, 1110, 10]  # issue 33's "order used" column


def test_simulation_loop_reproduces_flower(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two clients: FedAvg's sum does not depend on reply order, so both kinds must agree exactly."""
    argv = ["simulation", "--runs", "1", "--clients", "2", "--run-config",
            "num-server-rounds=2 local-steps=2 partitioner='iid'", "--out", str(tmp_path)]
    report = run_bench(argv, capsys)

    for kind in ("flower", "loop"):
        summary = report[kind]
        assert summary["steady_seconds_per_round"] > 0 and summary["wall_seconds"] > summary["fixed_seconds"]
        assert summary["peak_rss_bytes"] > 0 and summary["peak_pss_bytes"] > 0
        assert len(report["runs"][kind][0]["round_seconds"]) == 2
    assert report["flower"]["final_accuracy"] == report["loop"]["final_accuracy"]
    assert report["overhead_seconds_per_round"] == pytest.approx(
        report["flower"]["steady_seconds_per_round"] - report["loop"]["steady_seconds_per_round"])
    assert any(p["name"] == "raylet" for p in report["runs"]["flower"][0]["processes_at_peak"])
    assert set(report["targets"]) == {"overhead_seconds_per_round", "flower_peak_rss_bytes"}


ACCURACY = ["accuracy", "--dataset", "digits", "--data-root", "", "--num-clients", "2", "--seeds", "1", "--rounds", "1",
            "--local-epochs", "0.5", "--workers", "1"]
"""A tiny `bench accuracy` on digits (its preset's data set, MNIST t10k, is not in the tests)."""


def test_accuracy_is_a_study_preset_writing_the_studys_outputs(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*ACCURACY, "--epsilons", "4", "--splits", "iid,noniid,central", "--mechanisms", "none,dirichlet",
            "--learning-rate", "0.05", "--rate-grid", "dirichlet=0.05/0.1", "--rate-extension-steps", "0",
            "--out", str(tmp_path)]
    report = run_bench(argv, capsys)

    assert (report["cells"], report["rows"], report["tuning_runs"]) == (6, 6, 6)  # 3 splits x (none, eps 4)
    for name in ("table.csv", "table.md", "tuning.csv", "study.json", "accuracy_vs_epsilon.png", "client_spread.png",
                 "partition-iid.png", "partition-0.3.png", "partition-central.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    with open(tmp_path / "table.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {(r["beta"], r["mechanism"]) for r in rows} == {(p, m) for p in ("iid", "0.3", "central")
                                                           for m in ("none", "dirichlet")}
    for row in rows:
        assert 0 <= float(row["balanced_accuracy"]) <= 1 and 0 <= float(row["macro_auc"]) <= 1
        assert 0 <= float(row["min_class_recall"]) <= float(row["balanced_accuracy"]) + 1e-9
        source = "flag" if row["mechanism"] == "none" else "validation"
        assert row["rate_source"] == source and float(row["learning_rate"]) in (0.05, 0.1)
    assert all(0 < float(r["max_client_epsilon"]) <= 4.0 for r in rows if r["mechanism"] == "dirichlet")
    study = json.loads((tmp_path / "study.json").read_text())
    assert (study["dirichlet_weighting"], study["dirichlet_weight_cap"], study["rate_grid"]) == (
        "normalized", 20.0, "dirichlet=0.05/0.1")
    assert report["config"]["partitions"] == ["iid", "0.3", "central"] and len(report["rates"]) == 3


def test_accuracy_refuses_an_eps_below_the_floor_before_any_run(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    parser = OneLineErrorParser(prog="dirichlet-fl")
    bench.add_parser(parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser))
    args = parser.parse_args(["bench", *ACCURACY, "--epsilon", "0.001,4", "--splits", "central", "--mechanisms",
                              "dirichlet", "--out", str(tmp_path)])
    assert args.func(args) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--epsilons: eps=0.001 is at or below the Theorem 10 floor" in error
    assert not (tmp_path / "table.csv").exists() and not (tmp_path / "tuning.csv").exists()


def test_accuracy_resumes_without_rerunning_finished_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    argv = [*ACCURACY, "--seeds", "2", "--local-epochs", "0.25", "--splits", "iid", "--mechanisms", "none",
            "--learning-rate", "0.05", "--out", str(tmp_path)]
    first = run_bench(argv, capsys)
    table = (tmp_path / "table.csv").read_text()

    from sims.study import cell as study_cell

    with monkeypatch.context() as patch:
        patch.setattr(study_cell, "run_fedavg", lambda *_: (_ for _ in ()).throw(AssertionError("reran")))
        again = run_bench([*argv, "--resume"], capsys)
    assert first["resumed"] == 0 and again["resumed"] == again["rows"] == 2
    assert (tmp_path / "table.csv").read_text() == table and again["table"] == first["table"]
    (tmp_path / "table.csv").write_text("".join(table.splitlines(keepends=True)[:-1]))  # as if stopped after 1 cell
    partial = run_bench([*argv, "--table-only"], capsys)
    assert partial["rows"] == 1 and "| iid | none | sgd | inf | 1 |" in (tmp_path / "table.md").read_text()

    parser = OneLineErrorParser(prog="dirichlet-fl")
    bench.add_parser(parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser))
    args = parser.parse_args(["bench", *argv[:-2], "--rounds", "2", "--out", str(tmp_path), "--resume"])
    assert args.func(args) == 2
    assert "other settings (--rounds differ)" in capsys.readouterr().err


def test_accuracy_presets_map_onto_the_study() -> None:
    """The bench's defaults (MNIST t10k, batch 32, every split at eps 0.5-8, rates tuned) and --quick (the
    app's digits job and rates, one seed, eps 1 and 4), each overridden by a flag given beside it."""
    from sims.study.bench_preset import study_args
    from sims.study.plan import cells
    from sims.study.tuning import parse_rate_grid, tuning_runs

    parser = bench.benchmark_parser("accuracy", OneLineErrorParser)
    full = study_args(parser.parse_args([]))
    assert (full.dataset, full.data_root, full.batch_size, full.rounds, full.seeds) == (
        "mnist-idx", "data/mnist-t10k", 32, 20, 3)
    assert full.betas == "iid,0.3,central" and full.epsilons == "0.5,1,2,4,8"
    assert full.learning_rate is full.dirichlet_learning_rate is full.dpsgd_learning_rate is None
    assert (full.dirichlet_weighting, full.dirichlet_weight_cap) == ("normalized", 20.0)
    quick = study_args(parser.parse_args(["--quick", "--seeds", "2"]))
    app = RunConfig()
    assert (quick.dataset, quick.model, quick.rounds, quick.batch_size) == (
        app.data.dataset, app.network.name, app.num_server_rounds, app.local.batch_size)
    assert (quick.seeds, quick.epsilons, quick.learning_rate, quick.dirichlet_weighting) == (
        2, "1,4", app.training.rate, app.privacy.dirichlet_weighting)

    from sims.study.plan import Study

    study = Study(partitions=("iid", "0.3", "central"), epsilons=(0.5, 1.0, 2.0, 4.0, 8.0), seeds=(0,),
                  rate_grid="none=0.05,dirichlet=0.05/0.1,dpsgd=0.1")
    order = [cell.epsilon for cell in cells(study)]
    first_wave = 3 * (1 + 2 * 2)  # none, and Dirichlet and DP-SGD at eps 1 and 4, per split
    assert set(order[:first_wave]) == {math.inf, 1.0, 4.0} and set(order[first_wave:]) == {0.5, 2.0, 8.0}
    assert len(tuning_runs(study)) == 3 * (1 + 5 * 2 + 5)  # len(grid) runs per cell of seed 0
    assert parse_rate_grid("")["dpsgd"] == (0.05, 0.1, 0.2)


def test_gpu_benchmark_smoke_runs_on_cpu_with_synthetic_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["gpu", "--synthetic", "--short", "--model", "cnn", "--synthetic-size", "64", "--steps-per-epoch", "2",
            "--warmup-steps", "1", "--sample-rate", "0.1", "--device", "cpu", "--federation-clients", "0",
            "--out", str(tmp_path)]
    report = run_bench(argv, capsys)

    raw = {name: statistics.median(result["epoch_seconds"]) for name, result in report["mechanisms"].items()}
    assert report["seconds_per_epoch"] == raw and set(raw) == {"dirichlet", "dpsgd"}
    assert report["dpsgd_over_dirichlet"] == pytest.approx(raw["dpsgd"] / raw["dirichlet"])
    for result in report["mechanisms"].values():
        assert len(result["epoch_seconds"]) == 1 and result["steps_per_epoch"] == 2
        assert 0 < result["epsilon"] <= 4.0


def test_invalid_options_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = OneLineErrorParser(prog="dirichlet-fl")
    bench.add_parser(parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser))
    args = parser.parse_args(["bench", "accuracy", "--splits", "iid,bogus", "--out", str(tmp_path)])
    assert args.func(args) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--splits='iid,bogus' is invalid" in error


@pytest.mark.parametrize("fraction", [0.3, 0.5, 1.0])
def test_loop_samples_the_clients_the_strategy_samples(fraction: float) -> None:
    strategy = PrivateStrategy(RunConfig(seed=7, fraction_train=fraction, fraction_evaluate=1.0))
    strategy.partition_of = {1000 - p: p for p in range(10)}  # node ids in the reverse order of partitions
    strategy.num_partitions = 10
    strategy.skip({4})
    set_task_identity()  # Flower's messages need a run
    eligible = [p for p in range(10) if p != 4]
    for server_round in (1, 2, 5):
        messages = strategy.configure_train(server_round, ArrayRecord(), ConfigRecord(),
                                            grid=None)  # type: ignore[arg-type]
        assert seeded_sample((7, "train", server_round), eligible, 10, fraction) == [
            strategy.partition_of[m.metadata.dst_node_id] for m in messages]


def test_loop_leaves_out_clients_too_small_to_train_as_the_server_does() -> None:
    """A label-skewed split with a client holding <= batch-size examples: the app's server never samples
    it (too_small_to_train); the loop must not either, rather than count it as a failed client."""
    config = RunConfig(data=DataConfig(partitioner="dirichlet", beta=0.05), num_server_rounds=1, fraction_evaluate=0.0,
                       seed=3, local=LocalTrainingConfig(batch_size=60, steps=1))
    small = set(too_small_to_train(config, federated_split(config.split_spec(10))))
    assert small and len(small) < 10  # the split has both kinds
    loop = FedAvgLoop(config, 10)
    record = loop.run_round(1)
    assert record is not None and record.failed == 0 and record.trained == 10 - len(small)
    assert loop.skipped == small and not loop.failures and not small & set(loop.epsilons)


def test_finite_makes_strict_json() -> None:
    payload = bench.finite({"a": math.inf, "b": [1.0, -math.inf, math.nan], "c": {"d": 2}})
    assert json.loads(json.dumps(payload, allow_nan=False)) == {"a": "inf", "b": [1.0, "-inf", "nan"], "c": {"d": 2}}


def test_scale_refuses_a_population_below_the_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = OneLineErrorParser(prog="dirichlet-fl")
    bench.add_parser(parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser))
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"")
    args = parser.parse_args(["bench", "scale", "--populations", "5,100", "--data-root", str(tmp_path),
                              "--out", str(tmp_path / "out")])
    assert args.func(args) == 2
    assert "--populations='5,100': every population must be >= --sampled=10" in capsys.readouterr().err


def test_gpu_federation_needs_a_gpu_for_a_gpu_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = OneLineErrorParser(prog="dirichlet-fl")
    bench.add_parser(parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser))
    args = parser.parse_args(["bench", "gpu", "--synthetic", "--device", "cpu", "--gpus-per-client", "0.25",
                              "--out", str(tmp_path)])
    assert args.func(args) == 2
    assert "--gpus-per-client=0.25 needs a CUDA device" in capsys.readouterr().err


def test_linkstate_sweep_is_timed_on_flowers_own_state() -> None:
    from sims.bench.scale import sweep_seconds

    assert sweep_seconds(50, 5, repeats=1) > 0.0


def test_scale_with_virtual_clients_asks_for_the_population_on_a_few_supernodes() -> None:
    import argparse

    from sims.bench.scale import population_overrides

    args = argparse.Namespace(dataset="synthetic", data_root="unused", rounds=3, local_steps=20, batch_size=8,
                              sampled=10, num_supernodes=4, run_config="")
    overrides = population_overrides(args, 100_000)
    assert overrides["num-clients"] == 100_000 and overrides["fraction-train"] == 1e-4
    assert (overrides["dataset"], overrides["model"]) == ("synthetic", "logreg") and "data-root" not in overrides
    assert population_overrides(argparse.Namespace(**{**vars(args), "num_supernodes": 0}), 100)["num-clients"] == 0


def test_scale_checks_budgets_and_that_the_ledger_files_are_the_trained_clients(tmp_path: Path) -> None:
    from sims.bench.scale import ledger_check

    (tmp_path / "ledgers").mkdir()
    for client in (4, 9):
        (tmp_path / "ledgers" / f"partition-{client}.json").write_text("{}")
    clients = [{"id": 4, "epsilon": 0.5, "target_epsilon": 1.0}, {"id": 9, "epsilon": 1.5, "target_epsilon": 1.0}]
    (tmp_path / "summary.json").write_text(json.dumps({"clients": clients, "max_epsilon": 1.5}))
    (tmp_path / "ledger.csv").write_text("round,client,status\n1,4,trained\n1,9,trained\n2,9,spent\n")
    check = ledger_check(tmp_path)
    assert check["clients_over_budget"] == [9] and check["ledgers_match_trained"] and check["trained_clients"] == 2
    (tmp_path / "ledgers" / "partition-5.json").write_text("{}")
    assert not ledger_check(tmp_path)["ledgers_match_trained"]
