"""The memory guards of issue 33: a natural-gradient step's resident memory may grow with the number of
preconditioned layers only about as fast as the layers' Kronecker factors do, and with the batch only
about as fast as the activations do.

The step's graph once held about six factor-sized buffers per guarded choice (``ops.where`` with a 0-d
condition), four per broadcast product and two per Transpose kernel, for the life of the process: a
K-FAC step on a stack of Dense layers of width 2048 grew by 47 MB of peak resident memory per MB of
factors added, and the model zoo's ResNet-50 recipes were killed before their first step. The test
measures the growth between 2 and 4 Dense layers of width 1024 (each layer adds 8 MB of factors), with
Momentum's own growth (weights, gradients, moments) taken off, in fresh processes
(:mod:`benchmarks.memory`, whose first step captures and inverts). Measured on 2026-11-26: 12.8 MB per
MB of factors; on 2026-11-27, with the factor-sized quotients on ``RealDiv`` (``_graph.divide``) and the
layers inverted one after another: 10.7; later that day, with the transposes on ``mint.permute`` and each
layer's inverses written as soon as they are computed: 9.3; with each layer's fold written as soon as it is
folded: 7.5. The stored state alone (factors, inverses, the capture's batch buffers) is 3, and what
MindSpore's compiler keeps of the graph (about 30 MB per layer, whatever its size) about 3.5.
"""
from benchmarks import memory

# the bound: below the growth before each layer's fold was written at once (9.3), with room for the
# resident set's noise (a few MB on 16 MB of factors) above the 7.5 measured since; far below the
# unguarded kernels (47)
GROWTH_BOUND = 9.0


def _peak(optimizer, layers):
    args = memory.parse(["--model", "mlp", "--layers", str(layers), "--width", "1024", "--steps", "2"])
    result = memory.measure(args, optimizer)
    assert "error" not in result, result
    return result


def test_step_memory_grows_with_the_layers_no_faster_than_a_few_times_their_factors():
    small, large = _peak("kfac", 2), _peak("kfac", 4)
    base_small, base_large = _peak("momentum", 2), _peak("momentum", 4)
    assert large["layers"] == 5 and small["layers"] == 3
    for result in (small, large):
        assert all(abs(loss) < 1e3 for loss in result["losses"]), result
    added_factors = large["factors_mb"] - small["factors_mb"]
    growth = (large["peak_mb"] - small["peak_mb"]) - (base_large["peak_mb"] - base_small["peak_mb"])
    ratio = growth / added_factors
    assert ratio <= GROWTH_BOUND, (
        f"the K-FAC step's peak resident memory grew by {growth:.0f} MB for {added_factors:.0f} MB of added "
        f"factors ({ratio:.1f} MB per MB; bound {GROWTH_BOUND}): a kernel that keeps factor-sized buffers? "
        f"(see mindspore_ngd/_graph.py)")


# the bound for the BatchNorm capture: MB of peak growth per MB of added BatchNorm activations (float32),
# Momentum's own growth taken off. Measured 2026-11-29 (4 conv-BatchNorm blocks of 32 channels at 64x64,
# batch 4 -> 16): 27.1 while the capture's broadcasting Add/Sub/Mul kept 16 bytes per element each
# (factors.spread), 6.2 since
ACTIVATION_BOUND = 12.0


def test_the_batchnorm_capture_grows_with_the_batch_about_as_its_activations_do():
    """SP-NGD's unit-wise BatchNorm capture works on activation-sized tensors; its step may need a few
    copies of them, but no kernel may keep per-element memory for the life of the graph (issue 33: the
    zoo's SP-NGD recipe was killed at 224x224 because six broadcasting operations per BatchNorm layer
    kept 96 bytes per activation element)."""
    def peak(optimizer, batch):
        args = memory.parse(["--model", "convbn", "--layers", "4", "--width", "32", "--image", "64",
                             "--batch", str(batch), "--steps", "2"])
        result = memory.measure(args, optimizer)
        assert "error" not in result, result
        return result["peak_mb"]

    added = 4 * (16 - 4) * 32 * 64 * 64 * 4 / 2 ** 20          # BatchNorm outputs, float32 MB
    growth = (peak("spngd", 16) - peak("spngd", 4)) - (peak("momentum", 16) - peak("momentum", 4))
    ratio = growth / added
    assert ratio <= ACTIVATION_BOUND, (
        f"SP-NGD's peak resident memory grew by {growth:.0f} MB for {added:.0f} MB of added BatchNorm "
        f"activations ({ratio:.1f} MB per MB; bound {ACTIVATION_BOUND}): a broadcasting kernel that keeps "
        f"per-element indices? (see mindspore_ngd.curvature.factors.spread)")
