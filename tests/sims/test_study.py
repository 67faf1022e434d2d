"""`dirichlet-fl study`: a tiny study end to end on a DermaMNIST-format .npz, --resume, the bad-input
lines (each before any training), the per-client accuracy and the cell order."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from sims.study import cell as study_cell
from sims.study import tuning as study_tuning
from sims.study.cell import COLUMNS, client_accuracies
from sims.study.plan import Study, cells, parse_partition
from sims.study.runner import read_table

ISSUE_COLUMNS = {"beta", "epsilon", "mechanism", "seed", "accuracy", "balanced_accuracy", "macro_auc",
                 "worst_client_accuracy", "median_client_accuracy", "max_client_epsilon", "learning_rate"}


def write_dermamnist(path: Path, sizes: tuple[int, int, int] = (84, 14, 35), seed: int = 0) -> Path:
    """A file in medmnist's DermaMNIST layout: 28 x 28 x 3 uint8 images, N x 1 labels in 0..6, every
    class present; each class a different brightness, so that a model can learn something."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in zip(("train", "val", "test"), sizes):
        labels = np.arange(n) % 7
        images = rng.integers(0, 60, (n, 28, 28, 3)) + 30 * labels[:, None, None, None]
        arrays[f"{split}_images"] = images.astype(np.uint8)
        arrays[f"{split}_labels"] = labels.reshape(n, 1).astype(np.uint8)
    np.savez(path, **arrays)
    return path


TINY = ["--num-clients", "2", "--epsilons", "8", "--mechanisms", "none,dirichlet", "--seeds", "1",
        "--rounds", "1", "--local-epochs", "0.5", "--learning-rate", "0.05", "--dirichlet-learning-rate", "0.05"]
"""A tiny study with both rates given (nothing tuned: tests/sims/test_study_tuning.py tunes)."""


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any cell or tuning run starts training."""
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("training started")
    monkeypatch.setattr(study_cell, "run_fedavg", refuse)
    monkeypatch.setattr(study_tuning, "run_fedavg", refuse)


def test_a_tiny_study_writes_the_table_and_pictures_and_resume_adds_no_row(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_dermamnist(tmp_path / "derma-like.npz")
    out = tmp_path / "study"
    argv = ["study", "--data-path", str(data), "--betas", "0.3,iid", *TINY, "--out", str(out)]
    assert main(argv) == 0
    with open(out / "table.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    assert ISSUE_COLUMNS <= set(reader.fieldnames or [])
    assert sorted((r["beta"], r["mechanism"]) for r in rows) == [
        ("0.3", "dirichlet"), ("0.3", "none"), ("iid", "dirichlet"), ("iid", "none")]
    for row in rows:
        assert row["status"] == "ok" and 0 <= float(row["accuracy"]) <= 1
        assert (row["rate_source"], row["learning_rate"]) == ("flag", "0.05")
        assert float(row["worst_client_accuracy"]) <= float(row["median_client_accuracy"])
        assert len(row["client_accuracies"].split(";")) == 2
        assert row["collapsed"] == str(int(row["predicted_classes"] == "1")) and int(row["predicted_classes"]) >= 1
    private = [r for r in rows if r["mechanism"] == "dirichlet"]
    assert all(0 < float(r["max_client_epsilon"]) <= 8 for r in private)
    for picture in ("accuracy_vs_epsilon.png", "client_spread.png", "partition-0.3.png", "partition-iid.png"):
        assert (out / picture).stat().st_size > 1000
    assert "| 0.3 | dirichlet | sgd | 8 | 1 |" in (out / "table.md").read_text()
    recorded = json.loads((out / "study.json").read_text())
    assert recorded["data_root"] == "" and recorded["data_path"] == str(data.resolve())  # what the user gave
    assert (recorded["dirichlet_weighting"], recorded["dirichlet_weight_cap"]) == ("normalized", 20.0)

    monkeypatch.setattr(study_cell, "run_fedavg", lambda *_: (_ for _ in ()).throw(AssertionError("reran")))
    assert main([*argv, "--resume"]) == 0
    assert read_table(out / "table.csv") == [dict(r) for r in rows]


@pytest.mark.parametrize(("change", "flag"), [
    (["--betas", "0.3,skewed"], "--betas: 'skewed'"),
    (["--betas", "0"], "--betas: beta=0"),
    (["--betas", "-1"], "--betas: beta=-1"),
    (["--num-clients", "500"], "--num-clients=500"),
    (["--epsilons", "0.0005"], "--epsilons: eps=0.0005 is at or below the Theorem 10 floor"),
    (["--mechanisms", "none,laplace"], "--mechanisms="),
    (["--rate-grid", "laplace=0.1"], "--rate-grid: unknown mechanism 'laplace'"),
    (["--rate-grid", "none=0"], "--rate-grid none=0 is out of range"),
    (["--rate-grid", "dpsgd=0.1/-1"], "--rate-grid dpsgd=0.1/-1 is out of range"),
    (["--rate-grid", "none=fast"], "--rate-grid none 'fast' is invalid"),
    (["--rate-grid", "none"], "--rate-grid item 'none' is invalid"),
    (["--learning-rate", "0"], "--learning-rate=0.0 is out of range"),
    (["--strategies", "fedavg,fedsgd"], "--strategies='fedavg,fedsgd' is invalid: give one or more of fedavg,"),
    (["--strategies", ","], "--strategies=',' is invalid"),
    (["--strategies", "fedadam", "--server-rate-grid", "fedadam=0"], "--server-rate-grid fedadam=0 is out of range"),
    (["--strategies", "fedavgm", "--server-rate-grid", "fedavgm=0.1/-1"],
     "--server-rate-grid fedavgm=0.1/-1 is out of range"),
    (["--server-rate-grid", "fedprox=0.1"], "--server-rate-grid: strategy 'fedprox' has no server learning rate"),
    (["--proximal-mu", "0.1"], "--proximal-mu=0.1 has no effect without fedprox in --strategies=fedavg"),
    (["--strategies", "fedprox", "--proximal-mu", "-1"], "--proximal-mu=-1.0 is out of range"),
])
def test_bad_input_is_one_line_naming_the_flag_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_training: None, change: list[str], flag: str) -> None:
    data = write_dermamnist(tmp_path / "d.npz")
    argv = ["study", "--data-path", str(data), "--betas", "0.3,iid", *TINY, *change, "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("dirichlet-fl study: error: ") and flag in error


def test_a_data_path_not_in_medmnist_layout_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       no_training: None) -> None:
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=np.zeros((4, 28, 28, 3), np.uint8), y_train=np.zeros(4))
    labels_out_of_range = write_dermamnist(tmp_path / "eight.npz")
    with np.load(labels_out_of_range) as archive:
        arrays = {key: archive[key] for key in archive.files}
    arrays["test_labels"] = arrays["test_labels"] + 1
    np.savez(labels_out_of_range, **arrays)
    for path, words in ((bad, "missing arrays ['train_images'"), (tmp_path / "none.npz", "file not found"),
                        (labels_out_of_range, "must lie in 0..6")):
        assert main(["study", "--data-path", str(path), *TINY, "--out", str(tmp_path / "o")]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and f"--data-path {path}" in error and words in error


def test_resume_refuses_a_folder_made_with_other_axes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_dermamnist(tmp_path / "d.npz")
    out = tmp_path / "o"
    base = ["study", "--data-path", str(data), "--betas", "iid", *TINY, "--mechanisms", "none", "--out", str(out)]
    assert main(base) == 0
    capsys.readouterr()
    monkeypatch.setattr(study_cell, "run_fedavg", lambda *_: (_ for _ in ()).throw(AssertionError("ran")))
    assert main([*base, "--betas", "iid,0.3", "--resume"]) == 2
    error = capsys.readouterr().err
    assert "--resume" in error and "(--betas differ)" in error and error.count("\n") == 1


def test_resume_with_more_seeds_keeps_the_earlier_cells_and_runs_only_the_new_seeds(tmp_path: Path) -> None:
    data = write_dermamnist(tmp_path / "d.npz")
    out = tmp_path / "o"
    base = ["study", "--data-path", str(data), "--betas", "iid", *TINY, "--mechanisms", "none", "--out", str(out)]
    assert main(base) == 0
    first = read_table(out / "table.csv")
    assert main([*base, "--seeds", "2", "--resume"]) == 0
    extended = read_table(out / "table.csv")
    assert sorted(int(row["seed"]) for row in extended) == [0, 1]
    assert [row for row in extended if int(row["seed"]) == 0] == first  # seconds and all: not run again
    assert json.loads((out / "study.json").read_text())["seeds"] == [0, 1]
    assert main([*base, "--resume"]) == 2  # fewer seeds than the folder's is another study


def test_a_client_scores_the_recall_of_its_own_label_mix() -> None:
    labels = np.array([0, 0, 0, 1, 1, 2])
    parts = [np.array([0, 1, 2]), np.array([3, 4, 5]), np.array([0, 3])]
    accuracies = client_accuracies(parts, labels, (1.0, 0.0, math.nan))
    assert accuracies[0] == 1.0 and accuracies[2] == 0.5
    assert accuracies[1] == 0.0  # class 2 has no test example: left out, shares renormalised over class 1


def test_cells_run_the_headline_eps_first_and_none_once_per_partition() -> None:
    study = Study(partitions=("0.1", "iid"), epsilons=(0.5, 1.0, 2.0, 4.0), mechanisms=("dpsgd", "none", "dirichlet"),
                  seeds=(0, 1))
    order = cells(study)
    assert len(order) == 2 * 2 * (1 + 4 + 4)
    first_late = next(i for i, c in enumerate(order) if c.epsilon in (0.5, 2.0))
    assert all(c.epsilon in (1.0, 4.0) or math.isinf(c.epsilon) for c in order[:first_late])
    assert [c.mechanism for c in order[:2]] == ["dirichlet", "dirichlet"] and order[0].seed == 0
    assert sum(1 for c in order if c.mechanism == "none") == 4
    assert set(COLUMNS) >= ISSUE_COLUMNS


def test_partition_words_are_canonical() -> None:
    assert [parse_partition(w) for w in ("0.30", "1", "iid", "central", "classes=2")] == [
        "0.3", "1", "iid", "central", "classes=2"]


def test_the_dermamnist_paper_preset_is_the_papers_setting_and_flags_override_it(tmp_path: Path) -> None:
    from cli.main import build_parser
    from cli.study import apply_preset
    from sims.study.options import study_of

    data = write_dermamnist(tmp_path / "dermamnist.npz")
    args = build_parser().parse_args(["study", "--preset", "dermamnist-paper", "--data-path", str(data),
                                      "--device", "cpu", "--seeds", "1"])
    apply_preset(args)
    study = study_of(args)
    assert (study.dataset, study.model, study.batch_size, study.rounds) == ("dermamnist", "resnet9", 70, 60)
    assert study.epsilons == (1.0, 2.0, 4.0, 8.0) and study.partitions == ("central", "iid", "0.3")
    assert (study.device, study.seeds) == ("cpu", (0,))
    # where the paper's setting returned a constant predictor on the stand-in: Adam, tuned over ResNet-9's own grid,
    # the normalised loss and a warm-up (the preset prints each departure and why)
    assert (study.optimizers, study.dirichlet_weighting, study.warmup_rounds) == (("adam",), "normalized", 3)
    assert (study.learning_rate, study.dirichlet_learning_rate, study.dpsgd_learning_rate) == (None, None, None)
    assert (study.rate_grid, study.adam_rate_grid) == (
        "", "none=0.0001/0.0003/0.001,dirichlet=0.0001/0.0003/0.001,dpsgd=0.0001/0.0003/0.001")


def test_the_dermamnist_paper_preset_prints_where_it_departs_from_the_paper_and_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_training: None) -> None:
    from cli.study import DEPARTURES

    assert main(["study", "--preset", "dermamnist-paper", "--data-root", str(tmp_path / "absent"),
                 "--out", str(tmp_path / "o")]) == 2  # no data: refused before any training, after the lines
    lines = capsys.readouterr().err.splitlines()
    departures = [line for line in lines if "departs from the paper" in line]
    assert len(departures) == len(DEPARTURES["dermamnist-paper"]) == 4
    assert "Adam" in departures[0] and "1e-4 / 3e-4 / 1e-3" in departures[0] and "14.3 %" in departures[0]
    assert "normalised" in departures[1]


def test_the_optimizer_and_warmup_not_given_are_the_networks_own() -> None:
    from cli.main import build_parser
    from cli.study import apply_preset
    from sims.study.options import study_of

    def study(*flags: str) -> Study:
        args = build_parser().parse_args(["study", "--data-path", "", "--dataset", "dermamnist", *flags])
        apply_preset(args)
        return study_of(args)

    assert (study("--model", "lenet").optimizers, study("--model", "lenet").warmup_rounds) == (("sgd",), 3)
    assert study("--model", "lenet", "--norm", "group").optimizers == ("adam",)
    assert study("--model", "resnet9").optimizers == ("adam",)
    given = study("--model", "resnet9", "--optimizers", "sgd,adam", "--warmup-rounds", "0")
    assert (given.optimizers, given.warmup_rounds) == (("sgd", "adam"), 0)


def test_a_study_json_from_before_the_warmup_resumes_as_no_warmup(tmp_path: Path) -> None:
    """A folder written before `warmup_rounds` existed ran without a warm-up: --resume with --warmup-rounds 0
    takes it, any other warm-up is refused as a changed setting."""
    from sims.study.runner import STUDY_FILE, describe, load_study, resumable

    study = Study(warmup_rounds=0, rate_extension_steps=0)
    legacy = json.loads(describe(study))
    del legacy["warmup_rounds"], legacy["rate_extension_steps"]
    (tmp_path / STUDY_FILE).write_text(json.dumps(legacy))
    assert load_study(tmp_path / STUDY_FILE).warmup_rounds == 0
    assert resumable(tmp_path, study) == ([], [])
    with pytest.raises(ValueError, match="--warmup-rounds differ"):
        resumable(tmp_path, Study(warmup_rounds=3, rate_extension_steps=0))


def test_a_collapsed_cell_is_flagged_in_its_row_and_counted_in_the_table() -> None:
    """A cell whose model predicts one class: `collapsed` 1 beside its `dead_classes` count in table.csv, and
    table.md counts its collapsed seeds; rows from before the column show '-' (not recorded), never 0."""
    from sims.fedavg_loop import LoopRound
    from sims.study.cell import final_metrics
    from sims.study.report import markdown_table

    def final(recalls: tuple[float, ...], predicted: int) -> LoopRound:
        return LoopRound(20, 0.67, 1.0, 0.5, math.nan, sum(recalls) / len(recalls), 0.8, recalls, predicted,
                         1, 0, 0, 1.0, 1.0)

    constant = final_metrics(final((1.0, 0.0, 0.0, math.nan), 1))
    assert (constant["collapsed"], constant["dead_classes"], constant["predicted_classes"]) == (1, 2, 1)
    alive = final_metrics(final((1.0, 0.5, 0.0, math.nan), 2))
    assert (alive["collapsed"], alive["dead_classes"]) == (0, 1)
    base = {"beta": "central", "mechanism": "dirichlet", "epsilon": 1.0, "status": "ok", "max_client_epsilon": 1.0,
            "worst_client_accuracy": 0.5, "median_client_accuracy": 0.5}
    rows = [{**base, "seed": s, **metrics} for s, metrics in enumerate((constant, alive, alive))]
    study = Study(partitions=("central",), epsilons=(1.0,), mechanisms=("dirichlet",))
    assert markdown_table(rows, study).splitlines()[-1].endswith("| 1 of 3 |")
    legacy = [{k: v for k, v in row.items() if k != "collapsed"} for row in rows]
    assert markdown_table(legacy, study).splitlines()[-1].endswith("| - |")


def test_a_network_tunes_adam_over_its_own_grid_unless_the_flag_names_one(tmp_path: Path) -> None:
    """resnet9 declares its Adam grid (its Recipe): below the default grid's middle, where it trained; lenet keeps
    the default grid, and --adam-rate-grid replaces a network's grid for the mechanisms it names."""
    from cli.main import build_parser
    from cli.study import apply_preset
    from dirichlet_fl.models.recipes import ADAM_GRID, recipe
    from sims.study.options import study_of

    def adam_grid(*flags: str) -> str:
        args = build_parser().parse_args(["study", "--dataset", "digits", "--mechanisms", "none,dirichlet",
                                          "--optimizers", "adam", *flags])
        apply_preset(args)
        return study_of(args).adam_rate_grid

    assert recipe("resnet9").adam_grid == (1e-4, 3e-4, 1e-3) and recipe("lenet").adam_grid == ADAM_GRID
    assert adam_grid("--model", "resnet9") == "none=0.0001/0.0003/0.001,dirichlet=0.0001/0.0003/0.001"
    assert adam_grid("--model", "lenet") == "none=0.0003/0.001/0.003,dirichlet=0.0003/0.001/0.003"
    assert adam_grid("--model", "resnet9", "--adam-rate-grid", "none=0.01") == \
        "none=0.01,dirichlet=0.0001/0.0003/0.001"
