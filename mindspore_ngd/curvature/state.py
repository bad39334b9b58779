"""Names for the positions of the step state the engine passes through its compiled graph.

The fold and the refresh (:mod:`mindspore_ngd.curvature.estimator`) and the preconditioning
(:mod:`mindspore_ngd.optim.precondition`) hand the curvature state on as tuples, and the blocks
(:class:`~mindspore_ngd.curvature.kronecker.KroneckerBlock`,
:class:`~mindspore_ngd.curvature.counters.LayerCounters`) produce and read parts of it. Each class
below names the positions of one such tuple; the functions build the tuples whose length depends on
the configuration, so that every producer builds them alike.

Why integer constants and not ``collections.namedtuple`` (measured, MindSpore 2.10 CPU): graph mode
builds a namedtuple through the JIT fallback, as a Python object of no static type, not as a graph
tuple. Under ``MS_DEV_JIT_SYNTAX_LEVEL=0`` (strict) no namedtuple built from tensors compiles at all;
at the default level a nested one holding Parameters, rebuilt inside a run-time branch, failed to
compile (its elements inferred as Float64), and one returned from a run-time branch together with
another value -- the form of the fold's branch -- aborted the process at run time ("Invalid model
output size"). A class attribute holding an int is a compile-time constant, also in strict mode, so
``state[FactorState.COUNTS]`` is the same constant-index item access as ``state[1]``.
"""
import mindspore as ms
from mindspore import ops

__all__ = ["FactorState", "LayerCounts", "InverseState", "FoldOutcome", "factor_state", "inverse_state",
           "fold_outcome", "idle_outcome"]


class FactorState:
    """Positions of the factor state: :meth:`~mindspore_ngd.curvature.estimator.BlockDiagonalCurvature.stored_factors`
    reads it, :meth:`~mindspore_ngd.curvature.estimator.BlockDiagonalCurvature.folded` returns the new one, built
    by :func:`factor_state`."""
    LAYERS = 0          # per preconditioned layer its (A, G)
    COUNTS = 1          # the layers' counts and demoted flags, a LayerCounts tuple
    FAULTS = 2          # factor fault count (int32 scalar)
    NORM_FISHERS = 3    # per unit-wise BatchNorm layer its (C, 3) Fisher -- only with BatchNorm layers
    NORM_COUNTS = 4     # the BatchNorm layers' update counts, int32 (BatchNorm layers,) -- ditto


class LayerCounts:
    """Positions of :meth:`~mindspore_ngd.curvature.counters.LayerCounters.factor_counts`, each a
    (layers,) vector."""
    A_UPDATES = 0       # batches each layer's A has taken (int32)
    G_UPDATES = 1       # batches each layer's G has taken (int32)
    DEMOTED = 2         # the layer captured nothing and takes the plain update (bool)


class InverseState:
    """Positions of the inverse state:
    :meth:`~mindspore_ngd.curvature.estimator.BlockDiagonalCurvature.stored_inverses` reads it,
    :meth:`~mindspore_ngd.curvature.estimator.BlockDiagonalCurvature.refreshed` returns the new one, built
    by :func:`inverse_state`."""
    LAYERS = 0          # per preconditioned layer its (A inverse, G inverse)
    HAS_INVERSE = 1     # per layer: holds an accepted inverse (bool (layers,))
    FAULTS = 2          # inverse fault count (int32 scalar)
    INVERSIONS = 3      # distributed only: this step's inversions per layer (int32 (layers,))


class FoldOutcome:
    """Positions of one layer's fold outcome (float32 scalars), built by :func:`fold_outcome`.

    Distributed, the outcomes are summed over the ranks field by field
    (:meth:`~mindspore_ngd.parallel.exchange.DistributedExchange.agree`)."""
    TOOK_A = 0          # 1 when A took this step's batch
    TOOK_G = 1
    REJECTED_A = 2      # 1 when A's batch was rejected (non-finite)
    REJECTED_G = 3
    CHANGE_A = 4        # the relative change of A -- only when the refresh rule tracks changes
    CHANGE_G = 5


def factor_state(layers, counts, faults, norm_fishers=None, norm_counts=None):
    """The factor state tuple (:class:`FactorState`); the BatchNorm fields only when given."""
    if norm_fishers is None:
        return layers, counts, faults
    return layers, counts, faults, norm_fishers, norm_counts


def inverse_state(layers, has_inverse, faults, inversions=None):
    """The inverse state tuple (:class:`InverseState`); the inversion counts only when given
    (distributed)."""
    if inversions is None:
        return layers, has_inverse, faults
    return layers, has_inverse, faults, inversions


def fold_outcome(took_a, took_g, rejected_a, rejected_g, changes=None):
    """One layer's fold outcome tuple (:class:`FoldOutcome`); ``changes`` = (A change, G change) only
    when the refresh rule tracks them."""
    if changes is None:
        return took_a, took_g, rejected_a, rejected_g
    return (took_a, took_g, rejected_a, rejected_g) + changes


def idle_outcome(track):
    """The outcome of an owned layer's fold that took nothing: nothing taken or rejected, no change
    (-1 for each change, as a fold that did not take its statistic reports it)."""
    zero = ops.zeros((), ms.float32)
    unchanged = -ops.ones((), ms.float32)
    return fold_outcome(zero, zero, zero, zero, (unchanged, unchanged) if track else None)
