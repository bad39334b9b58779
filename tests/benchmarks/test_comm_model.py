"""Communication cost model: layer shapes and exact per-scheme numbers on a hand-sized example."""
import json

import pytest

from benchmarks import comm_model as cm
from benchmarks.comm_model import Layer


def test_resnet50_shapes():
    layers = cm.resnet50_layers()
    assert len(layers) == 54
    assert sum(l.params for l in layers) + cm.resnet50_other_params() == 25_557_032    # torchvision's count
    by_name = {l.name: l for l in layers}
    assert (by_name["conv1"].a_dim, by_name["conv1"].g_dim) == (147, 64)
    assert (by_name["layer4.2.conv2"].a_dim, by_name["layer4.2.conv2"].g_dim) == (4608, 512)
    assert (by_name["layer2.0.downsample"].a_dim, by_name["layer2.0.downsample"].g_dim) == (256, 512)
    assert (by_name["fc"].a_dim, by_name["fc"].g_dim) == (2049, 1000)
    assert sum(name.endswith("downsample") for name in by_name) == 4


def test_schemes_exact_on_two_layers():
    # x: a 3, g 2 (cost 35) -> rank 0; y: a 2, g 2 (cost 16) -> rank 1; 10 parameters = 40 gradient bytes
    layers = [Layer("x", 3, 2, 6), Layer("y", 2, 2, 4)]
    rows = {c.scheme: c for c in cm.model_costs(layers, 0, [2])[2]}
    ours = rows["ours (RS-V/AG-V)"]
    # triangles: x 6 + 3, y 3 + 3; a device sends every chunk but its own; max over ranks
    assert ours.factor_bytes == (15 - 6) * 4
    assert ours.gather_bytes == (10 - 4) * 4                  # gradient matrices x 6, y 4 floats
    assert ours.grad_allreduce_bytes == 40                    # 2 (N-1)/N * 40
    assert ours.inverse_flops == 35 and ours.precondition_flops == 60       # 2*4*3 + 2*2*9
    assert ours.memory_floats == 2 * (9 + 4)
    padded = rows["ours (padded RS/AG)"]
    assert (padded.factor_bytes, padded.gather_bytes) == (9 * 4, 6 * 4)
    cpu = rows["ours (CPU fallback)"]
    assert (cpu.factor_bytes, cpu.gather_bytes) == (15 * 4, 6 * 4)
    thor = rows["thor (whole)"]
    assert (thor.factor_bytes, thor.inverse_bytes) == (0, 21 * 4)
    assert thor.inverse_flops == 51 and thor.precondition_flops == 92 and thor.memory_floats == 21
    comm = rows["kaisa-comm-opt (f=1)"]
    assert (comm.factor_bytes, comm.inverse_bytes, comm.gather_bytes) == (21 * 4, (21 - 8) * 4, 0)
    assert comm.memory_floats == 42 and comm.precondition_flops == 92
    mem = rows["kaisa-mem-opt (f=1/N)"]
    assert (mem.factor_bytes, mem.gather_bytes, mem.memory_floats) == ((21 - 8) * 4, 6 * 4, 26)
    assert all(c.total_bytes == c.factor_bytes + c.inverse_bytes + c.gather_bytes + 40 for c in rows.values())


def test_one_device_communicates_nothing():
    for c in cm.model_costs([Layer("x", 3, 2, 6)], 5, [1])[1]:
        assert c.total_bytes == 0, c.scheme


def test_thor_split_blocks():
    layer = Layer("big", 300, 100, 30000)
    c = cm.scheme_thor([layer], 2, 0, split=128)
    assert c.memory_floats == 3 * 128 ** 2 + 100 ** 2
    assert c.inverse_flops == 3 * 128 ** 3 + 100 ** 3


def test_resnet50_many_devices_leave_ranks_idle_and_makespan_is_the_largest_layer():
    layers = cm.resnet50_layers()
    ours = cm.model_costs(layers, cm.resnet50_other_params(), [256])[256][0]
    assert ours.idle_ranks == 256 - 54
    assert ours.inverse_flops == 4608 ** 3 + 512 ** 3 == ours.extra["lower_bound"]


def test_cli_writes_json_and_markdown(tmp_path, capsys):
    cm.main(["--devices", "2,8", "--out", str(tmp_path), "--bandwidth-gbps", "8", "--tflops", "1"])
    payload = json.loads((tmp_path / "comm_model_resnet50.json").read_text())
    assert payload["assumptions"]["bandwidth_gbps"] == 8 and payload["assumptions"]["label"].startswith("projection")
    assert [r["scheme"] for r in payload["devices"]["8"]][:3] == ["ours (RS-V/AG-V)", "ours (padded RS/AG)",
                                                                 "ours (CPU fallback)"]
    row = payload["devices"]["2"][0]
    assert row["projected_comm_s"] == pytest.approx(row["total_bytes"] / 1e9)
    text = (tmp_path / "comm_model_resnet50.md").read_text()
    assert "## 8 devices" in text and "| thor (split 128) |" in text
    assert "## 2 devices" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cm.main(["--devices", "0"])
