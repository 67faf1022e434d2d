"""`dirichlet-fl partition`, run through an argparse parser built the way the CLI builds it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from cli.partition import add_parser
from dirichlet_fl.data.loaders import load_dataset
from dirichlet_fl.data.partition import label_counts, partition_indices


def run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dirichlet-fl")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["partition", *argv])
    return args.func(args)


def test_table_shows_every_client_and_the_totals(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(["--num-clients", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()

    assert lines[0].startswith("digits, train split: 1437 examples over 4 clients, partitioner iid")
    assert lines[1].split() == ["client", "examples", *map(str, range(10))]
    assert [line.split()[0] for line in lines[2:7]] == ["0", "1", "2", "3", "total"]
    assert lines[6].split()[1] == "1437"


def test_json_matches_the_library_partition(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--partitioner", "dirichlet", "--beta", "0.3", "--num-clients", "6", "--seed", "4", "--json"]
    assert run_command(argv) == 0
    report = json.loads(capsys.readouterr().out)

    labels = load_dataset("digits").train_y.numpy()
    parts = partition_indices(labels, 6, "dirichlet", beta=0.3, seed=4)
    expected = label_counts(labels, parts, 10)
    assert {key: report[key] for key in ("dataset", "partitioner", "seed")} == {
        "dataset": "digits",
        "partitioner": "dirichlet",
        "seed": 4,
    }
    assert [client["id"] for client in report["clients"]] == list(range(6))
    assert [client["num_examples"] for client in report["clients"]] == [len(part) for part in parts]
    assert np.array_equal([client["label_counts"] for client in report["clients"]], expected)


def test_natural_partition_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sites = tmp_path / "sites.csv"
    sites.write_text("index,site\n" + "".join(f"{i},{'north' if i < 500 else 'south'}\n" for i in range(1437)))
    plot = tmp_path / "counts.png"

    argv = ["--partitioner", "natural", "--site-file", str(sites), "--num-clients", "2", "--json", "--plot", str(plot)]
    assert run_command(argv) == 0

    report = json.loads(capsys.readouterr().out)
    assert [client["num_examples"] for client in report["clients"]] == [500, 937]
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--num-clients", "0"], "num_clients=0 must be in [1, 1437]"),
        (["--partitioner", "dirichlet", "--beta", "-2"], "beta=-2.0 must be a finite number > 0"),
        (["--partitioner", "pathological", "--classes-per-client", "12"], "classes_per_client=12 must be in [1, 10]"),
        (["--dataset", "nope"], "dataset='nope' is unknown; valid names: digits"),
        (["--partitioner", "natural", "--num-clients", "2"], "site_file is required"),
    ],
)
def test_invalid_input_exits_2_with_one_error_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    assert run_command(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("dirichlet-fl partition: error: ") and fragment in captured.err


def test_missing_data_file_exits_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(["--dataset", "cifar10", "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'data_batch_1'" in err and str(tmp_path / "cifar-10-batches-py") in err and "Traceback" not in err


def test_unknown_partitioner_is_an_argparse_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_command(["--partitioner", "shards"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'shards'" in capsys.readouterr().err
