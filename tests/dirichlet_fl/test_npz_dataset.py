"""dataset = "npz": a whole data set from one .npz in medmnist's layout (DermaMNIST's), at data-path.

The files are written here with DermaMNIST's official layout: 7 classes, 28 x 28 x 3 uint8 images,
labels of shape N x 1, train/val/test splits.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cli.main import main
from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.loaders import dataset_num_classes, load_dataset
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.preflight import preflight
from dirichlet_fl.simulation import APP_DIR, simulate

SIZES = {"train": 140, "val": 21, "test": 35}
CLASSES = 7


def dermamnist_arrays(seed: int = 0, classes: int = CLASSES) -> dict[str, np.ndarray]:
    """DermaMNIST's arrays, every class present in every split, the pixels a class-dependent shade."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, count in SIZES.items():
        labels = np.arange(count) % classes
        shade = (labels * 30)[:, None, None, None]
        arrays[f"{split}_images"] = (rng.integers(0, 40, size=(count, 28, 28, 3)) + shade).astype(np.uint8)
        arrays[f"{split}_labels"] = labels.reshape(-1, 1).astype(np.uint8)
    return arrays


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]
    return path


@pytest.fixture
def derma_file(tmp_path: Path) -> Path:
    return write_npz(tmp_path / "lesions.npz", dermamnist_arrays())


def test_an_npz_in_dermamnists_layout_loads_with_its_classes_from_the_labels(derma_file: Path) -> None:
    data = load_dataset("npz", data_path=str(derma_file))

    assert (data.in_channels, data.image_size, data.num_classes) == (3, 28, CLASSES)
    assert data.class_names == tuple(str(c) for c in range(CLASSES))
    assert data.val_x is not None and data.val_y is not None
    assert [len(y) for y in (data.train_y, data.val_y, data.test_y)] == list(SIZES.values())
    assert torch.equal(data.test_y, torch.arange(SIZES["test"]) % CLASSES)
    mean = data.train_x.mean(dim=(0, 2, 3))
    assert torch.allclose(mean, torch.zeros(3), atol=1e-5)  # normalised with the training statistics


def test_a_file_named_like_a_medmnist_set_takes_that_sets_classes(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "dermamnist.npz", dermamnist_arrays(classes=5))  # the two rarest absent

    data = load_dataset("npz", data_path=str(path))

    assert data.num_classes == CLASSES and data.class_names[0] == "actinic keratoses and intraepithelial carcinoma"
    beyond = dermamnist_arrays(classes=8)
    with pytest.raises(ValueError, match=r"train_labels lie in 0\.\.7; with 7 classes they must lie in 0\.\.6"):
        load_dataset("npz", data_path=str(write_npz(tmp_path / "dermamnist_64.npz", beyond)))


def broken(change: str) -> dict[str, np.ndarray]:
    """DermaMNIST's arrays with one thing wrong."""
    arrays = dermamnist_arrays()
    if change == "missing array":
        del arrays["test_labels"]
    elif change == "val images without labels":
        del arrays["val_labels"]
    elif change == "wrong dims":
        arrays["train_images"] = arrays["train_images"][:, :, :, 0].reshape(SIZES["train"], -1)
    elif change == "not square":
        arrays["train_images"] = arrays["train_images"][:, :, :20]
    elif change == "float images":
        arrays["train_images"] = arrays["train_images"].astype(np.float32)
    elif change == "float labels":
        arrays["train_labels"] = arrays["train_labels"].astype(np.float64) + 0.5
    elif change == "labels per image":
        arrays["test_labels"] = arrays["test_labels"][:-1]
    elif change == "multi-label":
        arrays["train_labels"] = np.repeat(arrays["train_labels"], 2, axis=1)
    elif change == "empty test":
        arrays["test_images"], arrays["test_labels"] = arrays["test_images"][:0], arrays["test_labels"][:0]
    elif change == "empty train":
        arrays["train_images"], arrays["train_labels"] = arrays["train_images"][:0], arrays["train_labels"][:0]
    elif change == "negative labels":
        arrays["val_labels"] = arrays["val_labels"].astype(np.int64) - 1
    elif change == "small test images":
        arrays["test_images"] = np.zeros((len(arrays["test_labels"]), 8, 8), dtype=np.uint8)
    return arrays


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("missing array", r"missing arrays \['test_labels'\]"),
        ("val images without labels", r"missing arrays \['val_labels'\]"),
        ("wrong dims", r"train_images must be uint8 N x H x W or N x H x W x C with H == W, got uint8 \(140, 784\)"),
        ("not square", r"train_images must be .* with H == W, got uint8 \(140, 28, 20, 3\)"),
        ("float images", r"train_images must be uint8 .* got float32"),
        ("float labels", r"train_labels must hold integer class indices, got float64"),
        ("labels per image", r"test_labels must have shape \(35,\) or \(35, 1\), one label per image, got \(34, 1\)"),
        ("multi-label", r"train_labels must have shape \(140,\) or \(140, 1\)"),
        ("empty test", r"test_images and test_labels hold no examples"),
        ("empty train", r"train_images and train_labels hold no examples"),
        ("negative labels", r"val_labels lie in -1\.\.5; with 7 classes they must lie in 0\.\.6"),
        ("small test images", r"test_images are 1 x 8 x 8 \(C x H x W\) but train_images are 3 x 28 x 28"),
    ],
)
def test_a_malformed_file_is_one_line_naming_the_file_and_what_is_wrong(
    tmp_path: Path, change: str, message: str
) -> None:
    path = write_npz(tmp_path / "own.npz", broken(change))
    with pytest.raises(ValueError, match=message) as caught:
        load_dataset("npz", data_path=str(path))
    assert str(caught.value).startswith(f"data-path {path}: ") and "\n" not in str(caught.value)


def test_a_missing_or_unreadable_file_and_missing_options_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"data-path {tmp_path / 'absent.npz'}: file not found"):
        load_dataset("npz", data_path=str(tmp_path / "absent.npz"))
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match="text.npz: not a readable .npz"):
        load_dataset("npz", data_path=str(tmp_path / "text.npz"))
    with pytest.raises(ValueError, match="dataset='npz' needs data-path"):
        load_dataset("npz")
    with pytest.raises(ValueError, match="dataset='npz' takes its classes from the coordinator's data-path"):
        dataset_num_classes("npz")


def test_the_run_config_needs_data_path_exactly_with_dataset_npz(derma_file: Path) -> None:
    with pytest.raises(ValueError, match="data-path='' with dataset='npz': dataset='npz' needs data-path"):
        RunConfig.from_run_config({"dataset": "npz"})
    with pytest.raises(ValueError, match="data-path is read only with dataset='npz'"):
        RunConfig.from_run_config({"dataset": "digits", "data-path": str(derma_file)})
    config = RunConfig.from_run_config({"dataset": "npz", "data-path": str(derma_file), "partitioner": "iid"})
    split = federated_split(config.split_spec(3))
    assert sorted(np.concatenate(split.train_parts).tolist()) == list(range(SIZES["train"]))
    assert split.data.num_classes == CLASSES


def test_the_preflight_checks_the_file_before_anything_starts(derma_file: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    run_config = f"dataset='npz' data-path='{derma_file}' results-dir='{tmp_path}' partitioner='iid'"
    checked = preflight([run_config], 2, APP_DIR)
    assert any("2 shards of 70..70 training examples" in line for line in checked)

    bad = write_npz(tmp_path / "bad.npz", broken("float labels"))
    code = main(["check", "--run-config", run_config.replace(str(derma_file), str(bad)), "--num-clients", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    expected = f"data-path {bad}: train_labels must hold integer class indices, got float64"
    assert err[0] == f"dirichlet-fl check: error: {expected}"


def test_bench_accuracy_runs_on_an_npz_and_refuses_a_bad_one_before_any_run(
    derma_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ["--splits", "central", "--mechanisms", "none", "--seeds", "1", "--epsilons", "1", "--rounds", "1",
               "--workers", "1", "--batch-size", "16", "--learning-rate", "0.05"]
    out = tmp_path / "bench"
    assert main(["bench", "accuracy", "--dataset", "npz", "--data-path", str(derma_file), *options,
                 "--out", str(out)]) == 0
    with open(out / "table.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["status"] == "ok" and 0.0 <= float(row["accuracy"]) <= 1.0
    assert json.loads((out / "study.json").read_text())["data_path"] == str(derma_file.resolve())
    capsys.readouterr()

    bad = write_npz(tmp_path / "bad.npz", broken("empty test"))
    bad_out = tmp_path / "bad-bench"
    assert main(["bench", "accuracy", "--dataset", "npz", "--data-path", str(bad), *options,
                 "--out", str(bad_out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dirichlet-fl bench accuracy: error: data-path {bad}: test_images and test_labels hold no examples"]
    assert not (bad_out / "table.csv").exists()


def test_a_simulated_federation_trains_on_an_npz(derma_file: Path, tmp_path: Path) -> None:
    overrides = {"dataset": "npz", "data-path": str(derma_file), "partitioner": "iid", "num-server-rounds": 1,
                 "local-steps": 3, "model": "lenet", "results-dir": str(tmp_path), "run-name": "npz"}
    simulate(overrides, num_supernodes=2, ray_num_cpus=1)

    summary = json.loads((tmp_path / "npz" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 1
    assert isinstance(summary["final_accuracy"], float)
    assert [client["steps"] for client in summary["clients"]] == [3, 3]

