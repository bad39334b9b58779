"""benchmarks.recipe_flops: the zoo recipes' arithmetic against hand counts of ResNet-50, the capture's
subsampling, and the ratios on hand-made totals."""
import math

import pytest

pytest.importorskip("yaml", reason="model zoo tests need pyyaml (pip install -e '.[test]')")

from benchmarks import recipe_flops  # noqa: E402


def resnet50_convolutions(image=224):
    """(input channels, output channels, kernel, output side) of ResNet-50 v1.5's 53 convolutions, written
    out from the architecture (He et al. 2016, the stride on the 3x3 convolution), not from the network."""
    side = image // 4                                     # after the 7x7/2 stem and the 3x3/2 max-pool
    layers = [(3, 64, 7, image // 2)]
    channels = 64
    for blocks, width, first_stride in ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)):
        for b in range(blocks):
            stride = first_stride if b == 0 else 1
            out_side = side // stride
            layers.append((channels, width, 1, side))
            layers.append((width, width, 3, out_side))
            layers.append((width, 4 * width, 1, out_side))
            if b == 0:
                layers.append((channels, 4 * width, 1, out_side))
            channels, side = 4 * width, out_side
    return layers


def test_resnet50_arithmetic_matches_the_architecture_by_hand():
    batch, classes = 32, 1000
    row = recipe_flops.measure("resnet50_imagenet2012_kfac_8p", batch, 224, classes)
    convs = resnet50_convolutions()
    assert len(convs) == 53 and row["layers"] == 54             # 53 convolutions and the classifier
    forward = sum(2 * batch * side * side * cin * k * k * cout for cin, cout, k, side in convs)
    forward += 2 * batch * 2048 * classes                       # the classifier's weight (its bias not counted)
    # 4.09 GMAC per image, as torchvision lists ResNet-50
    assert forward / batch / 2 == pytest.approx(4.09e9, rel=0.01)
    assert row["gflop"]["training"] * 1e9 == pytest.approx(3 * forward, rel=1e-9)
    capture = sum(2 * batch * side * side * ((cin * k * k) ** 2 + cout ** 2) for cin, cout, k, side in convs)
    capture += 2 * batch * ((2048 + 1) ** 2 + classes ** 2)      # the classifier's A has the bias column
    assert row["gflop"]["capture"] * 1e9 == pytest.approx(capture, rel=1e-9)
    precondition = sum(2 * cout * cout * cin * k * k + 2 * cout * (cin * k * k) ** 2 for cin, cout, k, side in convs)
    precondition += 2 * classes * classes * 2049 + 2 * classes * 2049 ** 2
    assert row["gflop"]["precondition"] * 1e9 == pytest.approx(precondition, rel=1e-9)
    # the recipe's schedule: factors every 10 steps, inverses every 100
    assert row["shares"]["capture"] + row["shares"]["refresh"] == pytest.approx(0.1)
    assert row["shares"]["refresh"] == pytest.approx(0.01)
    g = row["gflop"]
    expected = 1 + (g["precondition"] + 0.1 * g["capture"] + 0.01 * g["inverse"]) / g["training"]
    assert row["ratios"]["amortised"] == pytest.approx(expected)
    assert 1.35 < expected < 1.45                               # the capture is twice the training's arithmetic


def test_stat_stride_and_fraction_shrink_the_capture_only():
    base = recipe_flops.measure("cpu_smoke", 16, None, None)
    sub = recipe_flops.measure("cpu_smoke+kfac.stat_stride=2+kfac.stat_fraction=0.5", 16, None, None)
    assert sub["stat_stride"] == 2 and sub["stat_fraction"] == 0.5
    for phase in ("training", "precondition", "inverse"):
        assert sub["gflop"][phase] == base["gflop"][phase]
    assert 0 < sub["gflop"]["capture"] < base["gflop"]["capture"] / 2
    # one convolution's rows: 8 of 16 examples, every second position of a 7x7 output per axis
    assert recipe_flops.capture_rows(16, 49, True, 0.5, 2, (16, 8, 7, 7)) == 8 * 16
    assert recipe_flops.capture_rows(16, 1, False, 0.5, 2, (16, 10)) == 8       # a Dense layer has no positions
    assert recipe_flops.capture_rows(3, 1, False, 0.1, 1, (3, 10)) == 1         # at least one example


def test_momentum_adds_nothing_and_thor_blocks_cut_the_preconditioning():
    momentum = recipe_flops.measure("cpu_smoke", 16, None, None)
    assert momentum["optimizer"] == "kfac"           # cpu_smoke's own optimizer
    plain = recipe_flops.measure("cpu_smoke+optimizer=momentum", 16, None, None)
    assert plain["ratios"]["amortised"] == 1.0 and plain["gflop"]["capture"] == 0
    assert plain["gflop"]["training"] == momentum["gflop"]["training"]
    thor = recipe_flops.measure("cpu_smoke+optimizer=thor+thor.split_dim=4", 16, None, None)
    assert thor["split_dim"] == 4
    assert thor["gflop"]["precondition"] < momentum["gflop"]["precondition"]
    assert thor["gflop"]["inverse"] < momentum["gflop"]["inverse"]


def test_ratios_on_hand_made_totals():
    flops = {"training": 100.0, "precondition": 20.0, "capture": 160.0, "inverse": 40.0}
    fixed = recipe_flops.arithmetic_ratios(flops, {"plain": 0.9, "capture": 0.09, "refresh": 0.01})
    assert fixed["plain"] == pytest.approx(1.2) and fixed["full_refresh"] == pytest.approx(3.2)
    assert fixed["amortised"] == pytest.approx(1.2 + (160 * 0.1 + 40 * 0.01) / 100)
    assert fixed["goal_refresh_share"] is None
    adaptive = recipe_flops.arithmetic_ratios(dict(flops, precondition=10.0), None)
    assert adaptive["amortised"] is None
    # 1.1 + share * 2.0 = 1.2
    assert adaptive["goal_refresh_share"] == pytest.approx(0.05)
    assert recipe_flops.arithmetic_ratios(dict(flops, precondition=30.0), None)["goal_refresh_share"] is None
    assert math.isclose(recipe_flops.arithmetic_ratios(flops, None)["full_refresh"], 3.2)


def test_a_malformed_override_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        recipe_flops.main(["--config_path", "cpu_smoke+kfac.split_dim", "--out", ""])
    assert "kfac.split_dim" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recipe_flops.main(["--config_path", "cpu_smoke", "--batch_size", "0", "--out", ""])
    assert "--batch_size" in capsys.readouterr().err
