"""``mindspore.dataset`` pipelines: ImageNet-2012 folders, CIFAR-10 binaries, synthetic data.

* ImageNet-2012 (``dataset: imagenet2012``): an ``ImageFolderDataset`` of one sub-folder per class.
  ``data_path`` is either the training folder or a folder holding ``train/`` and ``val/`` (or
  ``validation/``); the evaluation folder is ``eval_dataset_path`` or that ``val/``. Training:
  random-resized crop (scale 0.08-1, aspect 3/4-4/3) decoded to ``image_size``, horizontal flip,
  per-channel normalisation; evaluation: resize to ``image_size / 0.875`` and centre crop.
* CIFAR-10 (``dataset: cifar10``): the binary version (``data_batch_1.bin`` ... ``data_batch_5.bin``,
  ``test_batch.bin``) in ``data_path`` or in its ``cifar-10-batches-bin/``. Training: 4-pixel padded
  random crop, horizontal flip, normalisation; evaluation: normalisation only.
* Synthetic (``data_path: synthetic``): ``synthetic_size`` images per device and epoch of shape
  ``(3, image_size, image_size)``, each a fixed random class template plus noise (so a network can
  learn them), generated deterministically from the index: the same images in the same order every
  epoch and every run, which makes a resumed run comparable with a continuous one.

A missing or malformed path raises :class:`DatasetError` saying what was expected.
"""
import os

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore.dataset import transforms, vision

__all__ = ["DatasetError", "SYNTHETIC", "resolve_paths", "create_dataset", "SyntheticImages",
           "CIFAR_TRAIN_FILES", "CIFAR_TEST_FILES", "CIFAR_RECORD", "CIFAR_FILE_RECORDS"]

SYNTHETIC = "synthetic"
IMAGENET_MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
IMAGENET_STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
CIFAR_MEAN = [0.4914, 0.4822, 0.4465]
CIFAR_STD = [0.2470, 0.2435, 0.2616]
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST_FILES = ("test_batch.bin",)
CIFAR_RECORD = 1 + 32 * 32 * 3          # label byte + 3 colour planes of 32x32
CIFAR_FILE_RECORDS = 10000              # records per file (mindspore.dataset.Cifar10Dataset reads exactly these)
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp")


class DatasetError(ValueError):
    """A dataset path that is missing or does not hold the expected files."""


# --------------------------------------------------------------------------- paths and checks
def _first_existing(root, names):
    for name in names:
        if os.path.isdir(os.path.join(root, name)):
            return os.path.join(root, name)
    return None


def resolve_paths(config):
    """``(train_path, eval_path)`` for the config; ``eval_path`` may be None (no evaluation data)."""
    data_path, eval_path = config["data_path"], config["eval_dataset_path"] or None
    if not data_path:
        raise DatasetError("no data path: give DATA_PATH (--data_path), or 'synthetic' for generated data")
    if data_path == SYNTHETIC:
        return SYNTHETIC, eval_path or SYNTHETIC
    if not os.path.exists(data_path):
        raise DatasetError(f"dataset path {data_path!r} does not exist")
    if config["dataset"] == "imagenet2012":
        train = _first_existing(data_path, ("train",))
        val = _first_existing(data_path, ("val", "validation", "validation_preprocess"))
        if train:
            return train, eval_path or val
        return data_path, eval_path
    return data_path, eval_path or data_path


def _check_imagenet_folder(path):
    if not os.path.isdir(path):
        raise DatasetError(f"ImageNet folder {path!r} is not a directory: expected one sub-folder per class "
                           "holding JPEG images (e.g. train/n01440764/n01440764_10026.JPEG)")
    classes = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    if not classes:
        raise DatasetError(f"ImageNet folder {path!r} has no class sub-folders: expected one sub-folder per "
                           "class holding JPEG images (e.g. train/n01440764/n01440764_10026.JPEG)")
    first = os.path.join(path, classes[0])
    if not any(f.lower().endswith(IMAGE_EXTENSIONS) for f in os.listdir(first)):
        raise DatasetError(f"ImageNet class folder {first!r} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    return len(classes)


def _cifar_folder(path, training):
    """The folder holding the CIFAR-10 binaries needed for ``training`` (checked)."""
    if not os.path.isdir(path):
        raise DatasetError(f"CIFAR-10 path {path!r} is not a directory holding the binary version "
                           "(cifar-10-batches-bin)")
    folder = path
    nested = os.path.join(path, "cifar-10-batches-bin")
    if not os.path.exists(os.path.join(path, CIFAR_TEST_FILES[0])) and os.path.isdir(nested):
        folder = nested
    needed = CIFAR_TRAIN_FILES if training else CIFAR_TEST_FILES
    missing = [f for f in needed if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise DatasetError(f"CIFAR-10 folder {folder!r} lacks {missing}: expected the binary version "
                           f"({', '.join(CIFAR_TRAIN_FILES + CIFAR_TEST_FILES)})")
    for name in needed:
        size = os.path.getsize(os.path.join(folder, name))
        if size != CIFAR_RECORD * CIFAR_FILE_RECORDS:
            raise DatasetError(f"CIFAR-10 file {os.path.join(folder, name)!r} has {size} bytes, expected "
                               f"{CIFAR_FILE_RECORDS} records of {CIFAR_RECORD} bytes (label + 32x32x3 image) = "
                               f"{CIFAR_RECORD * CIFAR_FILE_RECORDS}: malformed or truncated")
    return folder


# --------------------------------------------------------------------------- synthetic data
class SyntheticImages:
    """Deterministic random-access source: item ``i`` depends only on (seed, split, i).

    The class templates depend on ``seed`` only, so the training (split 0) and evaluation (split 1)
    images of a class share their template and differ in their noise.
    """

    def __init__(self, size, image_size, num_classes, seed=0, split=0):
        self.size, self.image_size, self.num_classes = size, image_size, num_classes
        self.seed, self.split = seed, split
        rng = np.random.default_rng(seed)
        self.templates = rng.standard_normal((num_classes, 3, image_size, image_size)).astype(np.float32)

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        label = index % self.num_classes
        noise = np.random.default_rng((self.seed, self.split, index)).standard_normal(
            (3, self.image_size, self.image_size)).astype(np.float32)
        # labels as 0-d arrays: mindspore.dataset rejects NumPy scalars under NumPy 2
        return self.templates[label] + 0.5 * noise, np.asarray(label, np.int32)


# --------------------------------------------------------------------------- pipelines
def _imagenet(path, config, training, rank, group_size):
    _check_imagenet_folder(path)
    workers = config["num_parallel_workers"]
    shard = {"num_shards": group_size, "shard_id": rank} if training and group_size > 1 else {}
    data = ds.ImageFolderDataset(path, num_parallel_workers=workers, shuffle=training, **shard)
    size = config["image_size"]
    if training:
        ops = [vision.RandomCropDecodeResize(size, scale=(0.08, 1.0), ratio=(0.75, 1.333)),
               vision.RandomHorizontalFlip(prob=0.5)]
    else:
        ops = [vision.Decode(), vision.Resize(int(round(size / 0.875))), vision.CenterCrop(size)]
    ops += [vision.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD), vision.HWC2CHW()]
    data = data.map(ops, input_columns="image", num_parallel_workers=workers)
    return data.map(transforms.TypeCast(ms.int32), input_columns="label", num_parallel_workers=workers)


def _cifar10(path, config, training, rank, group_size):
    folder = _cifar_folder(path, training)
    workers = config["num_parallel_workers"]
    shard = {"num_shards": group_size, "shard_id": rank} if training and group_size > 1 else {}
    data = ds.Cifar10Dataset(folder, usage="train" if training else "test", shuffle=training,
                             num_parallel_workers=workers, **shard)
    ops = [vision.RandomCrop((32, 32), padding=(4, 4, 4, 4)), vision.RandomHorizontalFlip(prob=0.5)] \
        if training else []
    if config["image_size"] != 32:
        ops.append(vision.Resize((config["image_size"], config["image_size"])))
    ops += [vision.Rescale(1.0 / 255.0, 0.0), vision.Normalize(mean=CIFAR_MEAN, std=CIFAR_STD), vision.HWC2CHW()]
    data = data.map(ops, input_columns="image", num_parallel_workers=workers)
    return data.map(transforms.TypeCast(ms.int32), input_columns="label", num_parallel_workers=workers)


def _synthetic(config, training, rank, group_size):
    per_device = config["synthetic_size"] if training else config["synthetic_eval_size"]
    total = per_device * (group_size if training else 1)
    source = SyntheticImages(total, config["image_size"], config["class_num"], seed=config["seed"],
                             split=0 if training else 1)
    shard = {"num_shards": group_size, "shard_id": rank} if training and group_size > 1 else {}
    return ds.GeneratorDataset(source, ["image", "label"], shuffle=False, **shard)


def create_dataset(config, training=True, rank=0, group_size=1):
    """The batched training (sharded by rank) or evaluation pipeline of ``config``.

    Returns None for evaluation when the config has no evaluation data.
    """
    ds.config.set_seed(config["seed"])
    train_path, eval_path = resolve_paths(config)
    path = train_path if training else eval_path
    if path is None:
        return None
    if path == SYNTHETIC:
        data = _synthetic(config, training, rank, group_size)
    elif config["dataset"] == "imagenet2012":
        data = _imagenet(path, config, training, rank, group_size)
    else:
        data = _cifar10(path, config, training, rank, group_size)
    batch = config["batch_size"] if training else config["eval_batch_size"]
    data = data.batch(batch, drop_remainder=training)
    if training and data.get_dataset_size() == 0:
        raise DatasetError(f"training data at {path!r} has fewer images per device than batch_size "
                           f"({batch}): no full batch")
    return data
