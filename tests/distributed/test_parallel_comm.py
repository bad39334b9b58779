"""Distributed engine pieces that run in one process: the collectives chosen per backend, the
graph-mode packing of factors and preconditioned gradients (checked against the NumPy reference
packers of tests/reference/numpy_packing.py), resolve() without communication, and check_checkpoint."""
from types import SimpleNamespace

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.parallel import check_checkpoint, checkpoint_layout, optimizer_layout
from mindspore_ngd.parallel.comm import Communicator, resolve
from mindspore_ngd.parallel.plan import WorkItem, plan_ownership
from nets import DenseNet
from reference.numpy_packing import pack_buffer, pack_symmetric, unpack_buffer

ITEMS = [("conv", 19, 3), ("fc1", 49, 6), ("fc2", 7, 3), ("fc3", 4, 2)]
# with an embedding (vocabulary 12, dimension 4): its A travels as the 12 diagonal entries, its step as (12, 4)
WITH_EMBEDDING = [WorkItem("embed", 12, 4, a_diagonal=True)] + [WorkItem.of(item) for item in ITEMS]


@pytest.mark.parametrize("backend, world, fraction, factors, gather", [
    ("mccl", 2, None, "AllReduce", "AllGather"),
    ("mccl", 4, 0.5, "AllReduce", "AllReduce (owner group)"),
    ("mccl", 2, 1, "AllReduce", None),
    ("nccl", 4, None, "ReduceScatter", "AllGather"),
    ("hccl", 4, 0.5, "AllReduce", "AllGather (owner group)"),
    ("hccl", 4, 1, "AllReduce", None),
])
def test_collectives_chosen_per_backend_and_fraction(backend, world, fraction, factors, gather):
    comm = Communicator(plan_ownership(ITEMS, world, fraction), rank=world - 1, backend=backend)
    assert comm.factor_collective == factors
    assert comm.gather_collective == gather
    text = comm.describe()
    assert text.startswith(f"parallel: world {world}, rank {world - 1}, backend {backend}, factors {factors}")
    if backend == "mccl" and world == 2 and fraction is None:
        assert text == ("parallel: world 2, rank 1, backend mccl, factors AllReduce fallback (no ReduceScatter "
                        "on CPU), preconditioned gradients AllGather, grad_worker_fraction 1/2; this rank owns "
                        "3 of 4 layers")


class _Packer(nn.Cell):
    """Rank-side packing in a graph: factors -> buffer -> this rank's chunk -> owned (A, G)."""

    def __init__(self, par):
        super().__init__()
        self.par = par

    def construct(self, a, g, pre):
        flat = self.par.pack_factors(a, g)
        start = self.par.factor_starts[self.par.position]
        chunk = flat[start:start + self.par.factor_layout.chunk]
        owned = ()
        for k in range(self.par.num_layers):
            if self.par.owned[k]:
                owned += (self.par.unpack_factor(chunk, k, 0), self.par.unpack_factor(chunk, k, 1))
        return flat, owned, self.par.placed(self.par.pack_preconditioned(pre))


def _symmetric(rng, dim):
    x = rng.standard_normal((dim, dim)).astype(np.float32)
    return x + x.T


@pytest.mark.parametrize("world, fraction, backend, items", [
    (2, None, "mccl", ITEMS), (3, None, "mccl", ITEMS), (4, 0.5, "mccl", ITEMS), (2, 1, "mccl", ITEMS),
    (3, None, "nccl", ITEMS), (2, None, "mccl", WITH_EMBEDDING), (3, None, "nccl", WITH_EMBEDDING)])
def test_graph_packing_matches_the_numpy_packers(world, fraction, backend, items):
    rng = np.random.default_rng(world)
    plan = plan_ownership(items, world, fraction)
    items = plan.items
    a = [rng.standard_normal(it.a_dim).astype(np.float32) if it.a_diagonal else _symmetric(rng, it.a_dim)
         for it in items]
    g = [_symmetric(rng, it.g_dim) for it in items]
    pre = [rng.standard_normal(it.matrix_shape).astype(np.float32) for it in items]
    layout = plan.factor_layout()
    parts = [[v for i in plan.items_at(p)
              for v in (a[i] if items[i].a_diagonal else pack_symmetric(a[i]), pack_symmetric(g[i]))]
             for p in range(plan.group_size)]
    if backend == "nccl":                         # ReduceScatter: equal zero-padded chunks
        expected = pack_buffer(layout, parts)
    else:                                         # AllReduce: the positions' parts back to back
        expected = np.concatenate([v for part in parts for v in part])
    gathered = np.zeros(plan.gradient_layout().total, np.float32)
    for rank in range(plan.group_size):           # the ranks of owner group 0
        comm = Communicator(plan, rank, backend)
        mine = [k for k in range(len(items)) if comm.owned[k]]
        flat, owned, placed = _Packer(comm.ops(create_groups=False))(tuple(Tensor(m) for m in a), tuple(Tensor(m) for m in g),
                                                  tuple(Tensor(pre[k]) for k in mine))
        np.testing.assert_array_equal(flat.asnumpy(), expected)
        for j, k in enumerate(mine):              # unpacking symmetrises the triangle exactly
            np.testing.assert_array_equal(owned[2 * j].asnumpy(), a[k])
            np.testing.assert_array_equal(owned[2 * j + 1].asnumpy(), g[k])
        gathered += placed.asnumpy()              # what the owner-group AllReduce (or AllGather) delivers
    chunks = unpack_buffer(plan.gradient_layout(), gathered)
    for p in range(plan.group_size):
        for j, k in enumerate(plan.items_at(p)):
            np.testing.assert_array_equal(chunks[p][j].reshape(pre[k].shape), pre[k])


class _Unpack(nn.Cell):
    def __init__(self, par):
        super().__init__()
        self.par = par

    def construct(self, gathered):
        return self.par.unpack_preconditioned(gathered)


@pytest.mark.parametrize("items", [ITEMS, WITH_EMBEDDING])
def test_unpack_preconditioned_gives_every_layer(items):
    rng = np.random.default_rng(0)
    plan = plan_ownership(items, 2)
    pre = [rng.standard_normal(it.matrix_shape).astype(np.float32) for it in plan.items]
    buffer = pack_buffer(plan.gradient_layout(), [[pre[i] for i in plan.items_at(p)] for p in range(2)])
    out = _Unpack(Communicator(plan, 0, "mccl").ops())(Tensor(buffer))
    for k, matrix in enumerate(pre):
        np.testing.assert_array_equal(out[k].asnumpy(), matrix)


def test_without_communication_the_optimizer_is_single_device():
    net = DenseNet()
    opt = ngd.KFAC(net, learning_rate=0.1, verbose=False)
    assert opt.parallel_plan is None and opt.communicator is None and opt.parallel_state() is None
    assert opt.owned_layers == ("fc1", "fc2")
    assert not [p.name for p in opt.get_parameters() if ".parallel." in p.name]
    assert resolve("auto", opt.layer_specs) is None
    assert resolve(False, opt.layer_specs) is None
    with pytest.raises(RuntimeError, match=r"distributed=True needs mindspore.communication.init\(\)"):
        ngd.KFAC(DenseNet(), learning_rate=0.1, distributed=True, verbose=False)


# ------------------------------------------------------------------ checkpoints
def _record(prefix, world, workers, position, positions):
    def value(v):
        return ms.Parameter(Tensor(np.asarray(v, np.int32)), name="x", requires_grad=False)
    return {f"{prefix}.parallel.world_size": value(world), f"{prefix}.parallel.grad_workers": value(workers),
            f"{prefix}.parallel.position": value(position), f"{prefix}.parallel.owner_positions": value(positions),
            f"{prefix}.fc1.A": value(np.zeros((1, 1)))}


def _fake_distributed(world, rank, fraction=None):
    """What check_checkpoint reads from a distributed optimizer (names, plan, communicator)."""
    specs = [SimpleNamespace(name="fc1", a_dim=6, g_dim=4), SimpleNamespace(name="fc2", a_dim=5, g_dim=3)]
    plan = plan_ownership(specs, world, fraction)
    return SimpleNamespace(policy=SimpleNamespace(name="kfac"), layer_specs=specs, parallel_plan=plan,
                           communicator=Communicator(plan, rank, "mccl"))


def test_check_checkpoint_accepts_the_same_layout_and_weights_only_files(tmp_path):
    opt = _fake_distributed(2, 1)
    layout = optimizer_layout(opt)
    assert layout == {"world_size": 2, "grad_workers": 1, "position": 1, "owner_positions": (0, 1)}
    check_checkpoint(opt, _record("kfac", 2, 1, 1, [0, 1]))
    check_checkpoint(opt, {"fc1.weight": ms.Parameter(Tensor(np.zeros(2, np.float32)), name="w")})
    # a real single-device optimizer checkpoint round trip
    net = DenseNet()
    single = ngd.KFAC(net, learning_rate=0.1, verbose=False)
    path = str(tmp_path / "opt.ckpt")
    ms.save_checkpoint(single, path)
    saved = ms.load_checkpoint(path)
    assert checkpoint_layout(saved, "kfac") == {"world_size": 1, "grad_workers": 1, "position": 0,
                                                "owner_positions": (0, 0)}
    check_checkpoint(single, saved)


def test_check_checkpoint_rejects_another_world_size_ownership_or_rank(tmp_path):
    opt = _fake_distributed(2, 0)
    with pytest.raises(ValueError) as info:
        check_checkpoint(opt, _record("kfac", 4, 1, 0, [0, 1]))
    text = str(info.value)
    assert text.startswith("checkpoint was written by 4 ranks (1 owner(s) per layer; ownership position 0: fc1; "
                           "position 1: fc2; this file: position 0); this run has 2 ranks")
    assert "resume with the same world size" in text and "drop the optimizer state and keep the weights" in text
    with pytest.raises(ValueError, match=r"checkpoint was written by 2 ranks \(2 owner\(s\) per layer"):
        check_checkpoint(opt, _record("kfac", 2, 2, 0, [0, 0]))
    with pytest.raises(ValueError, match=r"holds the state of owner position 1, this rank is at position 0"):
        check_checkpoint(opt, _record("kfac", 2, 1, 1, [0, 1]))
    with pytest.raises(ValueError, match=r"holds kfac state of 3 preconditioned layers, this optimizer has 2"):
        check_checkpoint(opt, _record("kfac", 2, 1, 0, [1, 0, 0]))
    # a single-device optimizer and a checkpoint of a distributed run (and the other way round)
    single = ngd.KFAC(DenseNet(), learning_rate=0.1, verbose=False)
    with pytest.raises(ValueError, match=r"checkpoint was written by 2 ranks .* this run has 1 process"):
        check_checkpoint(single, _record("kfac", 2, 1, 0, [1, 0]))
    path = str(tmp_path / "single.ckpt")
    ms.save_checkpoint(single, path)
    with pytest.raises(ValueError, match=r"checkpoint was written by 1 process; this run has 2 ranks"):
        check_checkpoint(opt, ms.load_checkpoint(path))
