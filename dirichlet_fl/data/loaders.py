"""Image data sets as normalised CPU tensors, read from their real on-disk formats.

Each loader goes through the data set's own reader (torchvision's dataset classes, medmnist's classes,
the IDX format, scikit-learn's embedded digits) and returns an `ImageData`: float32 N x C x H x W
tensors normalised per channel with the training split's mean and standard deviation, int64 labels.
Loading is offline unless `download=True`: a missing file raises FileNotFoundError naming the file,
the directory it belongs in and how to fetch it. Tensors stay on the CPU; the client moves them to
its device once.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dirichlet_fl.config_groups import SYNTHETIC
from dirichlet_fl.data.image_data import ImageData, Split, to_image_data
from dirichlet_fl.data.data_file import check_labels, read_npz_splits
from dirichlet_fl.data.stratified import stratified_split

if TYPE_CHECKING:
    from medmnist.dataset import MedMNIST2D

DEFAULT_DATA_ROOT = Path.home() / ".cache" / "dirichlet-fl" / "data"
SPLIT_SEED = 0
"""Seed of the stratified 80/20 train/test splits made here (digits, and mnist-idx with t10k files only)."""
TEST_FRACTION = 0.2
MEDMNIST_TASKS = ("multi-class", "binary-class")
"""MedMNIST tasks with one class label per example: the only ones a softmax over classes can learn."""
TORCHVISION_MNIST = ("mnist", "fashionmnist")
BUILTIN_DATASETS = ("digits", "mnist-idx", *TORCHVISION_MNIST, "cifar10", "svhn")
NPZ = "npz"
"""The data set of one .npz file in medmnist's layout (a site's data-file format), at data-path."""
"""The data sets read without medmnist. torchvision and medmnist are imported by the loader that needs them:
they cost about 0.7 s and 300 MB in every process that imports this module (the server, each Ray actor, the
CLI), most of which only ever loads one data set. scikit-learn is never imported: its digits file is read
directly and the stratified splits are numpy's (dirichlet_fl/data/stratified.py)."""


@functools.cache
def medmnist_2d() -> tuple[str, ...]:
    """The 2D MedMNIST flags, sorted (imports medmnist)."""
    import medmnist
    from medmnist.dataset import MedMNIST2D

    return tuple(
        sorted(
            flag
            for flag, info in medmnist.INFO.items()
            if issubclass(getattr(medmnist, info["python_class"]), MedMNIST2D)
        )
    )


def dataset_names() -> tuple[str, ...]:
    """Every name `load_dataset` accepts (imports medmnist for its list of sets)."""
    import medmnist

    medmnist_sets = (flag for flag in medmnist_2d() if medmnist.INFO[flag]["task"] in MEDMNIST_TASKS)
    return (*BUILTIN_DATASETS, NPZ, SYNTHETIC, *medmnist_sets)


def load_dataset(
    name: str, data_root: str | None = None, *, download: bool = False, size: int = 28, data_path: str | None = None
) -> ImageData:
    """Load data set `name` (see dataset_names()) from `data_root` (default DEFAULT_DATA_ROOT).

    Layouts under data_root are the readers' own: torchvision's `MNIST/raw/`, `FashionMNIST/raw/`,
    `cifar-10-batches-py/`, SVHN's `train_32x32.mat`/`test_32x32.mat`, medmnist's `<flag>[_size].npz`;
    for `mnist-idx`, data_root is the folder holding the IDX files. `size` picks a MedMNIST resolution
    (28, 64, 128 or 224); the other sets have one native size and accept only the default. `npz` reads
    the one file `data_path` instead (_load_npz).
    """
    key = name.lower()
    root = Path(data_root).expanduser() if data_root is not None else DEFAULT_DATA_ROOT
    if key == NPZ:
        return _load_npz(data_path, download, size)
    if key == SYNTHETIC:
        raise ValueError("dataset='synthetic' is generated one client at a time (dirichlet_fl.data.synthetic): it has no "
                         "whole data set to load")
    if key not in BUILTIN_DATASETS:
        if key in medmnist_2d():
            return _load_medmnist(key, root, download, size)
        raise ValueError(f"dataset={name!r} is unknown; valid names: {', '.join(dataset_names())}")
    if size != 28:
        raise ValueError(
            f"size={size} applies to MedMNIST sets only; {key} has one native size, leave size at 28"
        )
    if key == "digits":
        return _load_digits()
    if key == "mnist-idx":
        return _load_mnist_idx(root, download)
    if key in TORCHVISION_MNIST:
        return _load_torchvision_mnist(key, root, download)
    if key == "cifar10":
        return _load_cifar10(root, download)
    return _load_svhn(root, download)


def _missing_file(name: str, path: Path, alternative: str | None = None) -> FileNotFoundError:
    """The error for an absent data file: which file, which directory, and how to get it."""
    also = f" (or '{alternative}')" if alternative else ""
    return FileNotFoundError(
        f"{name}: missing file '{path.name}'{also} in directory '{path.parent}'. Put the official file "
        f"there, or fetch it with download=True (run config data-download=true, CLI --download)."
    )


def _load_digits() -> ImageData:
    """scikit-learn's embedded 8x8 digits (values 0..16), split 80/20 stratified with SPLIT_SEED. The file is read
    where scikit-learn keeps it, as its load_digits reads it, without importing scikit-learn (about 1.1 s a
    process)."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"digits: scikit-learn's embedded file datasets/data/digits.csv.gz was not found "
                                f"(looked in {path}); install scikit-learn (bash scripts/setup.sh)")
    table = np.loadtxt(path, delimiter=",")
    images, labels = table[:, :-1].reshape(-1, 1, 8, 8), table[:, -1].astype(int)
    train, test = stratified_split(labels, TEST_FRACTION, SPLIT_SEED)
    splits = {"train": (images[train], labels[train]), "test": (images[test], labels[test])}
    return to_image_data("digits", splits, tuple(str(c) for c in range(10)), 16.0)


def _find_idx(folder: Path, stem: str) -> Path | None:
    """The IDX file `stem` in `folder`, uncompressed or gzip-compressed, or None."""
    for path in (folder / stem, folder / f"{stem}.gz"):
        if path.is_file():
            return path
    return None


def _read_idx(path: Path) -> np.ndarray:
    """Read an unsigned-byte IDX file (MNIST's format), gzip-compressed when its name ends in .gz."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic number {data[:4].hex()}, expected 000008xx)")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != math.prod(shape):
        raise ValueError(f"{path}: header announces {shape} = {math.prod(shape)} bytes, file holds {body.size}")
    return body.reshape(shape)


def _read_idx_pair(folder: Path, prefix: str) -> Split:
    """Images (as N x 1 x H x W) and labels of the IDX pair `<prefix>-images-idx3-ubyte[.gz]`, `<prefix>-labels-...`."""
    arrays = []
    for stem in (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"):
        path = _find_idx(folder, stem)
        if path is None:
            raise FileNotFoundError(
                f"mnist-idx: missing file '{stem}' (or '{stem}.gz') in directory '{folder}'. Put the MNIST "
                f"IDX files there (the t10k pair alone is enough: it is then split 80/20), or use dataset "
                f"'mnist' with download=True (run config data-download=true, CLI --download)."
            )
        arrays.append(_read_idx(path))
    images, labels = arrays
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(
            f"mnist-idx: {prefix} images {images.shape} and labels {labels.shape} in '{folder}' do not pair up"
        )
    return images[:, None], labels


def _load_mnist_idx(folder: Path, download: bool) -> ImageData:
    """MNIST IDX files in `folder`; with only the t10k pair, a stratified 80/20 split of it."""
    if download:
        raise ValueError("download=True: mnist-idx reads local IDX files only; use dataset 'mnist' to download")
    test = _read_idx_pair(folder, "t10k")
    has_train = any(_find_idx(folder, f"train-{kind}") for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"))
    if has_train:
        splits = {"train": _read_idx_pair(folder, "train"), "test": test}
    else:
        train, held_out = stratified_split(test[1], TEST_FRACTION, SPLIT_SEED)
        splits = {"train": (test[0][train], test[1][train]), "test": (test[0][held_out], test[1][held_out])}
    return to_image_data("mnist-idx", splits, tuple(str(d) for d in range(10)), 255.0)


def _ensure_decompressed(name: str, path: Path) -> None:
    """Make the uncompressed IDX file torchvision's MNIST reads exist, from its official .gz if needed.

    torchvision's download leaves both `X.gz` and the decompressed `X` in `<root>/<Class>/raw`, and its
    reader opens only `X`; decompressing an official `X.gz` the same way lets a copied .gz load too.
    """
    if path.is_file():
        return
    archive = path.with_name(f"{path.name}.gz")
    if not archive.is_file():
        raise _missing_file(name, path, archive.name)
    from torchvision.datasets.utils import extract_archive

    extract_archive(str(archive), str(path.parent))


def _load_torchvision_mnist(key: str, root: Path, download: bool) -> ImageData:
    """MNIST or FashionMNIST through torchvision's class, from `<root>/<Class>/raw/`."""
    from torchvision.datasets import MNIST, FashionMNIST

    cls = MNIST if key == "mnist" else FashionMNIST
    if download:
        cls(str(root), train=True, download=True)
    for resource, _ in cls.resources:
        _ensure_decompressed(key, root / cls.__name__ / "raw" / Path(resource).name.removesuffix(".gz"))
    train, test = cls(str(root), train=True), cls(str(root), train=False)
    splits = {
        "train": (train.data.numpy()[:, None], train.targets.numpy()),
        "test": (test.data.numpy()[:, None], test.targets.numpy()),
    }
    return to_image_data(key, splits, tuple(cls.classes), 255.0)


@functools.cache
def _cifar10_files() -> Any:
    """torchvision's CIFAR10 reader with its md5 check of LOCAL files replaced by an existence check.

    Why: torchvision refuses any batch file whose md5 differs from the official one, so files in the
    official pickle format but with other content (test fixtures, re-packed copies) cannot load. This
    override is the only change: the files are still parsed by torchvision's own code (a corrupt file
    fails to unpickle or reshape), and `download=True` still verifies the downloaded archive's md5.
    A class built on first use, so that torchvision is imported only by who reads CIFAR10.
    """
    from torchvision.datasets import CIFAR10

    class CIFAR10Files(CIFAR10):
        meta = {**CIFAR10.meta, "md5": None}

        def _check_integrity(self) -> bool:
            folder = Path(self.root) / self.base_folder
            return all((folder / filename).is_file() for filename, _ in self.train_list + self.test_list)

    return CIFAR10Files


def _load_cifar10(root: Path, download: bool) -> ImageData:
    """CIFAR10 from torchvision's `<root>/cifar-10-batches-py/` pickle batches."""
    reader = _cifar10_files()
    if download:
        reader(str(root), train=True, download=True)
    folder = root / reader.base_folder
    for filename, _ in reader.train_list + reader.test_list + [(reader.meta["filename"], None)]:
        if not (folder / filename).is_file():
            raise _missing_file("cifar10", folder / filename)
    train, test = reader(str(root), train=True), reader(str(root), train=False)
    splits = {
        "train": (train.data.transpose(0, 3, 1, 2), np.asarray(train.targets)),
        "test": (test.data.transpose(0, 3, 1, 2), np.asarray(test.targets)),
    }
    return to_image_data("cifar10", splits, tuple(train.classes), 255.0)


@functools.cache
def _svhn_files() -> Any:
    """torchvision's SVHN reader with its md5 check of the LOCAL .mat file replaced by an existence check.

    Same reason and scope as `_cifar10_files`: the .mat is still read by torchvision's code (scipy), and
    `download=True` still verifies the downloaded file's md5.
    """
    from torchvision.datasets import SVHN

    class SVHNFiles(SVHN):
        def _check_integrity(self) -> bool:
            return (Path(self.root) / self.filename).is_file()

    return SVHNFiles


def _load_svhn(root: Path, download: bool) -> ImageData:
    """SVHN (cropped digits) from torchvision's `<root>/train_32x32.mat` and `<root>/test_32x32.mat`."""
    reader = _svhn_files()
    splits = {}
    for split in ("train", "test"):
        if download:
            reader(str(root), split=split, download=True)
        path = root / reader.split_list[split][1]
        if not path.is_file():
            raise _missing_file("svhn", path)
        dataset = reader(str(root), split=split)
        splits[split] = (dataset.data, dataset.labels)
    return to_image_data("svhn", splits, tuple(str(d) for d in range(10)), 255.0)


def _load_medmnist(flag: str, root: Path, download: bool, size: int) -> ImageData:
    """A 2D MedMNIST set through medmnist's own class, from `<root>/<flag>[_<size>].npz`, with its val split."""
    import medmnist
    from medmnist.dataset import MedMNIST2D

    info = medmnist.INFO[flag]
    if info["task"] not in MEDMNIST_TASKS:
        raise ValueError(
            f"dataset={flag!r}: its MedMNIST task is '{info['task']}', but training here needs one class "
            f"label per example ({' or '.join(MEDMNIST_TASKS)}); pick another MedMNIST set, e.g. dermamnist"
        )
    sizes = tuple(MedMNIST2D.available_sizes)
    if size not in sizes:
        raise ValueError(f"size={size} is not a MedMNIST size; valid sizes: {', '.join(map(str, sizes))}")
    cls = getattr(medmnist, info["python_class"])
    if download:
        root.mkdir(parents=True, exist_ok=True)
        cls(split="train", root=str(root), download=True, size=size)
    path = root / f"{flag}{'' if size == 28 else f'_{size}'}.npz"
    if not path.is_file():
        raise _missing_file(flag, path)
    splits = {split: _medmnist_split(cls(split=split, root=str(root), size=size)) for split in ("train", "val", "test")}
    class_names = tuple(info["label"][str(i)] for i in range(len(info["label"])))
    return to_image_data(flag, splits, class_names, 255.0)


def _medmnist_split(dataset: MedMNIST2D) -> Split:
    """Images as N x C x H x W and labels flattened from medmnist's N x 1."""
    images, labels = dataset.imgs, dataset.labels
    if labels.ndim != 2 or labels.shape[1] != 1:
        raise ValueError(f"{dataset.flag} {dataset.split}: expected labels of shape N x 1, got {labels.shape}")
    images = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
    return images, labels.reshape(-1)


def _load_npz(data_path: str | None, download: bool, size: int) -> ImageData:
    """The data set in the .npz at `data_path`, in medmnist's layout (dirichlet_fl.data.data_file): its classes
    are a MedMNIST set's when the file is named like one (`dermamnist.npz`, `dermamnist_64.npz`), else
    0..max label. Every error is one ValueError line naming the file and what is wrong."""
    if not data_path:
        raise ValueError("dataset='npz' needs data-path: an .npz in medmnist's layout (train_images, train_labels, "
                         "test_images, test_labels)")
    if download or size != 28:
        raise ValueError(f"data-path {data_path}: dataset='npz' reads this local file at its own size; leave "
                         "data-download off (and size at 28)")
    path = Path(data_path).expanduser()
    splits = read_npz_splits(path, "data-path", require_test=True)
    flag = path.stem.lower().split("_")[0]
    if flag in medmnist_2d():
        import medmnist

        labels = medmnist.INFO[flag]["label"]
        class_names = tuple(labels[str(i)] for i in range(len(labels)))
    else:
        class_names = tuple(str(c) for c in range(1 + max(int(y.max()) for _, y in splits.values() if y.size)))
    check_labels(path, "data-path", splits, len(class_names))
    return to_image_data(path.stem, splits, class_names, 255.0)


def dataset_num_classes(name: str) -> int:
    """How many classes data set `name` has, without reading its files (a site trains the run's model)."""
    key = name.lower()
    if key == NPZ:
        raise ValueError("dataset='npz' takes its classes from the coordinator's data-path file, which a site does "
                         "not hold: with sites' own data files, name the run's data set (e.g. dataset='dermamnist')")
    if key in BUILTIN_DATASETS or key == SYNTHETIC:
        return 10  # digits, MNIST (IDX and torchvision), Fashion-MNIST, CIFAR10 and SVHN all have ten
    if key not in medmnist_2d():
        raise ValueError(f"dataset={name!r} is unknown; valid names: {', '.join(dataset_names())}")
    import medmnist

    return len(medmnist.INFO[key]["label"])
