"""The op audit (mindspore_ngd.audit): every operator the optimizers add to a training graph is
documented by the installed MindSpore for the device whose kernel choice built the graph.

Each distinct graph is compiled once per session (the audit module caches them): the plain
momentum baseline, K-FAC / SP-NGD / THOR with each accelerator's inversion path and without host
calls (what "auto" picks on Ascend and GPU), K-FAC with Cholesky (the deliberately
Ascend-undocumented path) and K-FAC with host calls (CPU's graph, which the strict audit fails).
About 50 s on 2 CPU cores."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindspore_ngd import audit
from mindspore_ngd.curvature.inverse import DEVICE_INVERSE_METHODS

ACCELERATORS = ("Ascend", "GPU")


# ------------------------------------------------------------------ the docstring parser
DOC_ALL = """
    Computes something.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> pass
"""
DOC_TWO = "Solve.\n\n    Supported Platforms:\n        ``CPU`` ``Ascend``"          # section last, any order
DOC_DEPRECATED = "Old.\n\n    Supported Platforms:\n        Deprecated\n\n    Examples:\n"
DOC_REFER = """
    .. code-block::

        prim = ops.Abs()

    Refer to :func:`mindspore.ops.abs` for more details.
"""


def test_supported_platforms_parser():
    assert audit.supported_platforms(DOC_ALL) == ("Ascend", "GPU", "CPU")
    assert audit.supported_platforms(DOC_TWO) == ("Ascend", "CPU")
    assert audit.supported_platforms(DOC_DEPRECATED) == ()
    assert audit.supported_platforms(DOC_REFER) is None
    assert audit.supported_platforms(None) is None
    # the Examples after the section are not read as platforms
    assert audit.supported_platforms(DOC_ALL + "\n ``GPU`` only here\n") == ("Ascend", "GPU", "CPU")


def test_doc_reference_parser():
    assert audit.doc_reference(DOC_REFER) == "mindspore.ops.abs"
    assert audit.doc_reference("Alias for :func:`mindspore.ops.cat()`.") == "mindspore.ops.cat"
    assert audit.doc_reference("For details, please refer to :func:`mindspore.ops.mul`.") == "mindspore.ops.mul"
    assert audit.doc_reference(DOC_ALL) is None


def test_documentation_reads_the_installed_docstrings():
    """Known facts of MindSpore 2.10's documentation, as the issue states them."""
    assert audit.documentation("Cholesky").platforms == ("GPU", "CPU")
    assert audit.documentation("PrimFunc_SolveTriangular").platforms == ("Ascend", "CPU")
    assert audit.documentation("MatrixInverse").platforms == ("Ascend", "GPU", "CPU")
    abs_doc = audit.documentation("PrimFunc_Abs")           # through "Refer to :func:`mindspore.ops.abs`"
    assert abs_doc.kind == "operator" and "mindspore.ops.abs" in abs_doc.source
    grad = audit.documentation("PrimFunc_RsqrtGrad")
    assert grad.kind == "backward-of" and grad.platforms == audit.documentation("PrimFunc_Rsqrt").platforms
    assert audit.documentation("UpdateState").kind == "graph"


def test_host_nodes_fail_the_strict_audit_on_accelerators():
    """JIT-fallback Python and graph-mode scalar ops run on the host: failures on Ascend and GPU unless
    the audit is lenient (mindspore.jit documents the syntax for every device); CPU accepts them."""
    for name in ("PyExecute", "JoinedStr", "raise", "ScalarBoolNot", "ScalarAdd", "bool_not"):
        assert audit.is_host_node(name), name
        entry = audit.documentation(name)
        assert entry.kind == "host", name
        assert not entry.documented_for("Ascend") and not entry.documented_for("GPU"), name
        assert entry.documented_for("CPU"), name
    assert audit.documentation("PyExecute").documented_for("GPU", strict=False)
    for name in ("PrimFunc_Add", "Print", "PrimFunc_EqScalar", "PrimFunc_LessScalar", "Switch"):
        assert not audit.is_host_node(name), name
    added = {"ScalarBoolNot": ["guard.py:9"], "PrimFunc_Add": []}
    report = audit.audit_primitives(added, "Ascend", "toy")
    assert report.strict and report.undocumented == ("ScalarBoolNot",) and report.host_nodes == ("ScalarBoolNot",)
    assert "runs on the host" in report.failure_message() and "guard.py:9" in report.failure_message()
    assert audit.audit_primitives({"PyExecute": []}, "GPU", "toy", strict=False).ok


def test_unmapped_primitive_fails_naming_it():
    report = audit.audit_primitives({"NoSuchPrimitiveXyz": ["net.py:3"], "MakeTuple": []}, "Ascend", "toy")
    assert report.unmapped == ("NoSuchPrimitiveXyz",) and not report.ok
    assert "NoSuchPrimitiveXyz" in report.failure_message() and "net.py:3" in report.failure_message()
    with pytest.raises(ValueError, match="device"):
        audit.audit_primitives({}, "TPU")


# ------------------------------------------------------------------ the IR extractor
IR = """# IR entry: @main
subgraph @main(%para1_x) {
  %0(CNode_1) = Load(%para2_w, UMonad[U])
      : (<Ref[Tensor[Float32]], (2, 3)>) -> (<Tensor[Float32], (2, 3)>)
      # In file /site/mindspore/nn/cell.py:10, 4~9/    x = 1/
      # In file /repo/mindspore_ngd/optim/engine.py:167, 8~20/        w = self.w/
  %1(▲CNode_2) = PrimFunc_MatMul(%para1_x, %0, Bool(0), Bool(1)) {instance name: matmul}
      # In file /repo/mindspore_ngd/optim/engine.py:170, 8~20/        y = x @ w/
  %2(CNode_3) = Partial(@7_✓branch_4, %1) primitive_attrs: {side_effect_propagate: I64(1)}
  %3(CNode_5) = Switch(%9, %2, %2)
  %4(CNode_6) = %3[@FuncUnion(Partial(@7_✓branch_4), Partial(@8_✗branch_5))]()
  %5(▲partial_trans_CNode_7) = call @9_capture_6(%para1_x, %4)
  %6(CNode_8) = Parameter_2789[@FuncUnion(@a, @b)](%para3_p)
  %7(CNode_9) = raise(StringImm(RuntimeError), %8)
  %8(CNode_10) = PrimFunc_MatMul(%1, %0, Bool(0), Bool(0))
  Return(%8)
}
"""


def test_read_ir_primitives_on_a_small_dump():
    prims = audit.read_ir_primitives(IR)
    assert set(prims) == {"Load", "PrimFunc_MatMul", "Partial", "Switch", "raise"}
    assert prims["PrimFunc_MatMul"] == ["/repo/mindspore_ngd/optim/engine.py:170", "?"]
    assert prims["Load"] == ["/repo/mindspore_ngd/optim/engine.py:167"]     # the innermost frame
    with pytest.raises(ValueError, match="unrecognised IR node"):
        audit.read_ir_primitives("  %0(x) = 42(%1)\n")


COPIES_IR = """subgraph @main(%para1_x) {
  %0(CNode_1) = Load(%para2_kfac.conv.A, UMonad[U])
  %1(CNode_2) = TensorMove(%0)
  %2(CNode_3) = PrimFunc_Add(%para1_x, %1)
  %3(CNode_4) = PrimFunc_TensorMove(%2)
  Return(%3)
}
subgraph @7_branch(%para3_y) {
  %0(CNode_5) = Load(%para4_kfac.G_updates, UMonad[U])
  %1(CNode_6) = PrimFunc_TensorMove(%0)
  Return(%1)
}
"""


def test_read_ir_copies_names_the_loaded_parameter_of_every_copy():
    # node numbers restart in every graph: the branch's %0 is its own Load, not main's
    assert audit.read_ir_copies(COPIES_IR) == ["kfac.conv.A", "?", "kfac.G_updates"]
    assert audit.read_ir_copies(IR) == []


def _mul_add(x, i, m):
    return ms.ops.matmul(x, m) + 1.0


def test_compiled_primitives_of_a_small_function():
    x = Tensor(np.ones((2, 3), np.float32))
    m = Tensor(np.ones((3, 3), np.float32))
    prims = audit.compiled_primitives(_mul_add, x, Tensor(np.arange(3, dtype=np.int32)), m)
    assert {"PrimFunc_MatMulExt", "PrimFunc_Add"} <= set(prims)
    assert any("test_audit.py" in s for s in prims["PrimFunc_MatMulExt"])
    assert ms.get_context("save_graphs") in (0, False)                        # restored


@pytest.mark.parametrize("name", sorted(audit.EMITTED_BY))
def test_emitted_by_links_are_real(name):
    """Each documented API that EMITTED_BY names for an internal primitive does compile to it."""
    x = Tensor(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    i = Tensor(np.arange(6, dtype=np.int32))
    m = Tensor(np.eye(3, dtype=np.float32))
    for api, example in audit.EMITTED_BY[name]:
        prims = audit.compiled_primitives(example, x, i, m)
        assert name in prims or "PrimFunc_" + name in prims, (api, sorted(prims))


# ------------------------------------------------------------------ the optimizers' graphs
# every optimizer's Ascend graph and K-FAC's GPU graph in the default run; the other GPU graphs are slow
@pytest.mark.parametrize("optimizer, device", [
    pytest.param(o, d, marks=pytest.mark.slow) if d == "GPU" and o != "kfac" else (o, d)
    for o in sorted(audit.OPTIMIZERS) for d in ACCELERATORS])
def test_audit_passes_at_device_defaults(optimizer, device):
    report = audit.audit_optimizer(optimizer, device)
    assert report.strict and report.ok, report.failure_message()
    assert report.host_nodes == ()                  # no host Python, no scalar host op: GE / GPU run it whole
    assert "host_calls=False" in report.label
    ops_added = report.operators()
    assert "Print" in ops_added                     # the device's reports (documented for Ascend, GPU, CPU)
    assert len(ops_added) > 20                 # the optimizer's own operators were seen
    assert not report.unmapped
    # the kernel choice is in the graph: the device's inversion path, nothing of the others
    if DEVICE_INVERSE_METHODS[device] == "lu":
        assert "MatrixInverse" in ops_added and "PrimFunc_Cholesky" not in ops_added


def test_thor_graph_has_block_splitting_and_spngd_the_batchnorm_probe():
    thor = audit.audit_optimizer("thor", "Ascend").operators()
    assert "PrimFunc_BatchMatMul" in thor        # split blocks are inverted/applied as a batch
    spngd = audit.audit_optimizer("spngd", "Ascend").operators()
    assert "StridedSliceGrad" in spngd           # the unit-wise BatchNorm probe is differentiated
    # ... and its normalised input is not: it sits under stop_gradient (the probe is zero)
    assert "PrimFunc_RsqrtGrad" not in spngd


def test_host_call_graph_fails_the_strict_audit_naming_pyexecute():
    """CPU's graph (host_calls=True): the divergence stop and the reports are a PyExecute node, which the
    strict audit refuses on Ascend and GPU; the lenient audit (mindspore.jit's documentation) accepts it."""
    for device in ACCELERATORS:
        report = audit.audit_optimizer("kfac", device, host_calls=True)
        assert not report.ok and "PyExecute" in report.undocumented, report.format(True)
        assert set(report.undocumented) <= set(report.host_nodes)
        assert "optim/status.py" in report.failure_message()       # the step's watch (DeviceStatus)
        assert audit.audit_optimizer("kfac", device, host_calls=True, strict=False).ok


@pytest.mark.parametrize("device, missing", [("Ascend", "PrimFunc_Cholesky"), ("GPU", "PrimFunc_SolveTriangular")])
def test_cholesky_path_fails_naming_the_primitive(device, missing):
    report = audit.audit_optimizer("kfac", device, inverse_method="cholesky")
    assert not report.ok
    assert report.undocumented == (missing,)
    assert missing in report.failure_message()


# ------------------------------------------------------------------ collectives
@pytest.mark.parametrize("backend, device", [("hccl", "Ascend"), ("nccl", "GPU")])
def test_collectives_documented_for_their_backend(backend, device):
    report = audit.audit_collectives(backend, device)
    assert set(report.added) == {"ReduceScatter", "AllGather", "AllReduce"}
    assert report.ok, report.failure_message()


def test_cpu_backend_avoids_reduce_scatter():
    for k in (1, 2, 4):
        assert "ReduceScatter" not in audit.collectives_for("mccl", 4, k / 4)
    assert "ReduceScatter" in audit.collectives_for("hccl", 4, 0.25)
