"""Behaviour preserved across the engine's restructuring (issue 14).

``tests/golden/`` holds what the engine computed before it was restructured (recorded by
``tests/golden/record_golden.py`` on the commit before the first move): the weights and optimizer state
after 20 steps of every case in ``tests/golden_cases.py``, single-process and per rank on 2 msrun
ranks, and each case's checkpoint after 10 steps as ``ms.save_checkpoint`` wrote it.

* the current code must reproduce the weights bit for bit (exact equality) on the processor the
  goldens were recorded on; elsewhere, BLAS/oneDNN kernels may round differently, so there it is held
  to 1e-5 of each tensor's scale instead (the test says which applies);
* the optimizer state must be bit-identical too, key by key, except for the Parameters listed in
  ``REMOVED`` and ``ADDED`` (intended changes, each with its reason);
* the old checkpoints must load into the current optimizer and resume to the same weights.
"""
import gzip
import os
import shutil

import numpy as np
import pytest

import mindspore as ms

import golden_cases as gc
from record_golden import cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))
SINGLE = np.load(os.path.join(HERE, "single.npz"))
SAME_CPU = str(SINGLE["cpu"]) == cpu_name()

# Parameters the old engine created and the restructured one does not (intended; see the issue 14 note):
# THOR's trace-probe buffers and flags exist only when the trace rule is on.
TRACE_PROBES = (".trace_a", ".trace_g", ".a_trace", ".g_trace")
# The capture's per-step batch buffers are no longer optimizer Parameters (issue 12): they carry no
# state between steps, and as Parameters they froze on the host after a load into a compiled graph.
SCRATCH = (".a_batch", ".g_batch", ".f_batch")
REMOVED = TRACE_PROBES + SCRATCH
# Parameters added since (issue 11): the loss-scale probe's last measured scale, and (issue 12) the
# adaptive damping and divergence state. The golden cases run with adaptive_damping=False, so every
# other value stays bit-identical.
ADDED = (".loss_scale_seen", ".nonfinite_run", ".damping.boost", ".damping.boost_inverted", ".damping.step_slope",
         ".damping.step_lr", ".damping.ratio_num", ".damping.ratio_den",
         ".demoted", ".demoted_unreported",    # issue 12: layers demoted because they captured nothing
         ".capturing", ".damping.moments",     # issue 13: read once per step instead of the flags / buffers
         # issue 32: the finite-divergence stop's reference gradient norm and run of exploding steps;
         # it only reads the gradients and the damping state, so every other value stays bit-identical
         ".divergence.grad_reference", ".divergence.finite_run")
# Issue 13: each layer's scalars are stacked into one vector per family, in layer order; the golden
# per-layer values must equal the vector's entries (demoted did not exist when they were recorded).
STACKED = {"A_updates": "layers", "G_updates": "layers", "has_inverse": "layers", "F_updates": "norms"}


def _stacked(golden, opt):
    """The golden state with its per-layer scalars replaced by the vectors, built here from the
    layer order (independently of ``LayerCounters.upgrade``, which the resume test exercises)."""
    golden = dict(golden)
    prefix = opt.policy.name
    for family, kind in STACKED.items():
        names = [s.name for s in (opt.layer_specs if kind == "layers" else opt.norm_specs)]
        keys = [f"{prefix}.{name}.{family}" for name in names]
        if names:
            golden[f"{prefix}.{family}"] = np.array([golden.pop(key) for key in keys])
    return golden


def _expected(case, part):
    prefix = f"{case}/{part}/"
    return {k[len(prefix):]: SINGLE[k] for k in SINGLE.files if k.startswith(prefix)}


def _same(value, reference, what):
    if SAME_CPU:
        assert np.array_equal(value, reference), f"{what}: not bit-identical to the golden value"
    else:
        scale = max(float(np.abs(reference).max()), 1e-30)
        np.testing.assert_allclose(value, reference, rtol=0, atol=1e-5 * scale, err_msg=what)


def _check(case, net, opt, optimizer_state=True):
    weights, optimizer = gc.state(net, opt)
    golden = _expected(case, "weights")
    assert sorted(weights) == sorted(golden)
    for name, value in golden.items():
        _same(weights[name], value, f"{case} {name}")
    if not optimizer_state:
        return
    golden = _stacked(_expected(case, "optimizer"), opt)
    removed = {k for k in golden if k.endswith(REMOVED) and k not in optimizer}
    if case.startswith("thor_split_trace"):
        assert not {k for k in removed if k.endswith(TRACE_PROBES)}, \
            "the trace rule's buffers must still exist when it is on"
    assert not {k for k in optimizer if k.endswith(SCRATCH)}, "capture buffers must not be optimizer Parameters"
    added = {k for k in optimizer if k.endswith(ADDED) and k not in golden}
    assert set(golden) - removed == set(optimizer) - added, "optimizer Parameters were renamed, added or lost"
    for name in set(optimizer) - added:
        _same(optimizer[name], golden[name], f"{case} {name}")


@pytest.mark.parametrize("case", list(gc.CASES))
def test_twenty_steps_reproduce_the_recorded_weights_and_state(case):
    net, opt, step = gc.build(case)
    gc.train(step, 0, gc.STEPS)
    _check(case, net, opt)


# the Monte-Carlo label sampler's random state is not part of a checkpoint (MindSpore keeps it in the
# kernel), so a resumed MC run draws other labels than the continuous one did: not comparable
RESUMABLE = [case if case == "kfac" else pytest.param(case, marks=pytest.mark.slow)
             for case in gc.CASES if not gc.CASES[case][2]]


@pytest.mark.parametrize("case", RESUMABLE)
def test_checkpoint_written_before_the_restructuring_resumes_to_the_same_weights(case, tmp_path):
    path = str(tmp_path / "state.ckpt")
    with gzip.open(os.path.join(HERE, "checkpoints", f"{case}_step10.ckpt.gz"), "rb") as src, \
            open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    net, opt, step = gc.build(case)
    old = ms.load_checkpoint(path)
    not_loaded, _ = ms.load_param_into_net(step, opt.upgrade_checkpoint(old))
    not_loaded = [name for name in not_loaded if not name.endswith(ADDED)]     # newer state keeps its initial value
    assert not not_loaded, f"Parameters missing from the old checkpoint: {not_loaded}"
    assert int(opt.global_step.asnumpy().reshape(-1)[0]) == gc.CHECKPOINT_STEP
    gc.train(step, gc.CHECKPOINT_STEP, gc.STEPS)
    _check(case, net, opt)


# slow (about 100 s): the distributed equivalence tests of tests/distributed cover the same cases in the
# default run against a single process; this one pins the exact pre-restructuring weights
@pytest.mark.distributed
@pytest.mark.slow
def test_two_msrun_ranks_reproduce_the_recorded_weights():
    from distributed import run_msrun
    golden = np.load(os.path.join(HERE, "two_ranks.npz"))
    run = run_msrun("tests/distributed/workers/golden_worker.py", gc.DISTRIBUTED, workers=2, timeout=600)
    assert sorted(run.results) == [0, 1]
    for rank, result in run.results.items():
        assert sorted(result["cases"]) == sorted(gc.DISTRIBUTED)
        for case, weights in result["cases"].items():
            prefix = f"rank{rank}/{case}/"
            expected = {k[len(prefix):]: golden[k] for k in golden.files if k.startswith(prefix)}
            assert sorted(weights) == sorted(expected)
            for name, value in weights.items():
                _same(np.asarray(value, np.float32), expected[name], f"rank {rank} {case} {name}")
