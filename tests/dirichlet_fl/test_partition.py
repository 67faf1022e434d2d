"""Partitions: exact cover, determinism, the label skew each partitioner promises, and clear errors."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from dirichlet_fl.data.partition import label_counts, partition_indices, plot_label_counts


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """3000 labels over 10 classes with unequal class sizes (class 9 twice as frequent as class 0)."""
    weights = np.linspace(1.0, 2.0, 10)
    return np.random.default_rng(0).choice(10, size=3000, p=weights / weights.sum())


def total_variation_from_global(labels: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    """Per client: total variation distance between its label distribution and the whole split's."""
    counts = label_counts(labels, parts, 10)
    overall = np.bincount(labels, minlength=10) / len(labels)
    return 0.5 * np.abs(counts / counts.sum(axis=1, keepdims=True) - overall).sum(axis=1)


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet", "pathological"])
def test_every_example_is_assigned_exactly_once_and_no_client_is_empty(labels: np.ndarray, partitioner: str) -> None:
    parts = partition_indices(labels, 12, partitioner, seed=3)

    assert len(parts) == 12 and min(len(part) for part in parts) > 0
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    assert all(part.dtype == np.int64 and np.all(np.diff(part) > 0) for part in parts)


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet", "pathological"])
def test_same_seed_same_split_other_seed_other_split(labels: np.ndarray, partitioner: str) -> None:
    first = partition_indices(labels, 10, partitioner, seed=1)
    again = partition_indices(labels, 10, partitioner, seed=1)
    other = partition_indices(labels, 10, partitioner, seed=2)

    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_iid_clients_have_equal_sizes(labels: np.ndarray) -> None:
    sizes = [len(part) for part in partition_indices(labels, 7, "iid")]
    assert max(sizes) - min(sizes) <= 1


def test_large_beta_is_near_iid_and_small_beta_is_skewed(labels: np.ndarray) -> None:
    near_iid = total_variation_from_global(labels, partition_indices(labels, 10, "dirichlet", beta=1e5))
    skewed = total_variation_from_global(labels, partition_indices(labels, 10, "dirichlet", beta=0.1))

    # beta=1e5: every client's label distribution within 0.02 (total variation) of the global one;
    # beta=0.1: on average more than 0.4 away (measured 0.67-0.72 over seeds 0-2).
    assert near_iid.max() < 0.02
    assert skewed.mean() > 0.4


def test_dirichlet_respects_min_partition_size(labels: np.ndarray) -> None:
    parts = partition_indices(labels, 20, "dirichlet", beta=0.3, min_partition_size=40, seed=5)
    assert min(len(part) for part in parts) >= 40


def test_pathological_clients_hold_exactly_k_classes(labels: np.ndarray) -> None:
    counts = label_counts(labels, partition_indices(labels, 10, "pathological", classes_per_client=3), 10)
    np.testing.assert_array_equal((counts > 0).sum(axis=1), np.full(10, 3))
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(labels, minlength=10))


def test_label_counts_match_the_parts(labels: np.ndarray) -> None:
    parts = partition_indices(labels, 5, "dirichlet", seed=0)
    counts = label_counts(labels, parts, 10)

    assert counts.shape == (5, 10)
    np.testing.assert_array_equal(counts.sum(axis=1), [len(part) for part in parts])
    np.testing.assert_array_equal(counts[2], np.bincount(labels[parts[2]], minlength=10))
    with pytest.raises(ValueError, match="num_classes=9 must exceed every label"):
        label_counts(labels, parts, 9)


def write_sites(path: Path, rows: list[tuple[int, str]], header: str = "index,site") -> str:
    path.write_text("\n".join([header, *(f"{index},{site}" for index, site in rows)]) + "\n")
    return str(path)


def test_natural_sites_become_clients_in_sorted_order(tmp_path: Path) -> None:
    labels = np.arange(6) % 3
    site_file = write_sites(tmp_path / "s.csv", [(0, "10"), (1, "2"), (2, "10"), (3, "2"), (4, "3"), (5, "10")])

    parts = partition_indices(labels, 3, "natural", site_file=site_file)

    assert [part.tolist() for part in parts] == [[1, 3], [4], [0, 2, 5]]  # sites 2, 3, 10: numeric order
    named = write_sites(tmp_path / "n.csv", [(0, "b"), (1, "a"), (2, "b"), (3, "a"), (4, "c"), (5, "a")])
    by_name = partition_indices(labels, 3, "natural", site_file=named)
    assert [part.tolist() for part in by_name] == [[1, 3, 5], [0, 2], [4]]


@pytest.mark.parametrize(
    ("rows", "num_clients", "message"),
    [
        ([(0, "a"), (1, "a"), (7, "b")], 2, r"indices \[7\] are outside \[0, 3\]"),
        ([(0, "a"), (1, "a"), (1, "b"), (2, "b"), (3, "b")], 2, r"indices \[1\] are listed more than once"),
        ([(0, "a"), (3, "b")], 2, r"2 of 4 training examples are not listed \(e.g. indices \[1, 2\]\)"),
        (
            [(0, "a"), (1, "b"), (2, "c"), (3, "c")],
            2,
            r"num_clients=2 but site_file=.* has 3 sites \(a, b, c\); set num_clients=3",
        ),
    ],
)
def test_natural_rejects_bad_site_files(tmp_path: Path, rows: list, num_clients: int, message: str) -> None:
    site_file = write_sites(tmp_path / "s.csv", rows)
    with pytest.raises(ValueError, match=message):
        partition_indices(np.arange(4) % 2, num_clients, "natural", site_file=site_file)


def test_natural_needs_a_site_file_with_the_right_header(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="site_file is required for partitioner='natural'"):
        partition_indices(np.arange(4), 2, "natural")
    bad_header = write_sites(tmp_path / "h.csv", [(0, "a")], header="example,client")
    with pytest.raises(ValueError, match="header must be 'index,site'"):
        partition_indices(np.arange(4), 2, "natural", site_file=bad_header)
    with pytest.raises(FileNotFoundError):
        partition_indices(np.arange(4), 2, "natural", site_file=str(tmp_path / "absent.csv"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_clients": 0, "partitioner": "iid"}, r"num_clients=0 must be in \[1, 3000\]"),
        ({"num_clients": 3001, "partitioner": "iid"}, r"num_clients=3001 must be in \[1, 3000\]"),
        (
            {"num_clients": 5, "partitioner": "shards"},
            "partitioner='shards' is invalid: choose one of iid, dirichlet, pathological, natural",
        ),
        ({"num_clients": 5, "partitioner": "dirichlet", "beta": 0.0}, "beta=0.0 must be a finite number > 0"),
        ({"num_clients": 5, "partitioner": "dirichlet", "beta": -1.0}, "beta=-1.0 must be a finite number > 0"),
        (
            {"num_clients": 5, "partitioner": "dirichlet", "min_partition_size": 601},
            r"min_partition_size=601 must be in \[1, 600\]",
        ),
        ({"num_clients": 5, "partitioner": "pathological", "classes_per_client": 0}, r"classes_per_client=0 must"),
        ({"num_clients": 5, "partitioner": "pathological", "classes_per_client": 11}, r"=11 must be in \[1, 10\]"),
    ],
)
def test_invalid_parameters_are_named_with_their_valid_range(labels: np.ndarray, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        partition_indices(labels, **kwargs)


def test_impossible_splits_say_what_to_change(labels: np.ndarray) -> None:
    expected = "no draw with beta=0.01 gave all num_clients=100 clients at least min_partition_size=25"
    with pytest.raises(ValueError, match=expected):
        partition_indices(labels, 100, "dirichlet", beta=0.01, min_partition_size=25)
    with pytest.raises(ValueError, match=r"classes \[.*\] .* go to no client; use num_clients >= 10"):
        partition_indices(labels, 4, "pathological", classes_per_client=2)
    few = np.array([0] * 50 + [1] * 2)
    with pytest.raises(ValueError, match="partitioner='pathological': cannot give num_clients=6"):
        partition_indices(few, 6, "pathological", classes_per_client=2)


def test_plot_label_counts_writes_a_png(tmp_path: Path, labels: np.ndarray) -> None:
    for clients in (5, 60):  # annotated cells, then too many cells to annotate
        counts = label_counts(labels, partition_indices(labels, clients, "iid"), 10)
        path = tmp_path / "plots" / f"counts{clients}.png"
        plot_label_counts(counts, str(path), f"{clients} clients")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def flwr_datasets_split(labels: np.ndarray, num_clients: int, partitioner: str, seed: int, beta: float = 0.5,
                        min_partition_size: int = 1) -> tuple[list[np.ndarray], int]:
    """flwr-datasets' own IidPartitioner (on the table shuffled by datasets) or DirichletPartitioner, run on a
    (label, index) table; returns each partition's sorted indices and how many draws it rejected."""
    import datasets
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner

    table = datasets.Dataset.from_dict({"label": labels, "index": np.arange(len(labels))})
    if partitioner == "iid":
        reference = IidPartitioner(num_partitions=num_clients)
        reference.dataset = table.shuffle(seed=seed)
    else:
        reference = DirichletPartitioner(num_partitions=num_clients, partition_by="label", alpha=beta,
                                         min_partition_size=min_partition_size, self_balancing=False, seed=seed)
        reference.dataset = table
    with warnings.catch_warnings(record=True) as rejected:
        warnings.simplefilter("always")
        parts = [np.sort(np.asarray(reference.load_partition(i)["index"], dtype=np.int64)) for i in range(num_clients)]
    return parts, len(rejected)


@pytest.mark.parametrize(("examples", "num_clients", "seed"), [
    (3000, 1, 0), (3000, 7, 1), (3000, 10, 42), (3000, 33, 0), (3000, 33, 1), (300, 300, 42),  # one example each
])
def test_iid_is_flwr_datasets_split_draw_for_draw(labels: np.ndarray, examples: int, num_clients: int,
                                                  seed: int) -> None:
    ours = partition_indices(labels[:examples], num_clients, "iid", seed=seed)
    reference, _ = flwr_datasets_split(labels[:examples], num_clients, "iid", seed)
    assert len(ours) == len(reference) and all(np.array_equal(a, b) for a, b in zip(ours, reference))


@pytest.mark.parametrize(("beta", "num_clients", "min_partition_size", "seed", "redraws"), [
    (0.5, 10, 1, 0, 0), (0.05, 10, 1, 3, 0), (1.0, 33, 1, 42, 0), (100.0, 7, 1, 1, 0), (0.5, 1, 1, 0, 0),
    (0.3, 20, 40, 1, 2), (0.1, 10, 60, 0, 4), (0.1, 10, 60, 1, 3),  # redrawn until every client holds enough
])
def test_dirichlet_is_flwr_datasets_split_draw_for_draw(
    labels: np.ndarray, beta: float, num_clients: int, min_partition_size: int, seed: int, redraws: int
) -> None:
    ours = partition_indices(labels, num_clients, "dirichlet", beta=beta, seed=seed,
                             min_partition_size=min_partition_size)
    reference, rejected = flwr_datasets_split(labels, num_clients, "dirichlet", seed, beta, min_partition_size)
    assert rejected == redraws  # the redraw path is the one under test where redraws > 0
    assert len(ours) == len(reference) and all(np.array_equal(a, b) for a, b in zip(ours, reference))


def test_dirichlet_matches_flwr_datasets_where_a_class_is_absent(labels: np.ndarray) -> None:
    """Classes are drawn for in sorted order of those present: a missing class shifts every later draw."""
    present = labels[labels != 3]
    ours = partition_indices(present, 5, "dirichlet", beta=0.5, seed=2)
    reference, _ = flwr_datasets_split(present, 5, "dirichlet", 2)
    assert all(np.array_equal(a, b) for a, b in zip(ours, reference, strict=True))


def test_dirichlet_gives_up_where_flwr_datasets_does(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="after 10 attempts|max number of attempts"):
        flwr_datasets_split(labels, 100, "dirichlet", 0, beta=0.01, min_partition_size=25)
    with pytest.raises(ValueError, match="11 draws, as flwr-datasets makes"):
        partition_indices(labels, 100, "dirichlet", beta=0.01, min_partition_size=25)


def test_iid_and_dirichlet_import_neither_flwr_datasets_nor_datasets() -> None:
    """Each simulated client computes its split: these two cost it no import of flwr-datasets (nor its plots)."""
    code = ("import sys, numpy as np\n"
            "from dirichlet_fl.data.partition import partition_indices\n"
            "labels = np.arange(100) % 10\n"
            "partition_indices(labels, 5, 'iid'); partition_indices(labels, 5, 'dirichlet')\n"
            "print(sorted(m for m in ('flwr_datasets', 'datasets', 'matplotlib') if m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[2])
    assert found.stdout.strip() == "[]", found.stderr[-2000:]
