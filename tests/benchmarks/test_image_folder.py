"""benchmarks.image_folder writes each class's first images as RGB PNG files (the model zoo's reading of
the folder: tests/model_zoo/test_zoo_data.py)."""
import os

import numpy as np
import pytest

from benchmarks.image_folder import write_image_folder


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((60, 1, 28, 28)).astype(np.float32)
    y = (np.arange(60) % 3).astype(np.int32)
    return x, y, x[:12], y[:12]


def test_the_folder_holds_each_class_first_images_as_rgb(tmp_path):
    from PIL import Image
    x, y, xt, yt = _arrays()
    written = write_image_folder(str(tmp_path), train_per_class=4, val_per_class=2, arrays=(x, y, xt, yt))
    assert written == {"train": 12, "val": 6}
    assert sorted(os.listdir(tmp_path / "train")) == ["class_0", "class_1", "class_2"]
    first = np.asarray(Image.open(tmp_path / "train" / "class_1" / "00000.png"))
    assert first.shape == (28, 28, 3) and first.dtype == np.uint8
    expected = np.rint(x[1, 0] * 255).astype(np.uint8)           # index 1 is class 1's first image
    for channel in range(3):
        np.testing.assert_array_equal(first[:, :, channel], expected)


def test_a_count_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="train_per_class must be a positive integer"):
        write_image_folder(str(tmp_path), train_per_class=0, arrays=_arrays())
