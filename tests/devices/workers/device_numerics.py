"""Device check worker: numerics on one device, as JSON for tests/devices/test_on_device.py.

    python tests/devices/workers/device_numerics.py --device GPU --out result.json

* ``inverses``: damped inverses of random SPD matrices (sizes 8, 64, 256; damping 1e-3 and 1e-1)
  through the device's inversion path (``DEVICE_INVERSE_METHODS[device]``), with the inputs, for a
  float64 NumPy comparison by the test;
* ``weights``: the weights of the audit network (conv + BatchNorm + dense) and of a plain conv +
  dense network after 3 K-FAC steps with the inversion path on fixed batches of 8, for comparison
  with the same run on CPU (and, for the plain network, with 2 ranks under msrun).

With ``--device CPU`` this is the reference run (and a self-check of the harness anywhere)."""
import argparse
import json

import numpy as np


def plain_net():
    """conv -> ReLU -> flatten -> Dense (tests/nets.py), no BatchNorm: BatchNorm's batch statistics
    are per rank, so only a network without it trains identically on 2 ranks and on 1."""
    from nets import ConvNet, set_weights
    net = ConvNet(2, 4, (3, 3), (1, 1), "same", 0, (1, 1), True, 4 * 5 * 5, classes=3)
    set_weights(net, np.random.default_rng(0), scale=0.3)     # the same weights in every process
    return net


def spd(rng, n):
    x = rng.standard_normal((4 * n, n))
    return (x.T @ x / (4 * n)).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", required=True, choices=["Ascend", "GPU", "CPU"])
    parser.add_argument("--method", default=None, help="inversion path (default: the device's)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import mindspore as ms
    from mindspore import Tensor
    ms.set_device(args.device)
    ms.set_context(mode=ms.GRAPH_MODE)
    from mindspore_ngd import audit
    from mindspore_ngd.curvature.inverse import DEVICE_INVERSE_METHODS, damped_inverse
    method = args.method or DEVICE_INVERSE_METHODS[args.device]

    rng = np.random.default_rng(0)
    inverses = []
    for n in (8, 64, 256):
        m = spd(rng, n)
        for damping in (1e-3, 1e-1):
            inv, ok = ms.jit(damped_inverse, static_argnums=(2,))(Tensor(m), Tensor(np.float32(damping)), method,
                                                                   Tensor(np.float32(0.0)))
            inverses.append({"n": n, "damping": damping, "matrix": m.tolist(), "inverse": inv.asnumpy().tolist(),
                             "ok": bool(ok.asnumpy())})

    weights = {}
    for label, network in (("audit_net", None), ("plain_net", plain_net())):
        step = audit.build_train_step("kfac", method, network)
        data = np.random.default_rng(1)
        for _ in range(3):
            x = Tensor(data.standard_normal((8, 2, 5, 5)).astype(np.float32))
            y = Tensor(np.asarray(data.integers(0, 3, 8), dtype=np.int32))
            step(x, y)
        weights[label] = {p.name: p.asnumpy().copy().tolist() for p in step.network.trainable_params()}
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"device": ms.get_context("device_target"), "method": method, "inverses": inverses,
                   "weights": weights}, handle)


if __name__ == "__main__":
    main()
