"""model_zoo/resnet50/src/dataset.py: clear errors for missing or malformed data, the ImageNet folder
and CIFAR-10 binary pipelines on tiny fixtures, and the synthetic data set."""
import numpy as np
import pytest

from zoo import smoke_config  # first: puts the model zoo's src/ on sys.path
from src import dataset as zoo_data


def _data_config(**changes):
    return smoke_config(num_parallel_workers=1, **changes)


def _batches(data):
    return list(data.create_tuple_iterator(output_numpy=True))


def test_missing_and_malformed_dataset_paths_are_clear_errors(tmp_path):
    with pytest.raises(zoo_data.DatasetError, match="does not exist"):
        zoo_data.create_dataset(_data_config(data_path=str(tmp_path / "nowhere")))
    with pytest.raises(zoo_data.DatasetError, match="no data path"):
        zoo_data.create_dataset(_data_config(data_path=""))
    (tmp_path / "empty").mkdir()
    with pytest.raises(zoo_data.DatasetError, match="no class sub-folders"):
        zoo_data.create_dataset(_data_config(dataset="imagenet2012", data_path=str(tmp_path / "empty")))
    with pytest.raises(zoo_data.DatasetError, match=r"lacks \['data_batch_1.bin'"):
        zoo_data.create_dataset(_data_config(dataset="cifar10", data_path=str(tmp_path / "empty")))
    bad = tmp_path / "badcifar"
    bad.mkdir()
    for name in zoo_data.CIFAR_TRAIN_FILES + zoo_data.CIFAR_TEST_FILES:
        (bad / name).write_bytes(b"\0" * 1000)
    with pytest.raises(zoo_data.DatasetError, match="has 1000 bytes, expected 10000 records of 3073 bytes"):
        zoo_data.create_dataset(_data_config(dataset="cifar10", data_path=str(bad)))


def test_imagenet_folder_pipeline(tmp_path):
    from PIL import Image
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("n01440764", "n01443537"):
            folder = tmp_path / split / cls
            folder.mkdir(parents=True)
            for k in range(2):
                Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(folder / f"{cls}_{k}.JPEG")
    config = _data_config(dataset="imagenet2012", data_path=str(tmp_path), image_size=32, batch_size=2,
                          eval_batch_size=3)
    train = _batches(zoo_data.create_dataset(config, training=True))
    assert len(train) == 2 and train[0][0].shape == (2, 3, 32, 32) and train[0][1].dtype == np.int32
    evaluation = _batches(zoo_data.create_dataset(config, training=False))
    assert [b[0].shape[0] for b in evaluation] == [3, 1]      # no dropped remainder at evaluation
    shard = zoo_data.create_dataset(config, training=True, rank=1, group_size=2)
    assert shard.get_dataset_size() == 1


def test_cifar10_binary_pipeline(tmp_path):
    # full-size files (Cifar10Dataset reads 10,000 records per file): zero images, labels 0..9
    records = np.zeros((zoo_data.CIFAR_FILE_RECORDS, zoo_data.CIFAR_RECORD), np.uint8)
    records[:, 0] = np.arange(zoo_data.CIFAR_FILE_RECORDS) % 10
    nested = tmp_path / "cifar-10-batches-bin"          # the archive's folder, found from its parent
    nested.mkdir()
    for name in zoo_data.CIFAR_TRAIN_FILES + zoo_data.CIFAR_TEST_FILES:
        (nested / name).write_bytes(records.tobytes())
    config = _data_config(dataset="cifar10", data_path=str(tmp_path), image_size=32, batch_size=8, eval_batch_size=4)
    train = zoo_data.create_dataset(config, training=True)
    assert train.get_dataset_size() == 50000 // 8
    images, labels = next(train.create_tuple_iterator(output_numpy=True))
    assert images.shape == (8, 3, 32, 32) and images.dtype == np.float32 and labels.dtype == np.int32
    evaluation = zoo_data.create_dataset(config, training=False)
    images, labels = next(evaluation.create_tuple_iterator(output_numpy=True))
    assert evaluation.get_dataset_size() == 10000 // 4 and images.shape == (4, 3, 32, 32)
    # no augmentation at evaluation: a zero image normalises to -mean/std in every pixel
    np.testing.assert_allclose(images[0, :, 5, 5], -np.array(zoo_data.CIFAR_MEAN) / np.array(zoo_data.CIFAR_STD),
                               rtol=1e-5)
    np.testing.assert_array_equal(labels, [0, 1, 2, 3])


def test_synthetic_data_is_deterministic_sharded_and_learnable():
    config = _data_config(data_path="synthetic")
    first = _batches(zoo_data.create_dataset(config))
    again = _batches(zoo_data.create_dataset(config))
    assert len(first) == config["synthetic_size"] // config["batch_size"]
    for (x1, y1), (x2, y2) in zip(first, again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    shards = [_batches(zoo_data.create_dataset(config, rank=r, group_size=2)) for r in range(2)]
    assert [len(s) for s in shards] == [len(first)] * 2           # synthetic_size is per device
    assert not np.array_equal(shards[0][0][0], shards[1][0][0])
    train, evaluation = zoo_data.SyntheticImages(4, 8, 3, split=0), zoo_data.SyntheticImages(4, 8, 3, split=1)
    np.testing.assert_array_equal(train.templates, evaluation.templates)   # same classes, other noise
    assert not np.array_equal(train[0][0], evaluation[0][0])


def test_the_pipeline_reads_a_folder_written_by_benchmarks_image_folder(tmp_path):
    """The folder issue 32's real-image runs use (``python -m benchmarks.image_folder``)."""
    from benchmarks.image_folder import write_image_folder
    rng = np.random.default_rng(0)
    x = rng.random((60, 1, 28, 28)).astype(np.float32)
    y = (np.arange(60) % 3).astype(np.int32)
    write_image_folder(str(tmp_path), train_per_class=8, val_per_class=2, arrays=(x, y, x[:12], y[:12]))
    config = _data_config(dataset="imagenet2012", data_path=str(tmp_path / "train"),
                          eval_dataset_path=str(tmp_path / "val"), image_size=32, batch_size=8, eval_batch_size=2)
    batches = _batches(zoo_data.create_dataset(config))
    assert len(batches) == 3
    assert batches[0][0].shape == (8, 3, 32, 32) and batches[0][0].dtype == np.float32
    assert sorted(set(np.concatenate([b[1] for b in batches]).tolist())) == [0, 1, 2]
    assert sum(len(b[1]) for b in _batches(zoo_data.create_dataset(config, training=False))) == 6
