"""Data sets that ship inside packages (no download at run time)."""
import numpy as np

import mindspore.dataset as ds

__all__ = ["digits_arrays", "array_dataset"]


def digits_arrays(test_fraction=0.2, seed=0):
    """scikit-learn's 8x8 digits (1797 images) as NCHW float32 in [0, 1] and int32 labels.

    Returns ``(x_train, y_train, x_test, y_test)``, a fixed stratified-by-shuffle split.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("the digits data set needs scikit-learn: pip install 'mindspore_ngd[examples]'") from err
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


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
