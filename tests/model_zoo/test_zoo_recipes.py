"""Every natural-gradient recipe the model zoo ships runs 3 short epochs on synthetic data (issue 33).

Slow (about an hour on 2 cores): ``python -m pytest -m slow tests/model_zoo/test_zoo_recipes.py``. Each
config runs as a user runs it, ``python model_zoo/resnet50/train.py --config_path NAME --data_path synthetic``,
at its own per-device batch and learning rate (not scaled: one device here, so the global batch is the
per-device one); the ImageNet recipes at 64x64 with 10 classes and fp32 (``--amp_level O0``), the CIFAR
recipes as written. A run must train (exit 0, every logged loss finite, the last epoch's mean loss below
the first's) or stop with a reason (a non-zero exit whose message says the run diverged).
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from zoo import REPO, ZOO

IMAGENET = ("resnet50_imagenet2012_kfac_8p", "resnet50_imagenet2012_spngd_bs4k",
            "resnet50_imagenet2012_thor_8p", "resnet50_imagenet2012_thor_gpu_8p")
CIFAR = ("resnet_cifar10_kfac", "resnet_cifar10_spngd", "resnet_cifar10_thor")
# measured 2026-11-27 with this command: epoch means 2.13, 1.04, 0.59 (Ascend values) and 2.12, 0.99, 0.61 (GPU
# values); without the configs' kl_clip both rose to 2.8-3.0 in the third epoch (docs/performance.md)
THOR_RECIPES = ("resnet50_imagenet2012_thor_8p", "resnet50_imagenet2012_thor_gpu_8p")
LOSS = re.compile(r"epoch: (\d+) step: \d+, loss is ([^\s]+)")


def recipe_command(config, output_dir):
    """The command line of one recipe's 3-epoch run."""
    command = [sys.executable, os.path.join(ZOO, "train.py"), "--config_path", config, "--data_path", "synthetic",
               "--device_target", "CPU", "--device_num", "1", "--epoch_size", "3", "--eval_interval", "0",
               "--save_checkpoint_epochs", "0", "--output_dir", str(output_dir)]
    if config in IMAGENET:
        command += ["--image_size", "64", "--class_num", "10", "--synthetic_size", "96", "--amp_level", "O0"]
    else:
        command += ["--synthetic_size", "256"]
    return command


def epoch_means(output):
    """Mean logged loss per epoch, in epoch order."""
    losses = {}
    for epoch, value in LOSS.findall(output):
        losses.setdefault(int(epoch), []).append(float(value))
    return [float(np.mean(losses[e])) for e in sorted(losses)]


@pytest.mark.slow
@pytest.mark.parametrize("config", CIFAR + IMAGENET)
def test_recipe_trains_three_epochs_or_stops_with_a_reason(config, tmp_path):
    proc = subprocess.run(recipe_command(config, tmp_path), cwd=REPO, capture_output=True, text=True,
                          timeout=3600, check=False)
    output = proc.stdout + proc.stderr
    if config in THOR_RECIPES:       # nn.thor's published values (with the config's kl_clip) must train here
        assert proc.returncode == 0, f"{config} stopped:\n{output[-3000:]}"
    if proc.returncode != 0:
        assert "diverged" in output, f"{config} failed without saying why:\n{output[-3000:]}"
        return
    means = epoch_means(proc.stdout)
    assert len(means) == 3, f"{config}: expected 3 epochs of losses, got {means}"
    assert all(np.isfinite(means)), means
    assert means[-1] < means[0], f"{config} did not train: epoch mean losses {means}"
