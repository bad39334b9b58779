"""msrun worker for the device checks: 3 distributed K-FAC steps of a conv + dense network on the
device named by ``NGD_TEST_DEVICE`` (HCCL on Ascend, NCCL on GPU, MCCL on CPU), each rank on its
half of the same fixed batches of 8 that device_numerics.py trains on in one process. Writes the
weights and the collectives the exchange chose."""
import os

import numpy as np

from distributed import run_worker, write_result


def main():
    import mindspore as ms
    from mindspore import Tensor
    from mindspore.communication import init, get_rank, get_group_size
    from mindspore.context import ParallelMode
    device = os.environ.get("NGD_TEST_DEVICE", "CPU")
    ms.set_device(device)
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()
    from mindspore_ngd import audit
    from mindspore_ngd.curvature.inverse import DEVICE_INVERSE_METHODS
    from nets import ConvNet, set_weights      # device_numerics.plain_net: no BatchNorm (per-rank statistics)
    net = ConvNet(2, 4, (3, 3), (1, 1), "same", 0, (1, 1), True, 4 * 5 * 5, classes=3)
    set_weights(net, np.random.default_rng(0), scale=0.3)
    step = audit.build_train_step("kfac", DEVICE_INVERSE_METHODS[device], net)
    data = np.random.default_rng(1)
    share = 8 // world
    for _ in range(3):
        x = data.standard_normal((8, 2, 5, 5)).astype(np.float32)
        y = np.asarray(data.integers(0, 3, 8), dtype=np.int32)
        part = slice(rank * share, (rank + 1) * share)
        step(Tensor(x[part]), Tensor(y[part]))
    write_result({"rank": rank, "world": world, "device": ms.get_context("device_target"),
                  "describe": step.optimizer.communicator.describe(),
                  "weights": {p.name: p.asnumpy().copy() for p in step.network.trainable_params()}})


if __name__ == "__main__":
    run_worker(main)
