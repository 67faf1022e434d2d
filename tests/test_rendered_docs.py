"""Numbers in the docs come from committed result files: each rendered block equals a fresh rendering."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from scripts import render_robustness, render_scale, round_breakdown
from scripts.doc_blocks import block, replace_block


def test_benchmarks_robustness_table_is_the_committed_sweeps() -> None:
    assert block(render_robustness.DOCUMENT, render_robustness.BLOCK) == render_robustness.rendered()


def test_benchmarks_virtual_clients_table_is_the_committed_bench_scale_result() -> None:
    assert block(render_scale.DOCUMENT, render_scale.BLOCK) == render_scale.rendered()


def test_a_block_is_replaced_in_place_and_a_missing_one_is_named(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- t:begin -->\nold\n<!-- t:end -->\noutro\n")
    replace_block(page, "t", "| new |\n")
    assert page.read_text() == "intro\n<!-- t:begin -->\n| new |\n<!-- t:end -->\noutro\n"
    assert block(page, "t") == "| new |\n"
    with pytest.raises(ValueError, match="other:begin"):
        block(page, "other")


def test_consortium_round_breakdown_is_the_committed_measurement() -> None:
    for document in round_breakdown.DOCUMENTS:
        assert block(document, round_breakdown.BLOCK) == round_breakdown.rendered(), document


def test_the_robustness_renderer_also_reads_a_study_folder_beside_the_bench_folders(tmp_path: Path) -> None:
    import shutil

    from sims.study.cell import COLUMNS
    from sims.study.plan import Study
    from sims.study.runner import csv_text, describe

    shutil.copytree(render_robustness.FOLDERS / "test-b32-defaults", tmp_path / "test-b32-defaults")
    study = tmp_path / "z-study"
    study.mkdir()
    (study / "study.json").write_text(describe(Study(dataset="npz", data_path="/x/digits.npz", batch_size=32,
                                                     partitions=("central", "iid"))))
    row = {"epsilon": "1.0", "mechanism": "dirichlet", "status": "ok", "min_class_recall": "0.5", "accuracy": "0.9"}
    rows = [{**row, "beta": "central", "seed": 0, "balanced_accuracy": "0.8", "dead_classes": 0,
             "learning_rate": 0.05, "rate_source": "validation"},
            {**row, "beta": "central", "seed": 1, "balanced_accuracy": "0.6", "dead_classes": 2,
             "learning_rate": 0.05, "rate_source": "validation"},
            {**row, "beta": "iid", "seed": 0, "balanced_accuracy": "0.7", "dead_classes": 1, "learning_rate": 0.1,
             "rate_source": "flag"},
            {**row, "beta": "iid", "seed": 1, "balanced_accuracy": "0.1", "dead_classes": 6, "learning_rate": 0.1,
             "rate_source": "flag", "status": "no-rounds"}]
    (study / "table.csv").write_text(csv_text(rows, COLUMNS))

    lines = render_robustness.rendered(tmp_path).splitlines()
    committed = [line for line in render_robustness.rendered().splitlines() if line.startswith("| test-b32-defaults |")]
    assert lines[2:4] == committed  # the bench folder's rows, as committed
    assert lines[4:] == [
        "| z-study (central) | digits.npz | dirichlet | 1.0 | batch 32, normalized, cap 20, effective rate 0.05 "
        "(tuned) | 2 | 70.0 | 60.0 | 50.0 | 2 | 90.0 |",
        "| z-study (iid) | digits.npz | dirichlet | 1.0 | batch 32, normalized, cap 20, effective rate 0.1 | 1 | "
        "70.0 | 70.0 | 50.0 | 1 | 90.0 |"]


def test_benchmarks_robustness_grid_is_the_committed_grid() -> None:
    from scripts import render_grid

    assert block(render_grid.DOCUMENT, render_grid.BLOCK) == render_grid.rendered()
    assert block(render_grid.DOCUMENT, render_grid.VERDICT_BLOCK) == render_grid.rendered_verdict()
    assert block(render_grid.DOCUMENT, render_grid.OPTIMIZERS_BLOCK) == render_grid.rendered_optimizers()


def test_the_grid_measures_each_seeds_gap_to_the_non_private_run_of_the_same_network_and_warmup(
        tmp_path: Path) -> None:
    from scripts import render_grid
    from sims.study.cell import COLUMNS
    from sims.study.plan import Study
    from sims.study.runner import csv_text, describe

    row = {"epsilon": "1.0", "status": "ok", "min_class_recall": "0.5", "accuracy": "0.9", "beta": "0.3",
           "dead_classes": 0, "learning_rate": 0.05, "rate_source": "validation", "cpu_seconds": 900}
    for name, weighting, norm, warmup, rows in (
        ("lenet-none-normalized-w0", "normalized", "none", 0, [
            {**row, "mechanism": "none", "epsilon": "inf", "seed": 0, "balanced_accuracy": "0.90"},
            {**row, "mechanism": "none", "epsilon": "inf", "seed": 1, "balanced_accuracy": "0.80"},
            {**row, "mechanism": "dirichlet", "seed": 0, "balanced_accuracy": "0.88"},
            {**row, "mechanism": "dirichlet", "seed": 1, "balanced_accuracy": "0.75", "dead_classes": 2}]),
        ("lenet-none-normalized-w3", "normalized", "none", 3, [
            {**row, "mechanism": "none", "epsilon": "inf", "seed": 0, "balanced_accuracy": "0.70"},
            {**row, "mechanism": "dirichlet", "seed": 0, "balanced_accuracy": "0.69"},
            {**row, "mechanism": "dirichlet", "seed": 0, "balanced_accuracy": "0.50", "epsilon": "4.0"}]),
        ("lenet-group-paper-w0", "paper", "group", 0, [  # no non-private run of this network: no gap
            {**row, "mechanism": "dirichlet", "seed": 0, "balanced_accuracy": "0.70"}]),
    ):
        folder = tmp_path / name
        folder.mkdir()
        study = Study(dataset="npz", data_path="/x/d.npz", model="lenet", norm=norm, dirichlet_weighting=weighting,
                      warmup_rounds=warmup, rate_extension_steps=0)  # as the grid's folders from before it
        (folder / "study.json").write_text(describe(study))
        (folder / "table.csv").write_text(csv_text(rows, COLUMNS))
    table, cost = render_grid.rendered(tmp_path).split("\n\n")
    assert cost == ("8 runs (cells and tuning runs), 2.0 CPU hours in all; median CPU seconds per run: lenet, norm "
                    "group on d.npz: 900; lenet, norm none on d.npz: 900.\n")
    assert table.splitlines()[2:] == [
        "| d.npz | lenet, norm group | paper | 0 | 0.3 | 1 | 0.05 (tuned) | 1 | 70.0 | 70.0 |  | 50.0 | 0 (0) |",
        "| d.npz | lenet, norm none | cross-entropy | 0 | 0.3 | inf | 0.05 (tuned) | "
        "2 | 85.0 | 80.0 |  | 50.0 | 0 (0) |",
        "| d.npz | lenet, norm none | cross-entropy | 3 | 0.3 | inf | 0.05 (tuned) | "
        "1 | 70.0 | 70.0 |  | 50.0 | 0 (0) |",
        "| d.npz | lenet, norm none | normalized, cap 20 | 0 | 0.3 | 1 | 0.05 (tuned) | 2 | 81.5 | 75.0 | 5.0 | 50.0 "
        "| 2 (1) |",
        "| d.npz | lenet, norm none | normalized, cap 20 | 3 | 0.3 | 1 | 0.05 (tuned) | 1 | 69.0 | 69.0 | 1.0 | 50.0 "
        "| 0 (0) |",
        "| d.npz | lenet, norm none | normalized, cap 20 | 3 | 0.3 | 4 | 0.05 (tuned) | 1 | 50.0 | 50.0 | 20.0 | 50.0 "
        "| 0 (0) |"]
    assert render_grid.rendered_verdict(tmp_path).splitlines()[2:] == [
        "| d.npz | lenet, norm group | paper | 70.0, 0 of 1 | not run |",
        "| d.npz | lenet, norm none | cross-entropy | 80.0, 0 of 2 | 70.0, 0 of 1 |",
        "| d.npz | lenet, norm none | normalized, cap 20 | 75.0, 1 of 2 | 69.0, 0 of 1 |"]


def test_readme_default_job_sentence_is_the_committed_run() -> None:
    from scripts import render_default_job

    assert block(render_default_job.DOCUMENT, render_default_job.BLOCK) == render_default_job.rendered()


def test_benchmarks_acceptance_table_is_the_committed_acceptance_runs() -> None:
    text = render_robustness.rendered_acceptance()
    assert block(render_robustness.DOCUMENT, render_robustness.ACCEPTANCE_BLOCK) == text
    assert "| pass |" in text


def test_the_acceptance_check_fails_a_dead_class_or_a_gap_above_8_points(tmp_path: Path) -> None:
    from sims.study.cell import COLUMNS
    from sims.study.plan import Study
    from sims.study.runner import csv_text, describe

    folder = tmp_path / "accept-defaults-x"
    folder.mkdir()
    (folder / "study.json").write_text(describe(Study(dataset="npz", data_path="d.npz", partitions=("central",))))
    row = {"beta": "central", "epsilon": "1.0", "status": "ok", "accuracy": "0.9", "learning_rate": 0.05}
    rows = [{**row, "mechanism": "none", "seed": s, "balanced_accuracy": "0.90", "min_class_recall": "0.7"}
            for s in (0, 1, 2)]
    rows += [{**row, "mechanism": "dirichlet", "seed": 0, "balanced_accuracy": "0.83", "min_class_recall": "0.5"},
             {**row, "mechanism": "dirichlet", "seed": 1, "balanced_accuracy": "0.81", "min_class_recall": "0.5"},
             {**row, "mechanism": "dirichlet", "seed": 2, "balanced_accuracy": "0.89", "min_class_recall": "0.0"}]
    (folder / "table.csv").write_text(csv_text(rows, COLUMNS))
    table = render_robustness.rendered_acceptance(tmp_path).splitlines()[2:]
    checks = [line.rsplit("|", 2)[1].strip() for line in table]
    assert checks == ["pass", "FAIL", "FAIL"]  # a 7-point gap passes; 9 points, and a dead class, fail


def test_benchmarks_normalised_step_table_is_the_committed_bench_steps_results() -> None:
    from scripts import render_steps

    assert block(render_steps.DOCUMENT, render_steps.BLOCK) == render_steps.rendered()


def test_the_grids_prose_in_benchmarks_holds_on_the_committed_grid() -> None:
    """BENCHMARKS.md 11.2's "What it shows" states facts of the committed grid in words; each is checked here."""
    from scripts import render_grid

    stand_in, default_net, normalized = "dermamnist-shaped-digits.npz", "lenet, norm none", "normalized, cap 20"
    groups = {(s, p, float(e)): (rows, gaps) for s, p, e, rows, gaps in render_grid.grid_rows()}

    def lost(setting: tuple, partition: str, epsilon: float = 1.0) -> set[str]:
        return {r["seed"] for r in groups[(setting, partition, epsilon)][0] if int(r["dead_classes"])}

    for (setting, _, _), (rows, _) in groups.items():  # the paper's loss lost a class on every seed
        if setting[2] == "paper":
            assert all(int(r["dead_classes"]) for r in rows), setting
    cold, warm = (stand_in, default_net, normalized, 0), (stand_in, default_net, normalized, 3)
    for partition in ("iid", "0.3"):  # without a warm-up: collapsed to the majority class on some seed
        assert min(float(r["balanced_accuracy"]) for r in groups[(cold, partition, 1.0)][0]) == pytest.approx(1 / 7)
    assert lost(cold, "central")
    for partition in ("central", "iid"):  # with it: every class on every seed, within 3.1 points
        rows, gaps = groups[(warm, partition, 1.0)]
        assert not lost(warm, partition) and len(rows) == 5 and max(gaps) <= 0.031
    assert len(lost(warm, "0.3")) == 2 and all(lost(warm, "0.3", e) == lost(warm, "0.3") for e in (0.5, 4.0))
    assert not lost((stand_in, default_net, "cross-entropy", 3), "0.3", math.inf)
    low_rates = (stand_in, "lenet, norm group", f"{normalized}, rates 0.005/0.01/0.02", 3)
    assert not lost(low_rates, "central") and max(groups[(low_rates, "central", 1.0)][1]) <= 0.01
    assert not lost((stand_in, "lenet, norm group-8", normalized, 3), "central")
    for loss in (normalized, "paper"):  # resnet9: both losses collapsed where cross-entropy trained
        rows = groups[((stand_in, "resnet9, norm default", loss, 3), "central", 1.0)][0]
        assert [float(r["balanced_accuracy"]) for r in rows] == pytest.approx([1 / 7])
    assert float(groups[((stand_in, "resnet9, norm default", "cross-entropy", 3), "central", math.inf)][0][0]
                 ["balanced_accuracy"]) > 0.9
    assert all(not lost(s, p, e) for s, p, e in groups if s[0] == "mnist-idx")  # MNIST: no seed lost a class


def test_the_optimizer_table_shows_every_seed_with_its_tried_rates_and_gap_to_the_same_optimizer(
        tmp_path: Path) -> None:
    from scripts import render_grid
    from sims.study.cell import COLUMNS
    from sims.study.plan import Study
    from sims.study.runner import csv_text, describe
    from sims.study.tuning import TUNING_COLUMNS

    folder = tmp_path / "lenet-group-sgd-adam"
    folder.mkdir()
    study = Study(dataset="npz", data_path="/x/d.npz", model="lenet", norm="group", optimizers=("sgd", "adam"))
    (folder / "study.json").write_text(describe(study))
    row = {"beta": "central", "status": "ok", "min_class_recall": "0.5", "accuracy": "0.9", "macro_auc": "0.99",
           "dead_classes": 0, "collapsed": 0, "rate_source": "validation"}
    rows = [{**row, "mechanism": "none", "epsilon": "inf", "seed": 0, "optimizer": o, "learning_rate": rate,
             "balanced_accuracy": ba} for o, rate, ba in (("sgd", 0.02, "0.90"), ("adam", 0.001, "0.92"))]
    rows += [{**row, "mechanism": "dirichlet", "epsilon": "1.0", "seed": 0, "optimizer": "sgd", "learning_rate": 0.008,
              "balanced_accuracy": "0.142857", "min_class_recall": "0.0", "dead_classes": 6, "collapsed": 1},
             {**row, "mechanism": "dirichlet", "epsilon": "1.0", "seed": 0, "optimizer": "adam",
              "learning_rate": 0.001, "balanced_accuracy": "0.91"}]
    (folder / "table.csv").write_text(csv_text(rows, COLUMNS))
    tuning = [{"beta": "central", "mechanism": "dirichlet", "epsilon": "1.0", "seed": 0, "status": "ok",
               "optimizer": o, "learning_rate": rate, "balanced_accuracy": "0.5"}
              for o, rate in (("sgd", 0.02), ("sgd", 0.05), ("sgd", 0.008), ("adam", 0.001))]
    (folder / "tuning.csv").write_text(csv_text(tuning, TUNING_COLUMNS))
    assert render_grid.rendered_optimizers(tmp_path).splitlines()[2:] == [
        "| d.npz | lenet, norm group | cross-entropy | adam | central | inf | given | 0.001 | 0 | 92.0 | 99.0 | 50.0 "
        "| 0 | no |  |",
        "| d.npz | lenet, norm group | cross-entropy | sgd | central | inf | given | 0.02 | 0 | 90.0 | 99.0 | 50.0 "
        "| 0 | no |  |",
        "| d.npz | lenet, norm group | normalized, cap 20 | adam | central | 1 | 0.001 | 0.001 | 0 | 91.0 | 99.0 | "
        "50.0 | 0 | no | 1.0 |",
        "| d.npz | lenet, norm group | normalized, cap 20 | sgd | central | 1 | 0.008/0.02/0.05 | 0.008 | 0 | 14.3 "
        "| 99.0 | 0.0 | 6 | yes | 75.7 |"]


def test_the_optimizer_prose_in_benchmarks_holds_on_the_committed_folder() -> None:
    """BENCHMARKS.md 11.4's "What it shows": each number it states, read from the committed folder."""
    import csv

    grid = Path(__file__).resolve().parent.parent / "docs/robustness/grid"
    folder = grid / "stand-in-lenet-group-normalized-w3-sgd-adam"
    with open(folder / "table.csv", newline="") as handle:
        cells = list(csv.DictReader(handle))
    with open(folder / "tuning.csv", newline="") as handle:
        tuning = list(csv.DictReader(handle))

    def of(rows: list[dict[str, str]], mechanism: str, optimizer: str) -> list[dict[str, str]]:
        return [r for r in rows if (r["mechanism"], r["optimizer"]) == (mechanism, optimizer)]

    def gaps(optimizer: str) -> list[float]:
        plain = {r["seed"]: float(r["balanced_accuracy"]) for r in of(cells, "none", optimizer)}
        return [plain[r["seed"]] - float(r["balanced_accuracy"]) for r in of(cells, "dirichlet", optimizer)]

    adam, sgd = of(cells, "dirichlet", "adam"), of(cells, "dirichlet", "sgd")
    assert len(adam) == len(sgd) == 3 and all(r["dead_classes"] == "0" and r["collapsed"] == "0" for r in adam + sgd)
    assert {r["learning_rate"] for r in adam} == {"0.001"}
    assert {r["extension"] for r in of(tuning, "dirichlet", "adam")} == {"0"}  # no extension needed
    assert min(float(r["min_class_recall"]) for r in adam) == pytest.approx(0.767, abs=5e-4)
    assert max(gaps("adam")) == pytest.approx(0.017, abs=5e-4) and min(gaps("adam")) < 0
    by_rate = {float(r["learning_rate"]): r for r in of(tuning, "dirichlet", "sgd")}
    assert int(by_rate[0.02]["dead_classes"]) >= 1
    assert float(by_rate[0.05]["balanced_accuracy"]) == pytest.approx(0.286, abs=5e-4)
    assert by_rate[0.1]["collapsed"] == "1"
    assert (by_rate[0.008]["extension"], by_rate[0.0032]["extension"]) == ("-1", "-2")
    assert {r["learning_rate"] for r in sgd} == {"0.008"} and max(gaps("sgd")) == pytest.approx(0.029, abs=5e-4)
    spread = {o: [round(100 * float(r["balanced_accuracy"]), 1) for r in rows]
              for o, rows in (("sgd", sgd), ("adam", adam))}
    assert (min(spread["sgd"]), max(spread["sgd"])) == (88.8, 92.9)
    assert (min(spread["adam"]), max(spread["adam"])) == (91.8, 93.7)
