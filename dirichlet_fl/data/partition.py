"""Split a training set's example indices among federated clients, and show who holds which labels.

`iid`, `dirichlet` and `pathological` are flwr-datasets' partitioners, so the splits are the ones the Flower
literature means by those names: `pathological` runs flwr-datasets' own (on a table of labels and example
indices, whose index column is read back); `iid` and `dirichlet`, which every simulated client computes,
are flwr-datasets 0.6.1's algorithms in numpy, draw for draw (tests/dirichlet_fl/test_partition.py checks
them against flwr-datasets' own), because importing flwr-datasets (with datasets, pyarrow, pandas and its
plotting: seaborn, matplotlib) costs each client process (a Ray actor, a SuperNode's ClientApp) more CPU
than its whole split. `natural` reads a site assignment from a CSV file. Every result assigns each training
example to exactly one client, leaves no client empty and is fixed by the seed.
"""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from privacy.checks import check_choice

if TYPE_CHECKING:
    from flwr_datasets.partitioner import Partitioner

PARTITIONERS = ("iid", "dirichlet", "pathological", "natural")
ANNOTATE_MAX_CELLS = 400
"""Heat maps with at most this many cells get their counts written in each cell."""
ANNOTATE_MAX_TICKS = 40
"""Axes with at most this many clients (classes) get one tick per client (class)."""


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    partitioner: str,
    *,
    beta: float = 0.5,
    classes_per_client: int = 2,
    seed: int = 0,
    site_file: str | None = None,
    min_partition_size: int = 1,
) -> list[np.ndarray]:
    """Indices into `labels` (the training split) held by each of `num_clients` clients, each sorted.

    partitioner: `iid` (shuffled with `seed`, equal sizes), `dirichlet` (label proportions per client
    drawn from Dirichlet(beta); every client gets at least `min_partition_size` examples; the default,
    1, is what flwr-datasets' redrawing can still satisfy at ~8 examples per client, e.g. 1,000 clients on
    8,000 examples with beta 0.5, where 2 already fails; clients left with too few examples for the run's
    batch size sit out instead, see dirichlet_fl.client_plan.too_small_to_train),
    `pathological` (each client holds `classes_per_client` classes), `natural` (`site_file`: CSV with
    header `index,site`, one row per training example; sites become clients in sorted order).
    """
    labels = _as_labels(labels)
    check_choice("partitioner", partitioner, PARTITIONERS)
    if not 1 <= num_clients <= len(labels):
        raise ValueError(f"num_clients={num_clients} must be in [1, {len(labels)}] (the number of training examples)")
    if partitioner == "natural":
        parts = _natural_parts(labels, num_clients, site_file)
    elif partitioner == "iid":
        parts = _iid_parts(len(labels), num_clients, seed)
    elif partitioner == "dirichlet":
        parts = _dirichlet_parts(labels, num_clients, beta, min_partition_size, seed)
    else:
        parts = _pathological_parts(labels, num_clients, classes_per_client, seed)
    _check_exact_cover(parts, len(labels))
    return parts


def _as_labels(labels: np.ndarray) -> np.ndarray:
    """`labels` as a non-empty 1-D int64 array of non-negative class indices."""
    array = np.asarray(labels)
    if array.ndim != 1 or array.size == 0 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"labels must be a non-empty 1-D integer array, got dtype {array.dtype} shape {array.shape}")
    if array.min() < 0:
        raise ValueError(f"labels must be >= 0, found {array.min()}")
    return array.astype(np.int64)


def _flwr_parts(labels: np.ndarray, partitioner: Partitioner) -> list[np.ndarray]:
    """Run a flwr-datasets partitioner on a (label, index) table and read back each partition's indices."""
    import datasets  # flwr-datasets and datasets: imported on use

    partitioner.dataset = datasets.Dataset.from_dict({"label": labels, "index": np.arange(len(labels))})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # retries and unused classes: checked by the callers
        return [
            np.sort(np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64))
            for i in range(partitioner.num_partitions)
        ]


def _iid_parts(num_examples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """flwr-datasets' IidPartitioner on a table shuffled with `seed`: datasets' Dataset.shuffle permutes by
    numpy's default_rng(seed), and the partitioner cuts contiguous shards, the first `num_examples mod
    num_clients` one example longer (datasets' Dataset.shard)."""
    order = np.random.default_rng(seed).permutation(num_examples)
    return [np.sort(shard) for shard in np.array_split(order, num_clients)]


DIRICHLET_DRAWS = 11
"""flwr-datasets' DirichletPartitioner draws at most this often (a first draw and 10 redraws) before it gives up."""


def _dirichlet_parts(
    labels: np.ndarray, num_clients: int, beta: float, min_partition_size: int, seed: int
) -> list[np.ndarray]:
    """flwr-datasets' DirichletPartitioner (alpha=beta, no self-balancing), with errors that name the fix: per
    class in sorted order, proportions drawn from Dirichlet(beta, ..., beta) by numpy's default_rng(seed) cut
    the class's indices in order; the whole draw is repeated while a client holds under `min_partition_size`."""
    if not (np.isfinite(beta) and beta > 0):
        raise ValueError(f"beta={beta} must be a finite number > 0 (small: skewed labels; large: near IID)")
    if not 1 <= min_partition_size <= len(labels) // num_clients:
        raise ValueError(
            f"min_partition_size={min_partition_size} must be in [1, {len(labels) // num_clients}] "
            f"({len(labels)} examples over num_clients={num_clients})"
        )
    rng = np.random.default_rng(seed)
    alpha = np.full(num_clients, float(beta))
    by_class = [np.nonzero(labels == k)[0] for k in np.unique(labels)]
    for _ in range(DIRICHLET_DRAWS):
        pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for indices in by_class:
            cuts = (np.cumsum(rng.dirichlet(alpha)) * len(indices)).astype(int)[:-1]
            for client, piece in enumerate(np.split(indices, cuts)):
                pieces[client].append(piece)
        parts = [np.sort(np.concatenate(client_pieces)) for client_pieces in pieces]
        if min(len(part) for part in parts) >= min_partition_size:
            return parts
    raise ValueError(
        f"partitioner='dirichlet': no draw with beta={beta} gave all num_clients={num_clients} clients "
        f"at least min_partition_size={min_partition_size} examples ({DIRICHLET_DRAWS} draws, as flwr-datasets "
        f"makes); raise beta, lower num_clients or lower min_partition_size"
    )


def _pathological_parts(labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int) -> list[np.ndarray]:
    """flwr-datasets' PathologicalPartitioner; client i's first class is i mod the number of classes."""
    present = np.unique(labels)
    if not 1 <= classes_per_client <= len(present):
        raise ValueError(
            f"classes_per_client={classes_per_client} must be in [1, {len(present)}] (classes present in labels)"
        )
    from flwr_datasets.partitioner import PathologicalPartitioner

    partitioner = PathologicalPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        num_classes_per_partition=classes_per_client,
        class_assignment_mode="first-deterministic",
        seed=seed,
    )
    try:
        parts = _flwr_parts(labels, partitioner)
    except ValueError as error:
        raise ValueError(
            f"partitioner='pathological': cannot give num_clients={num_clients} clients "
            f"classes_per_client={classes_per_client} classes each (flwr-datasets: {error}); "
            f"lower num_clients or classes_per_client"
        ) from error
    unassigned = np.setdiff1d(present, labels[np.concatenate(parts)])
    if unassigned.size:
        raise ValueError(
            f"partitioner='pathological': with num_clients={num_clients} and classes_per_client="
            f"{classes_per_client}, classes {unassigned.tolist()} ({np.isin(labels, unassigned).sum()} examples) "
            f"go to no client; use num_clients >= {len(present)} (the number of classes) or more classes_per_client"
        )
    return parts


def _read_site_file(site_file: str) -> tuple[np.ndarray, list[str]]:
    """(example indices, site ids) from a CSV with header `index,site`, one row per example."""
    with open(site_file, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [cell.strip() for cell in next(reader, [])]
        if header != ["index", "site"]:
            raise ValueError(f"site_file={site_file!r}: header must be 'index,site', got {','.join(header)!r}")
        rows = [row for row in reader if row]
    indices, sites = [], []
    for line, row in enumerate(rows, start=2):
        if len(row) != 2 or not row[0].strip().lstrip("-").isdigit() or not row[1].strip():
            raise ValueError(f"site_file={site_file!r} line {line}: expected '<integer index>,<site>', got {row}")
        indices.append(int(row[0]))
        sites.append(row[1].strip())
    return np.asarray(indices, dtype=np.int64), sites


def _natural_parts(labels: np.ndarray, num_clients: int, site_file: str | None) -> list[np.ndarray]:
    """One client per site of `site_file`, sites in sorted order (numeric when every site id is an integer)."""
    if site_file is None:
        raise ValueError("site_file is required for partitioner='natural': a CSV with header 'index,site'")
    indices, sites = _read_site_file(site_file)
    out_of_range = indices[(indices < 0) | (indices >= len(labels))]
    if out_of_range.size:
        raise ValueError(
            f"site_file={site_file!r}: indices {out_of_range[:5].tolist()} are outside [0, {len(labels) - 1}] "
            f"(the training split has {len(labels)} examples)"
        )
    values, counts = np.unique(indices, return_counts=True)
    if (counts > 1).any():
        repeated = values[counts > 1][:5].tolist()
        raise ValueError(f"site_file={site_file!r}: indices {repeated} are listed more than once")
    if len(values) != len(labels):
        missing = np.setdiff1d(np.arange(len(labels)), values)
        raise ValueError(
            f"site_file={site_file!r}: {len(missing)} of {len(labels)} training examples are not listed "
            f"(e.g. indices {missing[:5].tolist()}); give every training example a site"
        )
    numeric = all(site.lstrip("-").isdigit() for site in sites)
    order = sorted(set(sites), key=int if numeric else str)
    if len(order) != num_clients:
        raise ValueError(
            f"num_clients={num_clients} but site_file={site_file!r} has {len(order)} sites "
            f"({', '.join(order[:10])}{', ...' if len(order) > 10 else ''}); set num_clients={len(order)}"
        )
    site_of = np.asarray(sites)
    return [np.sort(indices[site_of == site]) for site in order]


def _check_exact_cover(parts: list[np.ndarray], num_examples: int) -> None:
    """Raise ValueError unless `parts` are non-empty and assign every example exactly once."""
    sizes = [len(part) for part in parts]
    if min(sizes) == 0:
        raise ValueError(f"client {sizes.index(0)} would get no examples; use fewer clients")
    assigned = np.sort(np.concatenate(parts))
    if len(assigned) != num_examples or not np.array_equal(assigned, np.arange(num_examples)):
        raise ValueError(
            f"the partition assigns {len(np.unique(assigned))} distinct of {num_examples} examples "
            f"({len(assigned)} assignments); every example must be assigned exactly once"
        )


def label_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Clients x classes matrix: entry (i, k) counts client i's examples of class k."""
    labels = _as_labels(labels)
    if labels.max() >= num_classes:
        raise ValueError(f"labels reach {labels.max()}; num_classes={num_classes} must exceed every label")
    return np.stack([np.bincount(labels[part], minlength=num_classes) for part in parts])


def plot_label_counts(counts: np.ndarray, path: str, title: str) -> None:
    """Write a heat map of `counts` (clients x classes) to `path`, counts written in cells when few."""
    clients, classes = counts.shape
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(min(2 + 0.5 * classes, 20), min(1.5 + 0.3 * clients, 20)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    figure.colorbar(image, ax=axes, label="examples")
    axes.set(title=title, xlabel="class", ylabel="client")
    if classes <= ANNOTATE_MAX_TICKS:
        axes.set_xticks(range(classes))
    if clients <= ANNOTATE_MAX_TICKS:
        axes.set_yticks(range(clients))
    if counts.size <= ANNOTATE_MAX_CELLS:
        threshold = counts.max() / 2
        for (client, label), value in np.ndenumerate(counts):
            colour = "black" if value > threshold else "white"
            axes.text(label, client, str(value), ha="center", va="center", fontsize=7, color=colour)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
