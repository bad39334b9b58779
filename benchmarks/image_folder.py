"""Write a small ImageNet-style folder of real images for the model zoo: ``OUT/train/<class>/*.png`` and
``OUT/val/<class>/*.png``, from Fashion-MNIST (the Debian package ``dataset-fashion-mnist``, see
:mod:`benchmarks.data`), each 28x28 grey image stored as RGB.

    python -m benchmarks.image_folder OUT [--train-per-class 128] [--val-per-class 10]

The zoo's ImageNet pipeline (``model_zoo/resnet50/train.py --data_path OUT/train --eval_dataset_path
OUT/val --num_classes 10 --image_size 64``) then trains on real images: harder than the zoo's synthetic
templates, which every optimizer separates within a few steps (issue 32, docs/performance.md). Each
class contributes its first images in the data set's order, so the folder is the same on every machine.
"""
import argparse
import os

import numpy as np

from . import data

__all__ = ["write_image_folder"]


def write_image_folder(out, train_per_class=128, val_per_class=10, arrays=None):
    """Write the folder; returns ``{"train": n, "val": m}``, the images written per split.

    ``arrays`` (x_train, y_train, x_test, y_test) as :func:`benchmarks.data.fashion_mnist_arrays`
    returns them (N, 1, 28, 28 in [0, 1]); read from the Debian package when None."""
    from PIL import Image
    for name, value in (("train_per_class", train_per_class), ("val_per_class", val_per_class)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    x_train, y_train, x_test, y_test = arrays if arrays is not None else data.fashion_mnist_arrays()
    written = {}
    for split, x, y, per_class in (("train", x_train, y_train, train_per_class), ("val", x_test, y_test, val_per_class)):
        written[split] = 0
        for label in np.unique(y):
            chosen = np.flatnonzero(y == label)[:per_class]
            folder = os.path.join(out, split, f"class_{int(label)}")
            os.makedirs(folder, exist_ok=True)
            for i, index in enumerate(chosen):
                grey = np.clip(np.rint(x[index, 0] * 255.0), 0, 255).astype(np.uint8)
                Image.fromarray(np.repeat(grey[:, :, None], 3, axis=2)).save(os.path.join(folder, f"{i:05d}.png"))
            written[split] += len(chosen)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder to write (train/ and val/ inside)")
    parser.add_argument("--train-per-class", type=int, default=128)
    parser.add_argument("--val-per-class", type=int, default=10)
    args = parser.parse_args(argv)
    written = write_image_folder(args.out, args.train_per_class, args.val_per_class)
    print(f"wrote {written['train']} training and {written['val']} evaluation images to {args.out}")


if __name__ == "__main__":
    main()
