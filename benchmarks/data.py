"""Data sets that ship inside packages (no download at run time)."""
import functools

import numpy as np

import mindspore.dataset as ds

__all__ = ["digits_arrays", "mnist1d_arrays", "array_dataset"]


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
