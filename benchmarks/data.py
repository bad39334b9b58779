"""Data sets that ship inside packages (no download at run time).

scikit-learn's digits and MNIST-1D come with Python packages; Fashion-MNIST comes with the Debian
package ``dataset-fashion-mnist`` (or any folder holding its four ``.gz`` files).
"""
import functools
import gzip
import os
import shutil
import sys
import sysconfig
import tempfile

import numpy as np

import mindspore.dataset as ds

__all__ = ["DataUnavailable", "digits_arrays", "mnist1d_arrays", "fashion_mnist_arrays",
           "fashion_mnist_missing", "FMNIST_FILES", "FMNIST_DEFAULT_DIR", "array_dataset", "STDLIB_TRAIN_FILES",
           "STDLIB_VALID_FILES", "stdlib_text_arrays", "stdlib_text_missing"]

FMNIST_DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


class DataUnavailable(FileNotFoundError):
    """A data set's files are not on this machine; the message says how to get them."""


def digits_arrays(test_fraction=0.2, seed=0):
    """scikit-learn's 8x8 digits (1797 images) as NCHW float32 in [0, 1] and int32 labels.

    Returns ``(x_train, y_train, x_test, y_test)``, a fixed stratified-by-shuffle split.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("the digits data set needs scikit-learn: pip install scikit-learn (the examples extra: pip install '.[examples]')") from err
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


@functools.lru_cache(maxsize=2)
def mnist1d_arrays(seed=42):
    """MNIST-1D (Greydanus 2020): 4000 training and 1000 test signals of length 40, 10 classes.

    Regenerated offline by the ``mnist1d`` package's own generator (``make_dataset``) with its
    default arguments (seed 42); nothing is downloaded. Returns
    ``(x_train, y_train, x_test, y_test)`` as float32 (N, 40) and int32 labels. The generator seeds
    NumPy's global random state; it is restored afterwards.
    """
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("the MNIST-1D tasks need the mnist1d package: pip install mnist1d") from err
    args = get_dataset_args()
    args.seed = seed
    state = np.random.get_state()
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(state)
    return (data["x"].astype(np.float32), data["y"].astype(np.int32),
            data["x_test"].astype(np.float32), data["y_test"].astype(np.int32))


def _fmnist_source(source=None):
    return os.path.abspath(source or os.environ.get("NGD_FMNIST_DIR") or FMNIST_DEFAULT_DIR)


def _fmnist_cache(cache=None):
    return os.path.abspath(cache or os.environ.get("NGD_DATA_CACHE")
                           or os.path.join(os.path.expanduser("~"), ".cache", "mindspore_ngd", "fashion-mnist"))


def fashion_mnist_missing(source=None):
    """``None`` when the four Fashion-MNIST ``.gz`` files are in ``source``, else how to get them.

    ``source`` defaults to ``$NGD_FMNIST_DIR``, else ``/usr/share/datasets/fashion-mnist``. Cheap: it
    only looks for the files.
    """
    folder = _fmnist_source(source)
    absent = [name + ".gz" for name in FMNIST_FILES if not os.path.isfile(os.path.join(folder, name + ".gz"))]
    if not absent:
        return None
    return (f"Fashion-MNIST not found: {folder} lacks {', '.join(absent)}. Install it with "
            "'sudo apt-get install dataset-fashion-mnist' (Debian/Ubuntu; files in "
            f"{FMNIST_DEFAULT_DIR}), or set NGD_FMNIST_DIR to a folder holding "
            f"{', '.join(name + '.gz' for name in FMNIST_FILES)}")


def _gunzip_if_stale(src, dst):
    """Decompress ``src`` to ``dst`` unless ``dst`` already carries ``src``'s modification time.

    Written to a temporary file in the same folder and renamed, so a reader (or a concurrent run)
    never sees a half-written file; ``dst`` gets ``src``'s mtime, which marks it up to date.
    """
    src_stat = os.stat(src)
    try:
        if os.stat(dst).st_mtime_ns == src_stat.st_mtime_ns:
            return False
    except FileNotFoundError:
        pass
    handle, tmp = tempfile.mkstemp(prefix=os.path.basename(dst) + ".", suffix=".tmp", dir=os.path.dirname(dst))
    try:
        with os.fdopen(handle, "wb") as out, gzip.open(src, "rb") as raw:
            shutil.copyfileobj(raw, out, 1 << 20)
        os.chmod(tmp, 0o644)                        # mkstemp creates it private
        os.utime(tmp, ns=(src_stat.st_atime_ns, src_stat.st_mtime_ns))
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return True


def _read_fmnist_split(folder, usage):
    """One split through ``mindspore.dataset.FashionMnistDataset``: (N,1,28,28) float32, int32 labels."""
    data = ds.FashionMnistDataset(folder, usage=usage, shuffle=False, num_parallel_workers=1)
    images, labels = [], []
    for image, label in data.batch(10000).create_tuple_iterator(output_numpy=True, num_epochs=1):
        images.append(image)                       # uint8 (B, 28, 28, 1)
        labels.append(label)
    x = np.concatenate(images).transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255.0)
    return np.ascontiguousarray(x), np.concatenate(labels).astype(np.int32)


@functools.lru_cache(maxsize=2)
def _fashion_mnist_cached(source, cache):
    reason = fashion_mnist_missing(source)
    if reason:
        raise DataUnavailable(reason)
    os.makedirs(cache, exist_ok=True)
    for name in FMNIST_FILES:
        _gunzip_if_stale(os.path.join(source, name + ".gz"), os.path.join(cache, name))
    return (*_read_fmnist_split(cache, "train"), *_read_fmnist_split(cache, "test"))


def fashion_mnist_arrays(source=None, cache=None):
    """Fashion-MNIST (Xiao et al. 2017): 60000 training and 10000 test 28x28 grey images, 10 classes.

    Read from the four ``.gz`` files in ``source`` (default ``$NGD_FMNIST_DIR``, else
    ``/usr/share/datasets/fashion-mnist``, where Debian's ``dataset-fashion-mnist`` package puts
    them). They are decompressed once into ``cache`` (default ``$NGD_DATA_CACHE``, else
    ``~/.cache/mindspore_ngd/fashion-mnist``) and read with ``mindspore.dataset.FashionMnistDataset``.
    Returns ``(x_train, y_train, x_test, y_test)``: float32 (N, 1, 28, 28) in [0, 1] and int32
    labels, in file order. Kept in memory per (source, cache) for the life of the process; treat the
    arrays as read-only. Raises :class:`DataUnavailable` (a ``FileNotFoundError``) when a file is
    missing, saying how to get it.
    """
    return _fashion_mnist_cached(_fmnist_source(source), _fmnist_cache(cache))


fashion_mnist_arrays.cache_clear = _fashion_mnist_cached.cache_clear


# The text corpus: the running interpreter's own standard library, which every machine with Python has.
# A fixed list of modules present in every CPython from 3.8 on, split by file (a model validated on
# files it never saw): 14 for training, 3 for validation.
STDLIB_TRAIN_FILES = ("argparse.py", "ast.py", "dataclasses.py", "difflib.py", "enum.py", "functools.py",
                      "inspect.py", "logging/__init__.py", "pathlib.py", "pickle.py", "shutil.py",
                      "subprocess.py", "tarfile.py", "threading.py")
STDLIB_VALID_FILES = ("typing.py", "zipfile.py", "configparser.py")


def _stdlib_root():
    return sysconfig.get_paths()["stdlib"]


def stdlib_text_missing():
    """``None`` when every file of the text corpus is in this interpreter's standard library, else why not."""
    root = _stdlib_root()
    absent = [name for name in STDLIB_TRAIN_FILES + STDLIB_VALID_FILES if not os.path.isfile(os.path.join(root, name))]
    if absent:
        return f"the text corpus needs these files of the Python standard library, absent from {root}: {', '.join(absent)}"
    return None


def _window_starts(size, length, count, seed):
    """``count`` distinct sorted offsets, multiples of ``length``, of windows of ``length + 1`` bytes in a
    text of ``size`` bytes (so no two windows share an input byte), chosen by ``seed``."""
    starts = np.arange(0, size - length - 1, length)
    if count > len(starts):
        raise ValueError(f"the files hold {len(starts)} windows of {length + 1} bytes, fewer than the {count} asked for")
    return np.sort(np.random.default_rng(seed).choice(starts, count, replace=False))


def _windows(names, length, count, seed):
    """:func:`_window_starts`'s windows of the concatenated files, as int32 (count, length + 1)."""
    root = _stdlib_root()
    text = b"\n".join(open(os.path.join(root, name), "rb").read() for name in names)
    data = np.frombuffer(text, np.uint8)
    return np.stack([data[s:s + length + 1] for s in _window_starts(len(data), length, count, seed)]).astype(np.int32)


@functools.lru_cache(maxsize=4)
def stdlib_text_arrays(length=64, train_windows=8192, valid_windows=1024, seed=0):
    """Byte-level language modelling on the Python standard library's sources (read from the running
    interpreter: :data:`STDLIB_TRAIN_FILES` for training, :data:`STDLIB_VALID_FILES` for validation).

    Returns ``(x_train, y_train, x_valid, y_valid)``: int32 (N, length) byte values (vocabulary 256),
    each target row its input row shifted by one byte. No two windows share an input byte, and which ones are taken
    is fixed by ``seed``. The arrays are cached for the life of the process; treat them as read-only.
    Raises :class:`DataUnavailable` when a file is missing.
    """
    reason = stdlib_text_missing()
    if reason:
        raise DataUnavailable(reason)
    train = _windows(STDLIB_TRAIN_FILES, length, train_windows, seed)
    valid = _windows(STDLIB_VALID_FILES, length, valid_windows, seed)
    return train[:, :-1], train[:, 1:], valid[:, :-1], valid[:, 1:]


def python_version():
    """The interpreter whose standard library is the corpus (its files change between versions)."""
    return sys.version.split()[0]


class _ArraySource:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        # labels as 0-d arrays: mindspore.dataset rejects NumPy scalars under NumPy 2
        return self.x[i], np.asarray(self.y[i])


def array_dataset(x, y, batch_size, shuffle=True, seed=0, drop_remainder=True):
    """A ``mindspore.dataset`` pipeline over in-memory arrays, columns ("image", "label")."""
    ds.config.set_seed(seed)
    data = ds.GeneratorDataset(_ArraySource(x, y), ["image", "label"], shuffle=shuffle)
    return data.batch(batch_size, drop_remainder=drop_remainder)
