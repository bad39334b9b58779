"""Fashion-MNIST in the time-to-accuracy suite: the loader on small hand-written IDX files, skipping a
task whose data is missing, the DeepOBS networks and the new tasks' settings. No real data needed."""
import dataclasses
import gzip
import os
import struct

import numpy as np
import pytest

import mindspore as ms

import mindspore_ngd as ngd
from benchmarks import convergence, data, models, tasks
from benchmarks.tasks import TASKS

N_TRAIN, N_TEST = 20, 10
APT_HINT = "apt-get install dataset-fashion-mnist"


def _write_idx(path, array):
    """``array`` (uint8) as a gzipped IDX file: magic 0x0000080<ndim>, big-endian dimensions, payload."""
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


@pytest.fixture
def fake_fmnist(tmp_path):
    """A source folder with the four files of a 20 + 10 image Fashion-MNIST, and the arrays in it."""
    rng = np.random.default_rng(0)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (N_TRAIN, 28, 28), dtype=np.uint8),
              "train-labels-idx1-ubyte": rng.integers(0, 10, N_TRAIN, dtype=np.uint8),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (N_TEST, 28, 28), dtype=np.uint8),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, N_TEST, dtype=np.uint8)}
    arrays["train-images-idx3-ubyte"][0, 0, :2] = (0, 255)    # both ends of the range
    source = tmp_path / "source"
    source.mkdir()
    for name, array in arrays.items():
        _write_idx(source / (name + ".gz"), array)
    yield source, arrays
    data.fashion_mnist_arrays.cache_clear()


def test_idx_header_is_the_standard_one(fake_fmnist):
    source, _ = fake_fmnist
    with gzip.open(source / "train-images-idx3-ubyte.gz", "rb") as handle:
        assert handle.read(16) == bytes.fromhex("00000803" "00000014" "0000001c" "0000001c")
    with gzip.open(source / "t10k-labels-idx1-ubyte.gz", "rb") as handle:
        assert handle.read(8) == bytes.fromhex("00000801" "0000000a")


def test_loader_round_trips_pixels_and_labels(fake_fmnist, tmp_path):
    source, arrays = fake_fmnist
    x_train, y_train, x_test, y_test = data.fashion_mnist_arrays(source=str(source), cache=str(tmp_path / "cache"))
    assert x_train.shape == (N_TRAIN, 1, 28, 28) and x_test.shape == (N_TEST, 1, 28, 28)
    assert x_train.dtype == x_test.dtype == np.float32 and y_train.dtype == y_test.dtype == np.int32
    assert x_train.min() == 0.0 and x_train.max() == 1.0 and x_test.min() >= 0.0 and x_test.max() <= 1.0
    for x, images in ((x_train, arrays["train-images-idx3-ubyte"]), (x_test, arrays["t10k-images-idx3-ubyte"])):
        np.testing.assert_array_equal(np.rint(x[:, 0] * 255).astype(np.uint8), images)
    np.testing.assert_array_equal(y_train, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(y_test, arrays["t10k-labels-idx1-ubyte"])


def test_loader_decompresses_once_and_caches_in_process(fake_fmnist, tmp_path, monkeypatch):
    source, _ = fake_fmnist
    cache = tmp_path / "cache"
    monkeypatch.setenv("NGD_FMNIST_DIR", str(source))          # the defaults come from the environment
    monkeypatch.setenv("NGD_DATA_CACHE", str(cache))
    first = data.fashion_mnist_arrays()
    assert sorted(os.listdir(cache)) == sorted(data.FMNIST_FILES)    # no temporary files left behind
    stats = {name: os.stat(cache / name) for name in data.FMNIST_FILES}
    assert stats["train-images-idx3-ubyte"].st_size == 16 + N_TRAIN * 28 * 28
    assert data.fashion_mnist_arrays() is first                       # in-process cache

    data.fashion_mnist_arrays.cache_clear()
    again = data.fashion_mnist_arrays(source=str(source), cache=str(cache))
    assert again is not first
    np.testing.assert_array_equal(again[0], first[0])
    for name, stat in stats.items():                                  # up to date: not rewritten
        assert os.stat(cache / name).st_ino == stat.st_ino, name

    labels = source / "t10k-labels-idx1-ubyte.gz"                    # a newer source file is
    os.utime(labels, ns=(labels.stat().st_atime_ns, labels.stat().st_mtime_ns + 10**9))
    data.fashion_mnist_arrays.cache_clear()
    data.fashion_mnist_arrays(source=str(source), cache=str(cache))
    assert os.stat(cache / "t10k-labels-idx1-ubyte").st_ino != stats["t10k-labels-idx1-ubyte"].st_ino
    assert os.stat(cache / "t10k-images-idx3-ubyte").st_ino == stats["t10k-images-idx3-ubyte"].st_ino


def test_missing_data_raises_with_how_to_get_it(fake_fmnist, tmp_path):
    source, _ = fake_fmnist
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(data.DataUnavailable) as info:
        data.fashion_mnist_arrays(source=str(empty), cache=str(tmp_path / "cache"))
    assert isinstance(info.value, FileNotFoundError)
    for word in (APT_HINT, "NGD_FMNIST_DIR", str(empty), "train-images-idx3-ubyte.gz"):
        assert word in str(info.value), (word, str(info.value))
    assert not (tmp_path / "cache").exists()

    os.remove(source / "t10k-labels-idx1-ubyte.gz")                  # one file missing: named alone
    reason = data.fashion_mnist_missing(str(source))
    assert "lacks t10k-labels-idx1-ubyte.gz." in reason and APT_HINT in reason


def test_cli_skips_a_task_whose_data_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NGD_FMNIST_DIR", str(tmp_path / "nowhere"))

    def no_training(*args, **kwargs):
        raise AssertionError("a task without its data must not train")
    monkeypatch.setattr(convergence, "run_task", no_training)
    assert not TASKS["fmnist-mlp"].available()
    outputs = convergence.main(["--task", "fmnist-mlp,fmnist-2c2d", "--quick", "--no-plots",
                                "--optimizers", "momentum", "--out", str(tmp_path / "out")])
    assert outputs == {}
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["skipping task fmnist-mlp", "skipping task fmnist-2c2d"]
    assert all(APT_HINT in line and "NGD_FMNIST_DIR" in line for line in lines)
    assert not (tmp_path / "out").exists()


def test_cli_skips_a_task_whose_data_disappears_after_the_check(tmp_path, monkeypatch, capsys):
    def gone(*args, **kwargs):
        raise data.DataUnavailable("Fashion-MNIST not found: " + APT_HINT)
    monkeypatch.setattr(convergence, "run_task", gone)
    monkeypatch.setitem(TASKS, "fmnist-mlp", dataclasses.replace(TASKS["fmnist-mlp"], missing=None))
    assert convergence.main(["--task", "fmnist-mlp", "--quick", "--no-plots", "--optimizers", "momentum",
                             "--out", str(tmp_path)]) == {}
    assert capsys.readouterr().out.startswith("skipping task fmnist-mlp: Fashion-MNIST not found")


def test_run_one_evaluates_in_chunks_on_the_loaded_arrays(fake_fmnist, tmp_path, monkeypatch):
    source, _ = fake_fmnist
    arrays = data.fashion_mnist_arrays(source=str(source), cache=str(tmp_path / "cache"))
    task = dataclasses.replace(TASKS["fmnist-mlp"], batch_size=10, eval_batch=8)
    seen = []
    evaluate = tasks.Task.evaluate

    def recording(self, outputs, y_train, y_test):
        seen.append(outputs.shape)
        return evaluate(self, outputs, y_train, y_test)
    monkeypatch.setattr(tasks.Task, "evaluate", recording)
    run = convergence.run_one(task, arrays, "momentum", 0.1, None, 0, epochs=1)
    assert seen == [(N_TRAIN + N_TEST, 10)]                            # chunks 8, 8, 8, 6 put back together
    assert run["steps_per_epoch"] == 2 and np.isfinite(run["curve"][0]["train_loss"])
    assert 0 <= run["curve"][0]["test_acc"] <= 1


@pytest.mark.parametrize("build, widths", [(models.fmnist_mlp, [784, 1000, 500, 100]),
                                           (models.fmnist_2c2d, [1, 32, 3136, 1024])])
def test_deepobs_networks(build, widths):
    ms.set_seed(0)
    net = build()
    out = net(ms.Tensor(np.zeros((2, 1, 28, 28), np.float32)))
    assert out.shape == (2, 10)
    opt = ngd.KFAC(net, 0.1, verbose=False)
    assert len(opt.layer_specs) == 4                                  # every Dense and Conv2d preconditioned
    in_sizes = [p.shape[1] for p in net.trainable_params() if p.name.endswith("weight")]
    assert in_sizes == widths
    assert sum(p.size for p in net.trainable_params()) == {models.fmnist_mlp: 1336610,
                                                          models.fmnist_2c2d: 3274634}[build]   # as in DeepOBS


def test_new_tasks_and_their_learning_rate_grids():
    for name, batch in (("fmnist-mlp", 128), ("fmnist-2c2d", 128), ("fmnist-mlp-b1024", 1024),
                        ("fmnist-mlp-b2048", 2048), ("fmnist-mlp-b4096", 4096), ("digits-cnn-b512", 512)):
        task = TASKS[name]
        assert task.batch_size == batch and task.kind == "classification"
        assert 1 <= task.quick_epochs < task.epochs
    assert TASKS["fmnist-2c2d"].epochs < TASKS["fmnist-mlp"].epochs
    assert TASKS["digits-cnn-b512"].build is models.DigitsCNN
    assert (TASKS["fmnist-mlp-b4096"].build, TASKS["fmnist-mlp-b4096"].target) == (models.fmnist_mlp, 0.88)
    for name in ("momentum", "kfac", "adam"):                        # the default grids
        assert convergence.OPTIMIZERS[name].lrs_for(TASKS["fmnist-mlp-b1024"]) == convergence.OPTIMIZERS[name].lrs


def test_task_lrs_replaces_the_grid_of_one_optimizer_family():
    task = dataclasses.replace(TASKS["fmnist-mlp-b1024"], lrs={"sgd": (0.01, 0.02, 0.05)})
    for name in ("momentum", "sgd", "kfac", "thor-fixed"):
        assert convergence.OPTIMIZERS[name].lrs_for(task) == (0.01, 0.02, 0.05)
        assert sorted({lr for lr, _ in convergence.grid_points(name, "full", task)}) == [0.01, 0.02, 0.05]
    assert convergence.OPTIMIZERS["adam"].lrs_for(task) == convergence.ADAM_LRS
    assert convergence.grid_points("momentum", "single", task) == [(0.02, None)]
    assert convergence.grid_points("kfac", "single", task) == [(0.02, 1e-2)]
    assert convergence.grid_points("momentum", "single") == [(0.1, None)]
