"""The study's rate tuning: on the validation split only (never the test split), the tie rule, --resume
without reruns or duplicate rows, and a given rate flag skipping tuning for its mechanism."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.loaders import load_dataset
from dirichlet_fl.data.split import federated_split
from sims.fedavg_loop import LoopResult, run_fedavg
from sims.study import cell as study_cell
from sims.study import tuning as study_tuning
from sims.study.runner import TUNING_FILE
from sims.study.tuning import choose_rate, choose_rates
from tests.sims.test_study import write_dermamnist

TINY = ["--num-clients", "2", "--epsilons", "8", "--seeds", "2", "--rounds", "1", "--local-epochs", "0.5",
        "--rate-extension-steps", "0", "--server-rate-extension-steps", "0"]
"""A tiny study; no grid extension unless a test asks for it (it would add runs where a grid's edge wins)."""


def tuning_rows(out: Path) -> list[dict[str, str]]:
    with open(out / TUNING_FILE, newline="") as handle:
        return list(csv.DictReader(handle))


def refuse(*_: object, **__: object) -> None:
    raise AssertionError("training started")


def rows_of(images: object) -> set[bytes]:
    """Each image's bytes: the identity of an example across loads of the same file."""
    return {row.numpy().tobytes() for row in images}  # type: ignore[attr-defined]


def test_tuning_trains_and_evaluates_inside_the_training_data_never_on_the_test_split(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_dermamnist(tmp_path / "d.npz")
    seen: list[tuple[RunConfig, int]] = []

    def spy(config: RunConfig, clients: int) -> LoopResult:
        seen.append((config, clients))
        return run_fedavg(config, clients)

    monkeypatch.setattr(study_tuning, "run_fedavg", spy)
    out = tmp_path / "o"
    argv = ["study", "--data-path", str(data), "--betas", "iid,central", *TINY, "--mechanisms", "none",
            "--rate-grid", "none=0.05/0.1", "--out", str(out)]
    assert main(argv) == 0

    assert len(seen) == 4 and {c.seed for c, _ in seen} == {0}  # 2 partitions x 2 rates, seed 0 only
    config0 = seen[0][0]
    raw = load_dataset(config0.data.dataset, config0.data.root or None)
    train, test = rows_of(raw.train_x), rows_of(raw.test_x)
    for config, clients in seen:
        split = federated_split(config.split_spec(clients))
        evaluated = rows_of(split.data.test_x)
        trained = rows_of(split.data.train_x[np.concatenate(split.train_parts)])
        assert evaluated and evaluated <= train and not evaluated & test  # within the training data only
        assert not evaluated & trained  # held out from the tuning run's own training
        assert len(evaluated) + len(trained) == len(train)
    rows = tuning_rows(out)
    assert len(rows) == 4 and {r["evaluated_on"] for r in rows} == {"validation"}
    with open(out / "table.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    chosen = {r["beta"]: choose_rate([x for x in rows if x["beta"] == r["beta"]]) for r in table}
    for row in table:
        assert row["rate_source"] == "validation" and float(row["learning_rate"]) == chosen[row["beta"]]


def test_the_smallest_rate_within_one_point_of_the_best_is_chosen() -> None:
    def rows(*pairs: tuple[float, object], status: str = "ok") -> list[dict[str, object]]:
        return [{"learning_rate": rate, "balanced_accuracy": score, "status": status} for rate, score in pairs]

    assert choose_rate(rows((0.02, 0.800), (0.05, 0.809), (0.1, 0.805))) == 0.02
    assert choose_rate(rows((0.1, 0.81), (0.05, 0.80), (0.2, 0.2))) == 0.05  # exactly one point: a tie
    assert choose_rate(rows((0.02, 0.70), (0.05, 0.80), (0.1, 0.795))) == 0.05
    assert choose_rate(rows((0.1, 0.9), (0.02, "nan")) + rows((0.01, 0.95), status="no-rounds")) == 0.1
    with pytest.raises(ValueError, match="no tuning run finished"):
        choose_rate(rows((0.1, ""), (0.2, "nan")))


def test_an_extension_one_step_below_a_breakdown_is_not_chosen() -> None:
    """The label-skew failures of BENCHMARKS 11.5: the extension 0.2 beat the grid's 0.1 by 2.6 points on seed 0
    (draw seed 23, no privacy), 0.4 collapsed, and 0.2 then collapsed on 4 of 5 seeds. An extension whose next
    step predicted fewer than half the classes is at the edge, and the extension stops there; a grid rate below
    a breakdown keeps its place (the stand-in's 0.1 kept every class on 5 of 5 seeds); a breakdown never wins."""
    from sims.study.tuning import extended_rates

    def row(rate: float, score: float, classes: int = 7, extension: int = 0, server: object = "") -> dict[str, object]:
        return {"learning_rate": rate, "balanced_accuracy": score, "status": "ok", "predicted_classes": classes,
                "collapsed": int(classes == 1), "extension": extension, "server_learning_rate": server}

    draw23 = [row(0.02, 0.533, 4), row(0.05, 0.600, 5), row(0.1, 0.737, 6), row(0.2, 0.763, 7, 1),
              row(0.4, 0.143, 1, 2)]
    assert choose_rate(draw23) == 0.1
    assert choose_rate(draw23[:4]) == 0.2  # without the step that collapsed, 0.2 is simply the best
    assert extended_rates((0.02, 0.05, 0.1), {float(str(r["learning_rate"])): r for r in draw23}, 5) == [
        (1, 0.2), (2, 0.4)]  # 0.1 is the choice and inside: no third step
    stand_in = [row(0.02, 0.655, 5), row(0.05, 0.814), row(0.1, 0.868), row(0.2, 0.143, 1, 1)]
    assert choose_rate(stand_in) == 0.1  # the grid's top rate below a collapse keeps its place
    assert choose_rate([row(0.0003, 0.458, 4), row(0.001, 0.778, 7, 0), row(0.003, 0.79, 2, 1)]) == 0.001  # 2 of 7
    assert choose_rate([row(0.1, 0.7, 7), row(0.2, 0.9, 7, 1), row(0.4, 0.45, 4, 2)]) == 0.2  # 4 of 7: half or more
    assert choose_rate([row(0.1, 0.9, 7, 1), row(0.2, 0.2, 1, 2)]) == 0.1  # everything at the edge or broken: all
    old = [{k: v for k, v in r.items() if k not in ("collapsed", "predicted_classes")} for r in draw23]
    assert choose_rate(old) == 0.2  # rows from before the columns: nothing is known to have broken down
    paired = [row(0.1, 0.8, 7, 0, 0.01), row(0.2, 0.9, 7, 1, 0.01), row(0.4, 0.1, 1, 2, 0.01),
              row(0.1, 0.7, 7, 0, 0.03), row(0.2, 0.85, 7, 1, 0.03), row(0.4, 0.8, 7, 2, 0.03)]
    assert choose_rates(paired) == (0.2, 0.03)  # the edge is judged at each server rate on its own


def test_resume_never_reruns_or_duplicates_a_tuning_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_dermamnist(tmp_path / "d.npz")
    out = tmp_path / "o"
    argv = ["study", "--data-path", str(data), "--betas", "iid", *TINY, "--mechanisms", "none",
            "--rate-grid", "none=0.05/0.1", "--seeds", "1", "--out", str(out)]
    assert main(argv) == 0
    first = (out / TUNING_FILE).read_text()
    lines = first.splitlines(keepends=True)
    assert len(lines) == 3
    (out / TUNING_FILE).write_text("".join(lines[:2] + lines[1:2]))  # stopped after one run, its row twice
    (out / "table.csv").write_text((out / "table.csv").read_text().splitlines(keepends=True)[0])

    calls: list[float] = []

    def counting(config: RunConfig, clients: int) -> LoopResult:
        calls.append(config.lr.rate)
        return run_fedavg(config, clients)

    monkeypatch.setattr(study_tuning, "run_fedavg", counting)
    assert main([*argv, "--resume"]) == 0
    assert calls == [float(lines[2].split(",")[4])]  # only the missing rate ran
    again = tuning_rows(out)
    assert len(again) == 2 and len({r["learning_rate"] for r in again}) == 2
    finished = (out / TUNING_FILE).read_text()

    monkeypatch.setattr(study_tuning, "run_fedavg", refuse)
    monkeypatch.setattr(study_cell, "run_fedavg", refuse)
    assert main([*argv, "--resume"]) == 0
    assert (out / TUNING_FILE).read_text() == finished


def test_resume_refuses_another_rate_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_dermamnist(tmp_path / "d.npz")
    out = tmp_path / "o"
    argv = ["study", "--data-path", str(data), "--betas", "iid", *TINY, "--mechanisms", "none", "--seeds", "1",
            "--rate-grid", "none=0.1", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    monkeypatch.setattr(study_tuning, "run_fedavg", refuse)
    assert main([*argv, "--rate-grid", "none=0.05/0.1", "--resume"]) == 2
    error = capsys.readouterr().err
    assert "(--rate-grid differ)" in error and error.count("\n") == 1


def test_a_given_rate_flag_skips_tuning_for_its_mechanism(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_dermamnist(tmp_path / "d.npz")
    tuned: list[str] = []

    def spy(config: RunConfig, clients: int) -> LoopResult:
        tuned.append(config.privacy.mechanism)
        return run_fedavg(config, clients)

    monkeypatch.setattr(study_tuning, "run_fedavg", spy)
    out = tmp_path / "o"
    argv = ["study", "--data-path", str(data), "--betas", "iid", *TINY, "--seeds", "1", "--mechanisms",
            "none,dirichlet", "--learning-rate", "0.07", "--rate-grid", "dirichlet=0.05", "--out", str(out)]
    assert main(argv) == 0
    assert tuned == ["dirichlet"]  # none's rate was given
    with open(out / "table.csv", newline="") as handle:
        sources = {(r["mechanism"], r["rate_source"], r["learning_rate"]) for r in csv.DictReader(handle)}
    assert sources == {("none", "flag", "0.07"), ("dirichlet", "validation", "0.05")}
    assert [r["mechanism"] for r in tuning_rows(out)] == ["dirichlet"]

    monkeypatch.setattr(study_tuning, "run_fedavg", refuse)
    given = ["--dirichlet-learning-rate", "0.05", "--out", str(tmp_path / "given")]
    assert main([*argv[:-2], *given]) == 0
    assert tuning_rows(tmp_path / "given") == []


def test_a_rate_chosen_at_the_edge_of_its_grid_is_named_with_the_fix() -> None:
    from sims.study.plan import Study
    from sims.study.tuning import edge_warnings, grid_text, parse_rate_grid

    mechanisms = ("none", "dirichlet", "dpsgd")
    grid = grid_text(parse_rate_grid("none=0.02/0.05/0.1,dirichlet=0.02/0.05/0.1,dpsgd=0.1"), mechanisms)
    study = Study(partitions=("0.3", "iid"), epsilons=(1.0,), mechanisms=mechanisms, rate_grid=grid)
    scores = {("0.3", "dirichlet", 1.0): (0.80, 0.70, 0.60),  # only the lowest is good: warned
              ("iid", "dirichlet", 1.0): (0.80, 0.805, 0.50),  # the lowest ties with an inner rate: no warning
              ("0.3", "none", float("inf")): (0.50, 0.60, 0.70),  # only the highest is good: warned
              ("iid", "none", float("inf")): (0.50, 0.70, 0.60)}
    rows: list[dict[str, object]] = [
        {"beta": p, "mechanism": m, "epsilon": e, "learning_rate": rate, "status": "ok", "balanced_accuracy": ba}
        for (p, m, e), values in scores.items() for rate, ba in zip((0.02, 0.05, 0.1), values)]
    rows += [{"beta": p, "mechanism": "dpsgd", "epsilon": 1.0, "learning_rate": 0.1, "status": "ok",
              "balanced_accuracy": 0.3} for p in ("0.3", "iid")]  # a one-rate grid: nothing to say
    assert edge_warnings(study, rows) == [
        "tuning beta=0.3 dirichlet eps=1: the rate chosen, 0.02, is the lowest of --rate-grid "
        "dirichlet=0.02/0.05/0.1 and the only one within a point of the best; a better one may lie below it: "
        "widen --rate-grid",
        "tuning beta=0.3 none eps=inf: the rate chosen, 0.1, is the highest of --rate-grid none=0.02/0.05/0.1 "
        "and the only one within a point of the best; a better one may lie above it: widen --rate-grid"]


def test_each_optimizer_is_an_axis_tuned_over_its_own_grid_and_resume_refuses_another_list(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--optimizers sgd,adam: each optimizer tunes its own grid (Adam's in its own units), every table.csv and
    tuning.csv row names its optimizer, table.md and study.json carry it, and --resume with another optimizer
    list is refused in one line."""
    data = write_dermamnist(tmp_path / "d.npz")
    seen: list[tuple[str, float]] = []

    def spy(config: RunConfig, clients: int) -> LoopResult:
        seen.append((config.lr.optimizer, config.lr.rate))
        return run_fedavg(config, clients)

    monkeypatch.setattr(study_tuning, "run_fedavg", spy)
    out = tmp_path / "o"
    argv = ["study", "--data-path", str(data), "--betas", "central", *TINY, "--seeds", "1", "--mechanisms",
            "dirichlet", "--optimizers", "sgd,adam", "--rate-grid", "dirichlet=0.05/0.1",
            "--adam-rate-grid", "dirichlet=0.001/0.003", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(seen) == [("adam", 0.001), ("adam", 0.003), ("sgd", 0.05), ("sgd", 0.1)]
    tuning = tuning_rows(out)
    with open(out / "table.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert {r["optimizer"] for r in tuning} == {r["optimizer"] for r in table} == {"sgd", "adam"}
    for row in table:
        mine = [x for x in tuning if x["optimizer"] == row["optimizer"]]
        assert float(row["learning_rate"]) == choose_rate(mine)  # each optimizer chose from its own runs
    recorded = json.loads((out / "study.json").read_text())
    assert recorded["optimizers"] == ["sgd", "adam"]
    assert (recorded["rate_grid"], recorded["adam_rate_grid"]) == ("dirichlet=0.05/0.1", "dirichlet=0.001/0.003")
    markdown = (out / "table.md").read_text()
    assert "| central | dirichlet | sgd | 8 | 1 |" in markdown and "| central | dirichlet | adam | 8 | 1 |" in markdown

    capsys.readouterr()
    monkeypatch.setattr(study_tuning, "run_fedavg", refuse)
    monkeypatch.setattr(study_cell, "run_fedavg", refuse)
    changed = [*argv, "--resume"]
    changed[changed.index("sgd,adam")] = "adam"
    assert main(changed) == 2
    error = capsys.readouterr().err
    assert "was made with other settings (--optimizers, --rate-grid differ)" in error and error.count("\n") == 1


def test_a_rate_flag_beside_two_optimizers_is_refused_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_dermamnist(tmp_path / "d.npz")
    monkeypatch.setattr(study_tuning, "run_fedavg", refuse)
    monkeypatch.setattr(study_cell, "run_fedavg", refuse)
    for extra, message in ((["--optimizers", "sgd,adam", "--dirichlet-learning-rate", "0.05"],
                            "--dirichlet-learning-rate with --optimizers=sgd,adam"),
                           (["--optimizers", "sgd,lbfgs"], "--optimizers='sgd,lbfgs' is invalid"),
                           (["--adam-rate-grid", "dirichlet=-1"], "--adam-rate-grid dirichlet=-1 is out of range")):
        argv = ["study", "--data-path", str(data), "--betas", "central", *TINY, *extra, "--out", str(tmp_path / "x")]
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert message in error and error.count("\n") == 1


def test_a_study_folder_from_before_the_optimizer_axis_resumes_and_renders_as_sgd(tmp_path: Path) -> None:
    """A study.json without `optimizers` ran SGD: it resumes as an SGD-only study (no cell reruns: its rows,
    which have no optimizer column, are SGD's) and its table renders with sgd; any other list is refused."""
    from sims.study.cell import COLUMNS
    from sims.study.plan import Study, cells
    from sims.study.report import markdown_table
    from sims.study.runner import STUDY_FILE, csv_text, describe, load_study, resumable, row_key

    study = Study(partitions=("central",), epsilons=(1.0,), mechanisms=("dirichlet",), seeds=(0,), warmup_rounds=0,
                  rate_extension_steps=0)
    legacy = json.loads(describe(study))
    for key in ("optimizers", "adam_rate_grid", "rate_extension_steps", "strategies", "server_rate_grid",
                "proximal_mu"):
        del legacy[key]
    (tmp_path / STUDY_FILE).write_text(json.dumps(legacy))
    old_columns = [c for c in COLUMNS if c not in ("optimizer", "collapsed", "predicted_classes", "strategy",
                                                   "server_learning_rate")]
    row = {"beta": "central", "epsilon": 1.0, "mechanism": "dirichlet", "seed": 0, "status": "ok", "accuracy": 0.9,
           "balanced_accuracy": 0.8, "macro_auc": 0.9, "worst_client_accuracy": 0.9, "median_client_accuracy": 0.9,
           "max_client_epsilon": 1.0, "learning_rate": 0.05, "client_accuracies": "0.9"}
    (tmp_path / "table.csv").write_text(csv_text([row], old_columns))
    loaded = load_study(tmp_path / STUDY_FILE)
    assert (loaded.optimizers, loaded.strategies, loaded.server_rate_grid) == (("sgd",), ("fedavg",), "")
    done, _ = resumable(tmp_path, study)
    assert [row_key(r) for r in done] == [cell.key for cell in cells(study)]  # nothing left to run
    assert "| central | dirichlet | sgd | 1 | 1 |" in markdown_table(done, study)
    with pytest.raises(ValueError, match="--optimizers differ"):
        resumable(tmp_path, Study(partitions=("central",), epsilons=(1.0,), mechanisms=("dirichlet",), seeds=(0,),
                                  warmup_rounds=0, rate_extension_steps=0, optimizers=("sgd", "adam")))
    with pytest.raises(ValueError, match="--strategies differ"):
        resumable(tmp_path, Study(partitions=("central",), epsilons=(1.0,), mechanisms=("dirichlet",), seeds=(0,),
                                  warmup_rounds=0, rate_extension_steps=0, strategies=("fedavg", "fedprox")))


def test_the_grid_is_extended_geometrically_beyond_an_edge_rate_a_bounded_number_of_steps() -> None:
    from sims.study.tuning import extended_rates

    def done(scores: dict[float, float]) -> dict[float, dict[str, object]]:
        return {rate: {"learning_rate": rate, "balanced_accuracy": score, "status": "ok"}
                for rate, score in scores.items()}

    grid = (0.02, 0.05, 0.1)
    assert extended_rates(grid, done({0.02: 0.9, 0.05: 0.5}), 2) == []  # the grid has not finished
    assert extended_rates(grid, done({0.02: 0.9, 0.05: 0.5, 0.1: 0.4}), 2) == [(-1, 0.008)]  # x 1/2.5: pending
    lowest = done({0.0032: 0.95, 0.008: 0.92, 0.02: 0.9, 0.05: 0.5, 0.1: 0.4})
    assert extended_rates(grid, lowest, 2) == [(-1, 0.008), (-2, 0.0032)]  # the bound: no third step
    assert extended_rates(grid, lowest, 0) == []
    inside = done({0.008: 0.85, 0.02: 0.9, 0.05: 0.5, 0.1: 0.4})
    assert extended_rates(grid, inside, 2) == [(-1, 0.008)]  # 0.02 is inside now: stop
    highest = done({0.02: 0.5, 0.05: 0.6, 0.1: 0.9, 0.2: 0.95})
    assert extended_rates(grid, highest, 2) == [(1, 0.2), (2, 0.4)]  # x 2 above
    assert extended_rates(grid, done({0.02: 0.9, 0.05: 0.895, 0.1: 0.4}), 2) == []  # a tie inside: no extension
    assert extended_rates((0.05,), done({0.05: 0.9}), 2) == []  # one rate: nothing to extend from


def test_the_tuner_extends_an_edge_choice_records_what_it_tried_and_warns_only_at_the_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation balanced accuracy falling with the rate: the tuner tries 2 steps below the grid, records
    them in tuning.csv (`extension` -1, -2) and the summary's `tried`, runs the cells at the lowest, and warns
    because the bound was hit."""
    data = write_dermamnist(tmp_path / "d.npz")
    real = study_tuning.run_fedavg

    def falling(config: RunConfig, clients: int) -> LoopResult:
        result = real(config, clients)
        last = result.rounds[-1]
        score = 1.0 - config.lr.rate  # the smaller the rate, the better
        result.rounds[-1] = type(last)(**{**last.__dict__, "central_balanced_accuracy": score})
        return result

    monkeypatch.setattr(study_tuning, "run_fedavg", falling)
    out = tmp_path / "o"
    argv = ["study", "--data-path", str(data), "--betas", "central", *TINY, "--seeds", "1", "--mechanisms", "none",
            "--rate-grid", "none=0.1/0.3", "--rate-extension-steps", "2", "--json", "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    rows = tuning_rows(out)
    assert [(float(r["learning_rate"]), int(r["extension"])) for r in rows] == [
        (0.1, 0), (0.3, 0), (0.033, -1), (0.011, -2)]
    report = json.loads(captured.out)
    assert [(r["learning_rate"], r["tried"]) for r in report["rates"]] == [(0.011, [0.011, 0.033, 0.1, 0.3])]
    with open(out / "table.csv", newline="") as handle:
        assert {r["learning_rate"] for r in csv.DictReader(handle)} == {"0.011"}
    assert report["rate_warnings"] == [
        "tuning beta=central none eps=inf: the rate chosen, 0.011, is the lowest of the rates tried (--rate-grid "
        "none=0.1/0.3 and 2 steps below it, 0.011/0.033: the most --rate-extension-steps=2 allows) and the only "
        "one within a point of the best; a better one may lie below it: widen --rate-grid"]
    assert "warning: tuning beta=central none eps=inf" in captured.err

    monkeypatch.setattr(study_tuning, "run_fedavg", refuse)  # --resume: every extension run is done
    monkeypatch.setattr(study_cell, "run_fedavg", refuse)
    assert main([*argv, "--resume"]) == 0


def test_each_strategy_is_an_axis_tuned_over_its_own_server_grid_and_resume_refuses_another_list(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--strategies fedavg,fedadam: FedAvg tunes its client rate, FedAdam every (client rate, server rate) pair of
    its own grids; every table.csv and tuning.csv row names its strategy (and FedAdam's its server rate), table.md
    and study.json carry it, FedAdam's aggregation gives other models than FedAvg's, and --resume with another
    strategy list is refused in one line."""
    data = write_dermamnist(tmp_path / "d.npz")
    seen: list[tuple[str, float, float]] = []

    def spy(config: RunConfig, clients: int) -> LoopResult:
        seen.append((config.strategy.name, config.lr.rate, config.strategy.server_learning_rate))
        return run_fedavg(config, clients)

    monkeypatch.setattr(study_tuning, "run_fedavg", spy)
    out = tmp_path / "o"
    argv = ["study", "--data-path", str(data), "--betas", "iid", *TINY, "--seeds", "1", "--mechanisms", "dirichlet",
            "--rate-grid", "dirichlet=0.05/0.1", "--strategies", "fedavg,fedadam",
            "--server-rate-grid", "fedadam=0.01/0.03", "--json", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(seen) == [("fedadam", 0.05, 0.01), ("fedadam", 0.05, 0.03), ("fedadam", 0.1, 0.01),
                            ("fedadam", 0.1, 0.03), ("fedavg", 0.05, 0.0), ("fedavg", 0.1, 0.0)]
    report = json.loads(capsys.readouterr().out)
    tuning = tuning_rows(out)
    assert sorted((r["strategy"], r["learning_rate"], r["server_learning_rate"]) for r in tuning) == [
        ("fedadam", "0.05", "0.01"), ("fedadam", "0.05", "0.03"), ("fedadam", "0.1", "0.01"),
        ("fedadam", "0.1", "0.03"), ("fedavg", "0.05", ""), ("fedavg", "0.1", "")]
    with open(out / "table.csv", newline="") as handle:
        table = {r["strategy"]: r for r in csv.DictReader(handle)}
    assert set(table) == {"fedavg", "fedadam"}
    for strategy, row in table.items():
        mine = [x for x in tuning if x["strategy"] == strategy]
        rate, server_rate = choose_rates(mine)  # each strategy chose from its own runs
        assert (float(row["learning_rate"]), float(row["server_learning_rate"] or 0)) == (rate, server_rate)
        assert row["status"] == "ok" and row["rate_source"] == "validation"
    assert table["fedavg"]["server_learning_rate"] == "" and table["fedadam"]["server_learning_rate"] != ""
    assert {(r["strategy"], r["server_learning_rate"]) for r in report["rates"]} == {
        ("fedavg", None), ("fedadam", float(table["fedadam"]["server_learning_rate"]))}
    at_rate = {(r["strategy"], r["server_learning_rate"]): r["macro_auc"] for r in tuning
               if r["learning_rate"] == "0.05"}
    assert at_rate[("fedavg", "")] not in (at_rate[("fedadam", "0.01")], at_rate[("fedadam", "0.03")])
    metrics = ("accuracy", "balanced_accuracy", "macro_auc", "client_accuracies")
    assert [table["fedavg"][m] for m in metrics] != [table["fedadam"][m] for m in metrics]
    recorded = json.loads((out / "study.json").read_text())
    assert (recorded["strategies"], recorded["server_rate_grid"]) == (["fedavg", "fedadam"], "fedadam=0.01/0.03")
    markdown = (out / "table.md").read_text()
    assert "| strategy |" in markdown
    assert "| iid | dirichlet | sgd | fedavg | 8 | 1 |" in markdown
    assert "| iid | dirichlet | sgd | fedadam | 8 | 1 |" in markdown

    capsys.readouterr()
    monkeypatch.setattr(study_tuning, "run_fedavg", refuse)
    monkeypatch.setattr(study_cell, "run_fedavg", refuse)
    assert main([*argv, "--resume"]) == 0  # the same list: nothing reruns
    capsys.readouterr()
    changed = [*argv, "--resume"]
    changed[changed.index("fedavg,fedadam")] = "fedavg,fedavgm"
    assert main(changed) == 2
    error = capsys.readouterr().err
    assert "was made with other settings (--server-rate-grid, --strategies differ)" in error
    assert error.count("\n") == 1


def test_a_server_rate_chosen_at_the_edge_of_its_grid_is_named_with_the_fix() -> None:
    from sims.study.plan import Study
    from sims.study.tuning import edge_warnings

    study = Study(partitions=("iid",), epsilons=(1.0,), mechanisms=("none",), strategies=("fedadam",),
                  server_rate_grid="fedadam=0.003/0.01/0.03", learning_rate=0.05)
    rows: list[dict[str, object]] = [
        {"beta": "iid", "mechanism": "none", "epsilon": float("inf"), "learning_rate": 0.05, "status": "ok",
         "strategy": "fedadam", "server_learning_rate": server, "balanced_accuracy": score}
        for server, score in ((0.003, 0.5), (0.01, 0.6), (0.03, 0.7))]
    assert edge_warnings(study, rows) == [
        "tuning beta=iid none eps=inf fedadam: the server rate chosen, 0.03, is the highest of --server-rate-grid "
        "fedadam=0.003/0.01/0.03 and the only one within a point of the best; a better one may lie above it: widen "
        "--server-rate-grid"]


def server_rows(scores: dict[tuple[float, float], float], extension: dict[float, int] | None = None,
                classes: dict[tuple[float, float], int] | None = None) -> list[dict[str, object]]:
    """FedAdam tuning rows at (client rate, server rate) -> validation balanced accuracy."""
    return [{"beta": "iid", "mechanism": "none", "epsilon": float("inf"), "learning_rate": rate, "status": "ok",
             "strategy": "fedadam", "server_learning_rate": server, "balanced_accuracy": score,
             "predicted_classes": (classes or {}).get((rate, server), 7),
             "server_extension": (extension or {}).get(server, 0)}
            for (rate, server), score in scores.items()]


def test_the_server_grid_is_extended_at_the_client_rate_chosen_a_bounded_number_of_steps() -> None:
    from sims.study.tuning import TuningRun, extended_server_rates

    grid = (0.01, 0.03)
    planned = [TuningRun("iid", "none", float("inf"), rate, "sgd", 0, "fedadam", server)
               for rate in (0.05, 0.1) for server in grid]
    rising = {(0.05, 0.01): 0.5, (0.05, 0.03): 0.8, (0.1, 0.01): 0.6, (0.1, 0.03): 0.7}
    assert extended_server_rates(grid, planned, server_rows(dict(list(rising.items())[:3])), 2) == []  # pending
    assert extended_server_rates(grid, planned, server_rows(rising), 2) == [(1, 0.09, 0.05)]  # x 3 above, at 0.05
    more = {**rising, (0.05, 0.09): 0.85}
    assert extended_server_rates(grid, planned, server_rows(more, {0.09: 1}), 2) == [(1, 0.09, 0.05),
                                                                                    (2, 0.27, 0.05)]
    most = {**more, (0.05, 0.27): 0.9}
    assert extended_server_rates(grid, planned, server_rows(most, {0.09: 1, 0.27: 2}), 2) == [
        (1, 0.09, 0.05), (2, 0.27, 0.05)]  # the bound: no third step
    assert extended_server_rates(grid, planned, server_rows(most, {0.09: 1, 0.27: 2}), 0) == []
    inside = {**rising, (0.05, 0.09): 0.6}
    assert extended_server_rates(grid, planned, server_rows(inside, {0.09: 1}), 2) == [(1, 0.09, 0.05)]  # stop
    falling = {(0.05, 0.01): 0.8, (0.05, 0.03): 0.5, (0.1, 0.01): 0.5, (0.1, 0.03): 0.4}
    assert extended_server_rates(grid, planned, server_rows(falling), 2) == [(-1, 0.0033, 0.05)]  # x 1/3 below


def test_a_server_step_one_below_a_breakdown_is_not_chosen() -> None:
    """The server step 0.09 fits seed 0 best, but the step above it, 0.27, collapsed: 0.09 is at the edge of
    divergence, so the grid's 0.03 is chosen."""
    scores = {(0.05, 0.01): 0.5, (0.05, 0.03): 0.7, (0.05, 0.09): 0.9, (0.05, 0.27): 0.14}
    rows = server_rows(scores, {0.09: 1, 0.27: 2}, {(0.05, 0.27): 1})
    assert choose_rates(rows) == (0.05, 0.03)
    grid_only = server_rows(scores, {}, {(0.05, 0.27): 1})  # had 0.09 been on the grid, it would be chosen
    assert choose_rates(grid_only) == (0.05, 0.09)


def test_the_tuner_extends_an_edge_server_rate_records_it_and_warns_only_at_the_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation balanced accuracy rising with FedAdam's server rate: the tuner tries 2 server steps above its
    grid at the client rate chosen, records them (`server_extension` 1, 2), runs the cells at the highest, warns
    because the bound was hit, and --resume reruns nothing."""
    data = write_dermamnist(tmp_path / "d.npz")
    real = study_tuning.run_fedavg

    def rising(config: RunConfig, clients: int) -> LoopResult:
        result = real(config, clients)
        last = result.rounds[-1]
        score = config.strategy.server_learning_rate  # the larger the server rate, the better
        result.rounds[-1] = type(last)(**{**last.__dict__, "central_balanced_accuracy": score})
        return result

    monkeypatch.setattr(study_tuning, "run_fedavg", rising)
    out = tmp_path / "o"
    argv = ["study", "--data-path", str(data), "--betas", "iid", *TINY, "--seeds", "1", "--mechanisms", "none",
            "--rate-grid", "none=0.05/0.1", "--strategies", "fedadam", "--server-rate-grid", "fedadam=0.01/0.03",
            "--server-rate-extension-steps", "2", "--json", "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    rows = tuning_rows(out)
    assert sorted((float(r["learning_rate"]), float(r["server_learning_rate"]), int(r["server_extension"]))
                  for r in rows) == [(0.05, 0.01, 0), (0.05, 0.03, 0), (0.05, 0.09, 1), (0.05, 0.27, 2),
                                     (0.1, 0.01, 0), (0.1, 0.03, 0)]
    report = json.loads(captured.out)
    assert [(r["learning_rate"], r["server_learning_rate"], r["server_tried"]) for r in report["rates"]] == [
        (0.05, 0.27, [0.01, 0.03, 0.09, 0.27])]
    with open(out / "table.csv", newline="") as handle:
        assert {r["server_learning_rate"] for r in csv.DictReader(handle)} == {"0.27"}
    assert report["rate_warnings"] == [
        "tuning beta=iid none eps=inf fedadam: the server rate chosen, 0.27, is the highest of the server rates "
        "tried (--server-rate-grid fedadam=0.01/0.03 and 2 steps above it, 0.09/0.27: the most "
        "--server-rate-extension-steps=2 allows) and the only one within a point of the best; a better one may lie "
        "above it: widen --server-rate-grid"]

    monkeypatch.setattr(study_tuning, "run_fedavg", refuse)
    monkeypatch.setattr(study_cell, "run_fedavg", refuse)
    assert main([*argv, "--resume"]) == 0


def test_a_study_json_from_before_the_server_extension_never_extends_the_server_grid(tmp_path: Path) -> None:
    from sims.study.plan import Study
    from sims.study.runner import STUDY_FILE, describe, load_study, resumable

    study = Study(strategies=("fedadam",), server_rate_grid="fedadam=0.01/0.03", server_rate_extension_steps=0)
    legacy = json.loads(describe(study))
    del legacy["server_rate_extension_steps"]
    (tmp_path / STUDY_FILE).write_text(json.dumps(legacy))
    assert load_study(tmp_path / STUDY_FILE).server_rate_extension_steps == 0
    assert resumable(tmp_path, study) == ([], [])
    with pytest.raises(ValueError, match="--server-rate-extension-steps differ"):
        resumable(tmp_path, Study(strategies=("fedadam",), server_rate_grid="fedadam=0.01/0.03"))
