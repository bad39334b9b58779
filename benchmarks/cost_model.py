"""Per-layer cost model of the natural-gradient optimizers, the arithmetic floor, and the step time.

    python -m benchmarks.cost_model [--models resnet20,convbn,digits-bn,fmnist-mlp,fmnist-mlp-b1024]
                                    [--optimizers momentum,momentum-cf,kfac,kfac-P/P,spngd,thor,thor+lean]
                                    [--rounds 1]
                                    [--period 20] [--spngd-warmup 20] [--data-batches 4] [--data digits]
                                    [--graphs 3] [--repeats 5]
                                    [--batch 128,1024,4096] [--out results/]
    python -m benchmarks.cost_model --compile [--optimizers momentum,kfac,spngd,thor] [--config cpu_smoke]
                                    [--batch N] [--phases] [--out results/]

A kind with the suffix ``+lean`` (``kfac-P/P+lean``, ``spngd+lean``, ``thor+lean``) is the same optimizer
trained with :class:`mindspore_ngd.NGDTrainOneStepCell`, whose steps that capture nothing run a
second, lean graph; the table adds both compile times to its name (the first call, and the first
lean step: the lean graph's compilation plus one step).

**FLOP model.** For every layer the optimizer preconditions (``opt.layer_specs``: kind, ``a_dim`` =
fan-in (+1 with a bias), ``g_dim`` = outputs, kernel/stride/padding) and its number of output positions
``T`` per example (1 for Dense; recorded with forward hooks in one PyNative forward pass), with batch B:

* training: forward ``2 B T g (a - bias)``, backward twice that (dX and dW);
* capture (per capture step): A ``2 B T a^2`` (for a convolution after the im2col, a copy without
  arithmetic), G ``2 B T g^2``;
* inversion (per refresh): ``INVERSE_FLOPS_PER_CUBE * D^3`` per factor, with the constant 1 of a
  Cholesky-based inverse done by LAPACK (potrf D^3/3 + potri 2D^3/3); the package's path
  (cholesky, triangular solve against the identity, L^-T L^-1) performs about 3.3 D^3. THOR's
  ``split_dim`` blocks: ``count * s^3`` (the last block padded to s);
* preconditioning (every step): ``2 g^2 a + 2 g a^2`` for dense inverses, ``2 count_G s_G^2 a +
  2 g count_A s_A^2`` for block-diagonal ones.

Amortised: capture FLOPs times the capture rate, inversion FLOPs times the inversion rate (K-FAC
``1/1`` and ``1/P``; ``kfac-P/P`` and THOR ``1/P`` and ``1/P``; SP-NGD the rates it actually
showed in the timed steps, per statistic). Not modelled: the moving average, the checks of the
factors, the damping traces, KL clipping, SP-NGD's unit-wise BatchNorm Fisher (all O(D^2) or
smaller), and the momentum update that Momentum pays too.

**Floor.** What a perfect implementation of the same algorithm would cost, in time:
``floor(step) = T_momentum + sum over the kernels run on that step of their standalone time``. Each
kernel (A capture with its im2col, G capture, the Cholesky inverse of A and of G, the
preconditioning ``G^-1 dW A^-1``) is a tiny graph-mode Cell at the layer's shape, timed as the
median over ``--repeats`` calls after a compiling call, minus the median time of an empty call
(launch overhead; never below 0). Which kernels run on a step follows the optimizer's schedule
(SP-NGD: the statistics it refreshed on that very step, read after every timed step). The floor is
aggregated like the measured steps: median over non-refresh steps, and mean over all timed steps
(amortised). ``measured - floor`` is the overhead to cut; the table gives it on non-refresh steps
and amortised.

**Batch size (``--batch``).** Each model at each of the given batch sizes (default: its own). The
training arithmetic grows with the batch, the preconditioning does not (it depends on the layer's
shape only), and the capture grows with it too: the sizes at which an optimizer's step comes close to
Momentum's show where natural gradient can pay for itself per example.

**Measured.** One training cell per optimizer, same network and batches, interleaved rounds of
``--period`` steps as in :mod:`benchmarks.step_time`, after a warm-up of one period (SP-NGD:
``--spngd-warmup`` more steps, so that its adaptive intervals, which start at 1, have grown).
Synthetic inputs (``--data-batches`` random batches, cycled; the step time does not depend on the
data). SP-NGD's refresh decisions do depend on how much the statistics move, so its refresh rate
on synthetic data is not that of a real data set: with several random batches (random labels) its
statistics keep moving and it refreshes nearly every step, with one fixed batch
(``--data-batches 1``) they settle and its intervals grow. Its amortised figure needs many periods
(intervals grow to ``max_interval`` = 64 steps): pass more ``--rounds`` and ``--spngd-warmup``.
The floor uses the refreshes SP-NGD actually made, so measured and floor stay comparable.

**Baseline.** ``momentum`` is the stock ``nn.Momentum``; ``momentum-cf`` is the same update with one
never-taken run-time branch in its graph (:mod:`benchmarks.baselines`). On MindSpore 2.10's CPU
runtime a graph without a run-time branch often runs at the speed of one core, while a graph with one
(every natural-gradient step) runs at the speed of two; on small networks the stock Momentum's
median can be 1.2-1.8x its branched twin's. With both named, every ratio and floor divides by the
faster median, and the tables say which it was and give the other.

**Several graphs (``--graphs N``).** The same convolutions can run up to 30 % apart in two graphs
of one process (measured: a conv+BatchNorm net's Momentum graph slower than every natural-gradient
graph running the same convolutions), which is more than the engine's own cost on ResNet-20. With
``N`` > 1 each optimizer trains ``N`` independent cells, each its own graph, timed in turn in every
round; the medians pool their steps, and a table gives each graph's median, so the spread is seen.

**Real data (``--data digits``).** The digits CNN (``digits-bn``) can instead train on scikit-learn's
digits, the training split of :func:`benchmarks.data.digits_arrays` in one fixed shuffled order,
batches cycled epoch after epoch (``--data-batches`` is then unused). Its statistics then settle as
in training, so SP-NGD's intervals and refresh rate are those of a real run; pass a warm-up of a few
epochs (``--spngd-warmup 200``: 22 batches of 64 per epoch). Every optimizer sees the same batches.

**Compile (``--compile``).** The model zoo's ``cpu_smoke`` network and optimizers (or another zoo
``--config``, ``{optimizer}`` substituted, e.g. ``resnet50_imagenet2012_{optimizer}_8p`` at a small
``--batch``), built by the zoo's own factory (``model_zoo/resnet50/benchmark.py``): the compilation alone
(``Cell.compile``, with the ratio to Momentum's), step 0 (which refreshes every factor and
inverse) and the median of a few later steps, for each optimizer. The kind ``momentum+capture`` is
``nn.Momentum`` training the network with K-FAC's capture attached and every capture flag on: what capturing the statistics inside the training
graph adds to the compile before the optimizer does anything (a floor for every optimizer here).
``--phases`` compiles each optimizer once more in a child process with MindSpore's verbose log on (``VLOG_v=1``) and reads the compiler's own timings of its phases from it
(``[MsProfile]`` lines: ``type_inference``, ``optimize``, ``task_emit``, ...). The log slows the
child down, so the phases are read as shares, not added to the first call.

Results are printed as Markdown tables and saved as JSON (:func:`benchmarks.save_results`).
"""
import argparse
import dataclasses
import itertools
import os
import re
import subprocess
import sys
import time
from typing import Optional

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import nn, ops, Tensor  # noqa: E402

from mindspore_ngd.capture.layer_types import geometry_of, layer_type_of  # noqa: E402
from mindspore_ngd.curvature.blocks import BlockLayout, apply_left, apply_right  # noqa: E402
from mindspore_ngd.curvature.factors import same_padding  # noqa: E402,F401  (the capture's own padding rule)
from mindspore_ngd.curvature.inverse import damped_inverse  # noqa: E402
from mindspore_ngd.curvature.registry import (INVERSE_FLOPS_PER_CUBE, block_layout,  # noqa: E402,F401
                                              block_type_of, inverse_flops, precondition_flops)

from . import save_results  # noqa: E402
from .baselines import MOMENTUM_KINDS, momentum_baseline  # noqa: E402

DEFAULT_PERIOD = 20
THOR_SPLIT_DIM = 128            # THOR's default split_dim
DATA_BATCHES = 4                # distinct synthetic batches, cycled
DATA_SOURCES = ("synthetic", "digits")
DIGITS_SHAPE = (1, 8, 8)        # the input of the models that can train on the digits (--data digits)
GIGA = 1e9


# ---------------------------------------------------------------------------------------- networks
def fmnist_mlp_net(num_classes=10):
    """DeepOBS Fashion-MNIST MLP (:func:`benchmarks.models.fmnist_mlp`), on (N, 1, 28, 28) images."""
    from .models import fmnist_mlp
    return fmnist_mlp(num_classes)


def _resnet20():
    from .models import resnet20
    return resnet20()


def _convbn():
    from .models import ConvBNNet
    return ConvBNNet()


def _digits_bn():
    from .models import DigitsCNN
    return DigitsCNN(batchnorm=True)


def _tiny_mlp():
    from .models import MLP
    return MLP((16, 10))


MODELS = {
    # name: (constructor, input shape without batch, batch size)
    "resnet20": (_resnet20, (3, 32, 32), 128),
    "convbn": (_convbn, (3, 32, 32), 32),
    "digits-bn": (_digits_bn, (1, 8, 8), 64),
    "fmnist-mlp": (fmnist_mlp_net, (1, 28, 28), 128),
    "fmnist-mlp-b1024": (fmnist_mlp_net, (1, 28, 28), 1024),
    "tiny-mlp": (_tiny_mlp, (16,), 8),           # one Dense layer, for the tests
}
DEFAULT_MODELS = ("resnet20", "convbn", "digits-bn", "fmnist-mlp", "fmnist-mlp-b1024")
# "+lean": trained with mindspore_ngd.NGDTrainOneStepCell (a lean graph for the steps that capture nothing)
LEAN = "+lean"
OPTIMIZERS = ("momentum", "momentum-cf", "kfac", "kfac-P/P", "spngd", "thor", "kfac-P/P" + LEAN, "spngd" + LEAN,
              "thor" + LEAN)
# first-order baselines; the ratios divide by the faster one's median (benchmarks/baselines.py: the
# stock Momentum graph, without a run-time branch, often runs at the speed of one core)
BASELINES = MOMENTUM_KINDS


# ---------------------------------------------------------------------------------------- schedules
@dataclasses.dataclass(frozen=True)
class Schedule:
    """When an optimizer captures statistics and inverts factors; None intervals: measured (SP-NGD)."""
    capture_interval: Optional[int]
    inverse_interval: Optional[int]
    split_dim: Optional[int] = None

    @property
    def adaptive(self):
        return self.capture_interval is None


def base_kind(optimizer):
    """The optimizer kind without the ``+lean`` training-step suffix."""
    return optimizer[:-len(LEAN)] if optimizer.endswith(LEAN) else optimizer


def schedule_of(optimizer, period):
    optimizer = base_kind(optimizer)
    return {"kfac": Schedule(1, period), "kfac-P/P": Schedule(period, period),
            "thor": Schedule(period, period, THOR_SPLIT_DIM), "spngd": Schedule(None, None)}[optimizer]


def build_cell(model_name, optimizer, period, seed=0, kl_clip=None):
    """``(training cell, optimizer)`` for one model and one optimizer kind (``kl_clip``: given to every
    natural-gradient optimizer; None keeps each one's default: K-FAC and SP-NGD 1e-3, THOR none). A kind
    ending in ``+lean`` trains with :class:`mindspore_ngd.NGDTrainOneStepCell` instead of
    ``nn.TrainOneStepCell``."""
    from mindspore_ngd import KFAC, SPNGD, THOR, NGDTrainOneStepCell
    lean, optimizer = optimizer.endswith(LEAN), base_kind(optimizer)
    ms.set_seed(seed)
    net = MODELS[model_name][0]()
    common = {"learning_rate": 0.01, "damping": 1e-2, "verbose": False}
    if kl_clip is not None:
        common["kl_clip"] = kl_clip
    if optimizer in BASELINES:
        opt = momentum_baseline(optimizer, net.trainable_params(), 0.01)
    elif optimizer == "kfac":
        opt = KFAC(net, factor_update_interval=1, inverse_update_interval=period, **common)
    elif optimizer == "kfac-P/P":
        opt = KFAC(net, factor_update_interval=period, inverse_update_interval=period, **common)
    elif optimizer == "spngd":
        opt = SPNGD(net, **common)
    elif optimizer == "thor":
        opt = THOR(net, frequency=period, **common)
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {OPTIMIZERS}")
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = NGDTrainOneStepCell if lean else nn.TrainOneStepCell
    cell = step(nn.WithLossCell(net, loss), opt)
    cell.set_train()
    return cell, opt


# ---------------------------------------------------------------------------------------- FLOP model
def layer_flops(spec, batch, positions, split_dim=None):
    """FLOPs of one layer: forward, backward (per step), capture of A and G (per capture),
    inversion of A and G (per refresh) and preconditioning (per step), by the block type of its kind
    (:meth:`mindspore_ngd.curvature.registry.KroneckerType.flops`)."""
    return block_type_of(spec).flops(spec, batch, positions, split_dim)


def layer_geometry(model_name, specs, batch=2):
    """``{layer: {"input": shape, "output": shape, "positions": T}}`` from one PyNative forward pass
    of a fresh network of ``model_name`` with forward hooks (shapes at batch ``batch``; T does not
    depend on it)."""
    ctor, shape, _ = MODELS[model_name]
    return network_geometry(ctor, shape, specs, batch)


def network_geometry(make_network, input_shape, specs, batch=2):
    """:func:`layer_geometry` of the network ``make_network()`` builds, on zero inputs of shape
    ``(batch,) + input_shape`` (the network is built and called in PyNative mode)."""
    names = {s.name for s in specs}
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        net = make_network()
        seen, handles = {}, []
        for name, cell in net.cells_and_names():
            if name in names:
                handles.append(cell.register_forward_hook(
                    lambda c, inputs, output, name=name: seen.__setitem__(
                        name, (tuple(inputs[0].shape), tuple(output.shape)))))
        net(Tensor(np.zeros((batch,) + tuple(input_shape), np.float32)))
        for handle in handles:
            handle.remove()
    finally:
        ms.set_context(mode=mode)
    geometry = {}
    for s in specs:
        if s.name not in seen:
            raise RuntimeError(f"layer {s.name} was not called in the forward pass")
        x_shape, y_shape = seen[s.name]
        positions = layer_type_of(s).positions_per_example(x_shape, y_shape, batch)
        geometry[s.name] = {"input": x_shape, "output": y_shape, "positions": int(positions)}
    return geometry


# ---------------------------------------------------------------------------------------- kernels
class _FirstEntry(nn.Cell):
    """The first entry of a kernel's result: reading it back waits for the kernel without copying the
    whole result to the host (ms.runtime.synchronize is not supported on CPU)."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def construct(self, *args):
        return self.kernel(*args).reshape(-1)[:1]


class _Empty(nn.Cell):
    def construct(self, x):
        return x * 1.0


class _CaptureA(nn.Cell):
    """A of one layer from its input, by the capture's own formula (its layer type's, over
    :mod:`mindspore_ngd.curvature.factors`)."""

    def __init__(self, spec):
        super().__init__()
        self.input_factor = layer_type_of(spec).input_factor
        self.geometry = geometry_of(spec)
        self.has_bias = spec.has_bias

    def construct(self, x):
        return self.input_factor(x, self.geometry, self.has_bias, 1.0, 1)


class _CaptureG(nn.Cell):
    """G of one layer from its output gradient, by the capture's own formula."""

    def __init__(self, spec):
        super().__init__()
        self.output_factor = layer_type_of(spec).output_factor

    def construct(self, dy):
        return self.output_factor(dy, 1.0, 1.0, 1)


class _Inverse(nn.Cell):
    """The engine's Cholesky inverse (:func:`mindspore_ngd.curvature.inverse.damped_inverse`, the CPU
    path) of one SPD matrix (D, D) or a stack of blocks (nb, s, s)."""

    def construct(self, m):
        return damped_inverse(m, 0.0, "cholesky", 0.0)[0]


class _Precondition(nn.Cell):
    """``blockdiag(G^-1) dW blockdiag(A^-1)`` as :meth:`KroneckerBlock.precondition` computes it (one
    block: the dense product)."""

    def __init__(self, g_dim, a_dim, split_dim):
        super().__init__()
        self.g_layout = BlockLayout.of(g_dim, split_dim)
        self.a_layout = BlockLayout.of(a_dim, split_dim)

    def construct(self, g_inv, grad, a_inv):
        return apply_right(apply_left(g_inv, grad, self.g_layout), a_inv, self.a_layout)


def _spd(count, size, rng):
    r = rng.standard_normal((count, size, size)).astype(np.float32)
    m = r @ r.transpose(0, 2, 1) / size + np.eye(size, dtype=np.float32)
    return Tensor(m[0] if count == 1 else m)


class KernelTimer:
    """Standalone kernel times (seconds, launch overhead subtracted), cached by kernel and shape."""

    def __init__(self, repeats=5, budget_s=2.0):
        self.repeats, self.budget_s = repeats, budget_s
        self.cache = {}
        self.rng = np.random.default_rng(0)
        self.overhead = 0.0
        self.overhead = self._time(_Empty(), (Tensor(np.ones((1,), np.float32)),), repeats=max(20, repeats))

    def _time(self, cell, args, repeats=None):
        repeats = repeats or self.repeats
        cell = _FirstEntry(cell)
        cell(*args).asnumpy()                            # the compiling call
        times, start_all = [], time.perf_counter()
        for _ in range(repeats):
            start = time.perf_counter()
            cell(*args).asnumpy()
            times.append(time.perf_counter() - start)
            if len(times) >= 3 and time.perf_counter() - start_all > self.budget_s:
                break
        return max(float(np.median(times)) - self.overhead, 0.0)

    def _cached(self, key, make):
        if key not in self.cache:
            cell, args = make()
            self.cache[key] = self._time(cell, args)
        return self.cache[key]

    def capture_a(self, spec, geometry, batch):
        x_shape = layer_type_of(spec).statistic_shape((batch,) + tuple(geometry["input"][1:]))
        key = ("A", spec.kind, x_shape, spec.kernel_size, spec.stride, spec.dilation, spec.pad_mode, spec.padding,
               spec.has_bias)
        return self._cached(key, lambda: (_CaptureA(spec), (
            Tensor(self.rng.standard_normal(x_shape).astype(np.float32)),)))

    def capture_g(self, spec, geometry, batch):
        y_shape = layer_type_of(spec).statistic_shape((batch,) + tuple(geometry["output"][1:]))
        key = ("G", spec.kind, y_shape)
        return self._cached(key, lambda: (_CaptureG(spec), (
            Tensor(self.rng.standard_normal(y_shape).astype(np.float32)),)))

    def inverse(self, dim, split_dim):
        count, size = block_layout(dim, split_dim)
        return self._cached(("inv", count, size), lambda: (_Inverse(), (_spd(count, size, self.rng),)))

    def precondition(self, g_dim, a_dim, split_dim):
        g_count, g_size = block_layout(g_dim, split_dim)
        a_count, a_size = block_layout(a_dim, split_dim)
        return self._cached(("pre", g_dim, a_dim, split_dim if (g_count > 1 or a_count > 1) else None), lambda: (
            _Precondition(g_dim, a_dim, split_dim),
            (_spd(g_count, g_size, self.rng), Tensor(self.rng.standard_normal((g_dim, a_dim)).astype(np.float32)),
             _spd(a_count, a_size, self.rng))))

    def layer(self, spec, geometry, batch, split_dim):
        return {"capture_a": self.capture_a(spec, geometry, batch), "capture_g": self.capture_g(spec, geometry, batch),
                "inverse_a": self.inverse(spec.a_dim, split_dim), "inverse_g": self.inverse(spec.g_dim, split_dim),
                "precondition": self.precondition(spec.g_dim, spec.a_dim, split_dim)}


# ---------------------------------------------------------------------------------------- per-step events
def fixed_events(schedule, num_layers, steps, first_step):
    """Per timed step: (A captured per layer, G captured per layer, inverted per layer)."""
    events = []
    for i in range(steps):
        step = first_step + i
        cap = step % schedule.capture_interval == 0
        inv = step % schedule.inverse_interval == 0
        events.append(([cap] * num_layers, [cap] * num_layers, [inv] * num_layers))
    return events


def spngd_counts(opt):
    state = opt.refresh_state()
    return {name: state[name][2] for name in opt.statistic_names}


def spngd_event(opt, before, after):
    names = [s.name for s in opt.layer_specs]
    a = [after[f"{n}.A"] > before[f"{n}.A"] for n in names]
    g = [after[f"{n}.G"] > before[f"{n}.G"] for n in names]
    return a, g, [x or y for x, y in zip(a, g)]


def is_refresh(event):
    """A step that captured or inverted anything beyond what every step does."""
    return any(event[2]) or (any(event[0]) or any(event[1]))


def extra_seconds(event, kernel_times):
    """Standalone time of the extra kernels of one step, split by component."""
    out = {"capture": 0.0, "inverse": 0.0, "precondition": 0.0}
    for k, times in enumerate(kernel_times):
        out["capture"] += times["capture_a"] * event[0][k] + times["capture_g"] * event[1][k]
        out["inverse"] += (times["inverse_a"] + times["inverse_g"]) * event[2][k]
        out["precondition"] += times["precondition"]
    return out


# ---------------------------------------------------------------------------------------- benchmark
def data_error(data, models):
    """Why ``data`` cannot feed ``models`` (the digits need models with 1x8x8 inputs), or None."""
    unfit = [m for m in models if data == "digits" and tuple(MODELS[m][1]) != DIGITS_SHAPE]
    if not unfit:
        return None
    return f"--data digits needs models with {DIGITS_SHAPE} inputs (digits-bn), got {', '.join(unfit)}"


def _batches(model_name, count=DATA_BATCHES, batch=None, data="synthetic"):
    """The (inputs, labels) batches of ``batch`` examples (default: the model's), cycled by every
    optimizer alike: ``count`` distinct synthetic ones, or with ``data="digits"`` one epoch of the
    digits training split in a fixed shuffled order (the last partial batch dropped)."""
    _, shape, default = MODELS[model_name]
    batch = batch or default
    if data not in DATA_SOURCES:
        raise ValueError(f"data must be one of {DATA_SOURCES}, got {data!r}")
    if data == "digits":
        error = data_error(data, (model_name,))
        if error:
            raise ValueError(error)
        from .data import digits_arrays
        x, y = digits_arrays()[:2]
        if batch > len(y):
            raise ValueError(f"batch must be <= {len(y)} (the digits training split) with data='digits', got {batch}")
        order = np.random.default_rng(0).permutation(len(y))
        return [(Tensor(x[order[i:i + batch]]), Tensor(y[order[i:i + batch]]))
                for i in range(0, len(y) - batch + 1, batch)]
    rng = np.random.default_rng(0)
    return [(Tensor(rng.standard_normal((batch,) + tuple(shape)).astype(np.float32)),
             Tensor(rng.integers(0, 10, batch).astype(np.int32))) for _ in range(count)]


def bench_model(model_name, batch, optimizers, rounds, period, spngd_warmup, timer, data_batches=DATA_BATCHES,
                kl_clip=None, data_source="synthetic", graphs=1):
    """Rows of the summary and per-layer tables of one model at one batch size. With ``graphs`` > 1
    every optimizer trains that many independent training cells (each compiled into its own graph,
    same initial weights and batches), timed in turn in every round: the medians pool their steps."""
    data = _batches(model_name, data_batches, batch, data_source)
    cells, opts, compile_s, steps_done, lean_compile_s = {}, {}, {}, {}, {}
    keys = [(kind, g) for kind in optimizers for g in range(graphs)]
    for key in keys:
        kind = key[0]
        cells[key], opts[key] = build_cell(model_name, kind, period, kl_clip=kl_clip)
        start = time.perf_counter()
        cells[key](*data[0]).asnumpy()                    # compile + step 0
        compile_s.setdefault(kind, time.perf_counter() - start)
        warm = period + (spngd_warmup if base_kind(kind) == "spngd" else 0)
        for i in range(1, warm):
            start = time.perf_counter()
            cells[key](*data[i % len(data)]).asnumpy()
            if kind.endswith(LEAN) and cells[key].lean_steps == 1 and kind not in lean_compile_s:
                lean_compile_s[kind] = time.perf_counter() - start       # the lean graph's compile + a step
        steps_done[key] = warm
    times = {kind: [] for kind in optimizers}
    graph_times = {key: [] for key in keys}
    events = {kind: [] for kind in optimizers if base_kind(kind) == "spngd"}
    for _ in range(rounds):
        for key in keys:
            kind = key[0]
            for _ in range(period):
                x, y = data[steps_done[key] % len(data)]
                before = spngd_counts(opts[key]) if kind in events else None
                start = time.perf_counter()
                cells[key](x, y).asnumpy()
                elapsed = time.perf_counter() - start
                times[kind].append(elapsed)
                graph_times[key].append(elapsed)
                steps_done[key] += 1
                if kind in events:
                    events[kind].append(spngd_event(opts[key], before, spngd_counts(opts[key])))
    graph_medians = {kind: [float(np.median(graph_times[(kind, g)])) for g in range(graphs)] for kind in optimizers}
    baseline_medians = {kind: float(np.median(times[kind])) for kind in optimizers if kind in BASELINES}
    baseline = min(baseline_medians, key=baseline_medians.get)
    base = baseline_medians[baseline]
    flop_rows, rows, layer_tables = [], [], {}
    specs = next((opts[(k, 0)].layer_specs for k in optimizers if k not in BASELINES), None)
    if specs is None:
        return rows, layer_tables
    geometry = layer_geometry(model_name, specs)
    for kind in optimizers:
        if kind in BASELINES:
            continue
        schedule = schedule_of(kind, period)
        steps = len(times[kind])
        if schedule.adaptive:
            step_events = events[kind]
        else:
            step_events = fixed_events(schedule, len(specs), steps, period)
        # rates over the timed steps: per layer, of A capture, G capture, inversion
        rates = np.asarray([[np.mean([e[j][k] for e in step_events]) for j in range(3)] for k in range(len(specs))])
        table, totals = [], dict.fromkeys(("train", "capture", "inverse", "precondition"), 0.0)
        for k, spec in enumerate(specs):
            flops = layer_flops(spec, batch, geometry[spec.name]["positions"], schedule.split_dim)
            train = flops["forward"] + flops["backward"]
            capture = flops["capture_a"] * rates[k, 0] + flops["capture_g"] * rates[k, 1]
            inverse = (flops["inverse_a"] + flops["inverse_g"]) * rates[k, 2]
            extra = capture + inverse + flops["precondition"]
            table.append({"layer": spec.name, "kind": spec.kind, "a_dim": spec.a_dim, "g_dim": spec.g_dim,
                          "positions": geometry[spec.name]["positions"], "train_gflop": train / GIGA,
                          "capture_gflop": capture / GIGA, "inverse_gflop": inverse / GIGA,
                          "precondition_gflop": flops["precondition"] / GIGA, "ratio": extra / train,
                          "capture_rate_a": float(rates[k, 0]), "capture_rate_g": float(rates[k, 1]),
                          "inverse_rate": float(rates[k, 2])})
            totals["train"] += train
            totals["capture"] += capture
            totals["inverse"] += inverse
            totals["precondition"] += flops["precondition"]
        layer_tables[kind] = table
        kernel_times = [timer.layer(spec, geometry[spec.name], batch, schedule.split_dim) for spec in specs]
        extras = [extra_seconds(e, kernel_times) for e in step_events]
        floor = np.asarray([base + sum(x.values()) for x in extras])
        measured = np.asarray(times[kind])
        refresh = np.asarray([is_refresh(e) for e in step_events])
        if not schedule.adaptive:                         # quiet = not step 0 of a period (as step_time.py)
            refresh = np.asarray([e[2][0] for e in step_events])
        quiet = ~refresh
        row = {"model": model_name, "batch": batch, "optimizer": kind, "period": period, "steps": steps,
               "compile_s": compile_s[kind], "lean_compile_s": lean_compile_s.get(kind), "momentum_median_s": base, "baseline": baseline,
               "baseline_medians_s": baseline_medians, "graphs": graphs,
               "momentum_graph_medians_s": graph_medians[baseline], "graph_medians_s": graph_medians[kind],
               "train_gflop": totals["train"] / GIGA,
               "capture_gflop": totals["capture"] / GIGA, "inverse_gflop": totals["inverse"] / GIGA,
               "precondition_gflop": totals["precondition"] / GIGA,
               "flop_ratio": (totals["capture"] + totals["inverse"] + totals["precondition"]) / totals["train"],
               "refresh_steps": int(refresh.sum()),
               "amortised_s": float(measured.mean()), "floor_amortised_s": float(floor.mean()),
               "floor_capture_s": float(np.mean([x["capture"] for x in extras])),
               "floor_inverse_s": float(np.mean([x["inverse"] for x in extras])),
               "floor_precondition_s": float(np.mean([x["precondition"] for x in extras]))}
        row["amortised_ratio"] = row["amortised_s"] / base
        row["floor_amortised_ratio"] = row["floor_amortised_s"] / base
        row["overhead_amortised_s"] = row["amortised_s"] - row["floor_amortised_s"]
        for name, mask in (("quiet", quiet), ("refresh", refresh)):
            if mask.any():
                row[f"{name}_s"] = float(np.median(measured[mask]))
                row[f"floor_{name}_s"] = float(np.median(floor[mask]))
                row[f"{name}_ratio"] = row[f"{name}_s"] / base
                row[f"floor_{name}_ratio"] = row[f"floor_{name}_s"] / base
                row[f"overhead_{name}_s"] = row[f"{name}_s"] - row[f"floor_{name}_s"]
        rows.append(row)
    return rows, {kind: {"layers": table} for kind, table in layer_tables.items()}


# ---------------------------------------------------------------------------------------- tables
def _ms(value):
    return f"{1e3 * value:.1f}"


def layer_markdown(model_name, batch, kind, table):
    lines = [f"**{model_name} (batch {batch}), {kind}** -- GFLOP per step, capture and inversion amortised",
             "", "| layer | kind | A | G | T | fwd+bwd | capture | inversion | precondition | extra / training |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['layer']} | {r['kind']} | {r['a_dim']} | {r['g_dim']} | {r['positions']} | "
                     f"{r['train_gflop']:.4f} | {r['capture_gflop']:.4f} | {r['inverse_gflop']:.4f} | "
                     f"{r['precondition_gflop']:.4f} | {r['ratio']:.2f} |")
    return "\n".join(lines)


def _baseline_cell(row):
    """The baseline's median step; with both Momentum graphs timed, which one and the other's median."""
    others = [f"{kind} {_ms(t)}" for kind, t in row["baseline_medians_s"].items() if kind != row["baseline"]]
    if not others:
        return _ms(row["momentum_median_s"])
    return f"{_ms(row['momentum_median_s'])} ({row['baseline']}; {', '.join(others)})"


def summary_markdown(rows):
    lines = ["| model (batch) | optimizer | fwd+bwd GFLOP | extra GFLOP (capture / inverse / precond.) "
             "| FLOP ratio | Momentum ms | non-refresh ms: measured (x) / floor (x) / overhead "
             "| amortised ms: measured (x) / floor (x) / overhead | refresh steps |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "quiet_s" in r:
            quiet = (f"{_ms(r['quiet_s'])} ({r['quiet_ratio']:.2f}x) / {_ms(r['floor_quiet_s'])} "
                     f"({r['floor_quiet_ratio']:.2f}x) / {_ms(r['overhead_quiet_s'])}")
        else:
            quiet = "-"
        amortised = (f"{_ms(r['amortised_s'])} ({r['amortised_ratio']:.2f}x) / {_ms(r['floor_amortised_s'])} "
                     f"({r['floor_amortised_ratio']:.2f}x) / {_ms(r['overhead_amortised_s'])}")
        name = r["optimizer"]
        if r.get("lean_compile_s") is not None:       # first call (full graph) and first lean call, each + a step
            name += f" (compiles {r['compile_s']:.1f} s + {r['lean_compile_s']:.1f} s)"
        lines.append(f"| {r['model']} ({r['batch']}) | {name} | {r['train_gflop']:.3f} | "
                     f"{r['capture_gflop']:.3f} / {r['inverse_gflop']:.3f} / {r['precondition_gflop']:.3f} | "
                     f"{r['flop_ratio']:.2f} | {_baseline_cell(r)} | {quiet} | {amortised} | "
                     f"{r['refresh_steps']}/{r['steps']} |")
    return "\n".join(lines)


def graphs_markdown(rows):
    """Median step of each training graph (``--graphs``), Momentum's first for every model and batch."""
    lines = ["| model (batch) | optimizer | median step ms of each graph |", "|---|---|---|"]
    seen = set()
    for r in rows:
        label = f"{r['model']} ({r['batch']})"
        if label not in seen:
            seen.add(label)
            lines.append(f"| {label} | {r['baseline']} | "
                         f"{' / '.join(_ms(t) for t in r['momentum_graph_medians_s'])} |")
        lines.append(f"| {label} | {r['optimizer']} | {' / '.join(_ms(t) for t in r['graph_medians_s'])} |")
    return "\n".join(lines)


def floor_markdown(rows):
    lines = ["| model (batch) | optimizer | floor parts, amortised ms: capture / inverse / precondition "
             "| refresh step ms: measured / floor / overhead |", "|---|---|---|---|"]
    for r in rows:
        refresh = (f"{_ms(r['refresh_s'])} / {_ms(r['floor_refresh_s'])} / {_ms(r['overhead_refresh_s'])}"
                   if "refresh_s" in r else "-")
        lines.append(f"| {r['model']} ({r['batch']}) | {r['optimizer']} | {_ms(r['floor_capture_s'])} / "
                     f"{_ms(r['floor_inverse_s'])} / {_ms(r['floor_precondition_s'])} | {refresh} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- compile
ZOO_OPTIMIZERS = ("momentum", "kfac", "spngd", "thor")
# nn.Momentum over the network with K-FAC's capture attached, every flag on: the capture's share of the compile
CAPTURE_FLOOR = "momentum+capture"
COMPILE_KINDS = ZOO_OPTIMIZERS + (CAPTURE_FLOOR,)


def _zoo_cell(zoo_benchmark, config, name, size, steps):
    """The zoo's training cell of optimizer ``name``; for :data:`CAPTURE_FLOOR`, ``nn.Momentum`` training
    the loss network of the zoo's K-FAC cell: K-FAC attached its capture and never runs, so its flags
    stay set and every step takes the capture branches."""
    if name != CAPTURE_FLOOR:
        return zoo_benchmark._cell(config, name, size, steps)[0]
    loss_net = zoo_benchmark._cell(config, "kfac", size, steps)[0].network
    cell = nn.TrainOneStepCell(loss_net, nn.Momentum(loss_net.trainable_params(), 0.01, 0.9))
    cell.set_train()
    return cell


def compile_times(optimizers, steps=5, config="cpu_smoke", batch=None):
    """First call and median step of the model zoo's ``config`` for each optimizer (the zoo's factory)."""
    zoo = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_zoo", "resnet50")
    if zoo not in sys.path:
        sys.path.insert(0, zoo)
    import benchmark as zoo_benchmark                     # model_zoo/resnet50/benchmark.py
    from src.config import load_config
    from src.runtime import allow_deep_graphs
    allow_deep_graphs()                                   # ResNet-50 nests deeper than the default
    rows = []
    for name in optimizers:
        section = "kfac" if name == CAPTURE_FLOOR else name       # the config section the cell is built from
        settings = load_config(config.format(optimizer=section))
        size = batch or settings["batch_size"]
        rng = np.random.default_rng(0)
        x = Tensor(rng.standard_normal((size, 3, settings["image_size"], settings["image_size"])).astype(np.float32))
        y = Tensor((np.arange(size) % settings["class_num"]).astype(np.int32))
        ms.set_seed(0)
        cell = _zoo_cell(zoo_benchmark, config, name, size, steps + 1)
        # the compile alone: step 0 refreshes every factor and inverse, whose arithmetic (tens of seconds
        # on ResNet-50) a first call minus a later step would count as compilation
        start = time.perf_counter()
        cell.compile(x, y)
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        cell(x, y).asnumpy()
        first_step = time.perf_counter() - start
        later = []
        for _ in range(steps):
            start = time.perf_counter()
            cell(x, y).asnumpy()
            later.append(time.perf_counter() - start)
        step = float(np.median(later))
        rows.append({"config": config.format(optimizer=section), "optimizer": name, "batch": size,
                     "parameters": len(cell.optimizer.parameters), "first_call_s": compile_s + first_step,
                     "first_step_s": first_step, "median_step_s": step, "compile_s": compile_s})
    base = next((r["compile_s"] for r in rows if r["optimizer"] == "momentum"), None)
    for r in rows:
        r["compile_ratio"] = r["compile_s"] / base if base else float("nan")
    return rows


COMPILE_PHASES = ("type_inference", "optimize", "task_emit")
_PHASE_LINE = re.compile(r"\[MsProfile\] \[compile_action\] (\S+) costs ([0-9.]+) msec")


def parse_phases(log):
    """``{action: seconds}`` summed over the ``[MsProfile] [compile_action]`` lines of a verbose log."""
    phases = {}
    for line in log.splitlines():
        match = _PHASE_LINE.search(line)
        if match:
            phases[match.group(1)] = phases.get(match.group(1), 0.0) + float(match.group(2)) / 1000
    return phases


def compile_phases(optimizer, config, batch):
    """Seconds per top-level compile action of one optimizer, from MindSpore's verbose log of a child
    process (see the module docstring)."""
    env = dict(os.environ, VLOG_v="1", GLOG_logtostderr="1")
    command = [sys.executable, "-m", "benchmarks.cost_model", "--compile", "--compile-steps", "1",
               "--optimizers", optimizer, "--config", config, "--out", ""]
    if batch:
        command += ["--batch", str(batch)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, check=False)
    phases = parse_phases(done.stdout + done.stderr)
    if done.returncode or not phases:
        raise RuntimeError(f"the phase run of {optimizer} failed (exit {done.returncode}): "
                           f"{done.stderr.strip().splitlines()[-1:] or 'no [MsProfile] lines'}")
    return phases


def compile_markdown(rows):
    lines = ["| config | optimizer | batch | parameters | first call s | step 0 s | median step ms | compile s "
             "(`Cell.compile`) | compile x Momentum |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['optimizer']} | {r['batch']} | {r['parameters']} | {r['first_call_s']:.1f} | "
                     f"{r['first_step_s']:.1f} | {_ms(r['median_step_s'])} | {r['compile_s']:.1f} | "
                     f"{r['compile_ratio']:.2f} |")
    if any("phases" in r for r in rows):
        lines += ["", "| optimizer | " + " | ".join(f"{p} s" for p in COMPILE_PHASES) + " | all actions s |",
                  "|---|" + "---|" * (len(COMPILE_PHASES) + 1)]
        for r in rows:
            phases = r.get("phases", {})
            lines.append(f"| {r['optimizer']} | " + " | ".join(f"{phases.get(p, float('nan')):.1f}" for p in COMPILE_PHASES)
                         + f" | {sum(phases.values()):.1f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated among " + ",".join(MODELS))
    parser.add_argument("--optimizers", default=None,
                        help=f"comma-separated; default {','.join(OPTIMIZERS)} (--compile: {','.join(ZOO_OPTIMIZERS)}, "
                             f"also {CAPTURE_FLOOR})")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of --period steps per optimizer")
    parser.add_argument("--period", type=int, default=DEFAULT_PERIOD,
                        help="inverse interval (also the factor interval of THOR and kfac-P/P)")
    parser.add_argument("--spngd-warmup", type=int, default=DEFAULT_PERIOD,
                        help="extra SP-NGD warm-up steps before timing (its intervals start at 1)")
    parser.add_argument("--data-batches", type=int, default=DATA_BATCHES,
                        help="distinct synthetic batches, cycled (1: one fixed batch, SP-NGD's statistics settle)")
    parser.add_argument("--data", default="synthetic", choices=DATA_SOURCES,
                        help="synthetic batches, or scikit-learn's digits (models with 1x8x8 inputs: digits-bn), "
                             "where SP-NGD's statistics settle as in training")
    parser.add_argument("--graphs", type=int, default=1,
                        help="independent training cells (graphs) per optimizer, timed in turn; the medians pool "
                             "their steps (the same convolutions run up to 30 %% apart from graph to graph)")
    parser.add_argument("--kl-clip", type=float, default=None,
                        help="kl_clip of every natural-gradient optimizer (default: each one's own, K-FAC and SP-NGD "
                             "1e-3, THOR none; e.g. 1e-3 where THOR diverges on the random labels, as on the "
                             "Fashion-MNIST MLP)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per standalone kernel (median)")
    parser.add_argument("--compile", action="store_true", help="measure the model zoo's cpu_smoke compile time instead")
    parser.add_argument("--compile-steps", type=int, default=5, help="later steps timed after the first call")
    parser.add_argument("--config", default="cpu_smoke",
                        help="--compile: model zoo config ('{optimizer}' substituted)")
    parser.add_argument("--batch", default=None,
                        help="comma-separated batch sizes, each model timed at each (default: the model's own), "
                             "e.g. 128,1024,4096 to find where the preconditioning stops dominating; "
                             "--compile: one size (default: the config's)")
    parser.add_argument("--phases", action="store_true",
                        help="--compile: also read the compiler's phase timings (one more compile per optimizer)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    try:
        batches = tuple(int(b) for b in args.batch.split(",")) if args.batch else (None,)
    except ValueError:
        batches = ()
    if not batches or any(b is not None and b < 1 for b in batches) or (args.compile and len(batches) > 1):
        parser.error(f"--batch must be {'one positive integer' if args.compile else 'positive integers, comma-separated'}"
                     f", got {args.batch!r}")
    if args.graphs < 1:
        parser.error(f"--graphs must be a positive integer, got {args.graphs}")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    if args.compile:
        names = tuple((args.optimizers or ",".join(ZOO_OPTIMIZERS)).split(","))
        if any(n not in COMPILE_KINDS for n in names):
            raise SystemExit(f"--compile optimizers must be among {COMPILE_KINDS}")
        rows = compile_times(names, args.compile_steps, args.config, batches[0])
        if args.phases:
            for r in rows:
                r["phases"] = compile_phases(r["optimizer"], args.config, batches[0])
        table = compile_markdown(rows)
        print(table)
        if not args.out:
            return None
        return save_results(args.out, "cost_model_compile", {"steps": args.compile_steps, "rows": rows,
                                                             "markdown": table})
    optimizers = tuple((args.optimizers or ",".join(OPTIMIZERS)).split(","))
    if optimizers[0] not in BASELINES or any(k not in OPTIMIZERS for k in optimizers):
        raise SystemExit(f"--optimizers must start with one of {BASELINES} and name kinds among {OPTIMIZERS}")
    models = tuple(args.models.split(","))
    if any(m not in MODELS for m in models):
        raise SystemExit(f"--models must name models among {tuple(MODELS)}")
    if data_error(args.data, models):
        parser.error(data_error(args.data, models))
    timer = KernelTimer(args.repeats)
    rows, layers, texts, path = [], {}, [], None
    for model_name, batch in itertools.product(models, batches):
        batch = batch or MODELS[model_name][2]
        model_rows, model_layers = bench_model(model_name, batch, optimizers, args.rounds, args.period,
                                               args.spngd_warmup, timer, args.data_batches, args.kl_clip,
                                               args.data, args.graphs)
        rows += model_rows
        layers[f"{model_name} (batch {batch})"] = model_layers
        for kind, entry in model_layers.items():
            text = layer_markdown(model_name, batch, kind, entry["layers"])
            print(text + "\n")
            texts.append(text)
        if model_rows:                                    # this model's summary now, the whole table at the end
            print(summary_markdown(model_rows) + "\n\n" + floor_markdown(model_rows) + "\n", flush=True)
        summary, floors = summary_markdown(rows), floor_markdown(rows)
        if args.graphs > 1 and rows:
            floors += "\n\n" + graphs_markdown(rows)
        # saved after every model (a long run keeps what it has measured), the same file each time
        path = save_results(args.out, f"cost_model_p{args.period}", {
            "rounds": args.rounds, "period": args.period, "spngd_warmup": args.spngd_warmup,
            "repeats": args.repeats, "data_batches": args.data_batches, "data": args.data,
            "graphs": args.graphs, "kl_clip": args.kl_clip,
            "inverse_flops_per_cube": INVERSE_FLOPS_PER_CUBE, "kernel_overhead_s": timer.overhead,
            "models_done": list(layers), "rows": rows, "layers": layers,
            "markdown": "\n\n".join(texts + [summary, floors])})
    print(summary + "\n\n" + floors)
    print(f"\nlaunch overhead subtracted from every kernel: {1e3 * timer.overhead:.3f} ms; "
          f"{args.rounds} rounds x {args.period} steps per optimizer; data: {args.data}")
    return path


if __name__ == "__main__":
    main()
