"""The Kronecker-factored curvature block of one Dense or Conv2d layer.

A :class:`KroneckerBlock` owns the matrices the optimizer keeps for its layer -- the moving-average
factors A and G and their damped inverses (dense, or THOR's block-diagonal split) --, the capture
cell that computes the batch factors inside the network, and the layer's place in the gradient
tuple, and the three steps applied to them: fold a batch into the averages, refresh the inverses,
precondition the gradient ``G^-1 dW A^-1``. The layer's scalars (update counts, has-inverse and
demoted flags) are stacked over all layers in :class:`~mindspore_ngd.curvature.counters.LayerCounters`
and passed in.

Methods return new values; the optimizer writes them with :meth:`write_factors` /
:meth:`write_inverses` in its main graph (MindSpore 2.10 disconnects a Parameter assigned inside a
run-time branch from its host value). Parameter names are ``{prefix}.{layer}.A``, ``.G``, ``.A_inv``
and ``.G_inv``, as in every checkpoint so far.
Distributed, a block this rank does not own keeps (1, 1) placeholders of its factors and inverses
and is never folded or inverted here.
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from .._graph import choose, columns as matrix_columns, per_shape_subgraph
from ..capture import LayerCapture, never_captured
from . import inverse as inv_ops
from .blocks import BlockLayout, apply_left, apply_right
from .state import fold_outcome
from .statistics import damped_square_norm, fold_statistic

__all__ = ["KroneckerBlock", "matrix_part", "folded_pair", "refreshed_pair"]


def matrix_part(matrix, is_bias, has_bias, shape, dtype):
    """The weight (or bias) part of a layer's ``(g_dim, a_dim)`` gradient-shaped matrix (bias as the
    last column, as :meth:`KroneckerBlock.gradient` builds it), shaped and typed like the parameter."""
    columns = matrix.shape[1]
    if is_bias:
        part = matrix_columns(matrix, columns - 1, 1)
    elif has_bias:
        part = matrix_columns(matrix, 0, columns - 1)
    else:
        part = matrix
    return ops.cast(part.reshape(shape), dtype)


def _square(dim, name, fill, owned):
    dim = dim if owned else 1
    return Parameter(Tensor(np.eye(dim, dtype=np.float32) * fill), name=name, requires_grad=False)


def _identity_inverse(layout, name, owned):
    if layout.count == 1 or not owned:
        return _square(layout.dim, name, 1.0, owned)
    eye = np.broadcast_to(np.eye(layout.size, dtype=np.float32), (layout.count, layout.size, layout.size))
    return Parameter(Tensor(np.ascontiguousarray(eye)), name=name, requires_grad=False)


def folded_pair(a_factor, g_factor, a_updates, g_updates, a_batch, g_batch, take_a, take_g, decay, track_changes,
                 damping, damping_split, positions):
    """:meth:`KroneckerBlock.fold`'s arithmetic on tensors and constants only, so that layers of one shape
    share one compiled copy (:func:`~mindspore_ngd._graph.per_shape_subgraph`)."""
    a_ref = g_ref = None
    if track_changes and damping is not None:
        a_shift, g_shift = inv_ops.split_damping(a_factor, g_factor, damping, damping_split, positions)
        a_ref, g_ref = damped_square_norm(a_factor, a_shift), damped_square_norm(g_factor, g_shift)
    a, a_count, a_bad, a_change = fold_statistic(a_factor, a_updates, a_batch, take_a, decay, track_changes, a_ref)
    g, g_count, g_bad, g_change = fold_statistic(g_factor, g_updates, g_batch, take_g, decay, track_changes, g_ref)
    outcome = fold_outcome(ops.cast(a_count - a_updates, ms.float32), ops.cast(g_count - g_updates, ms.float32),
                           ops.cast(a_bad, ms.float32), ops.cast(g_bad, ms.float32),
                           (a_change, g_change) if track_changes else None)
    return a, g, outcome


def refreshed_pair(a_factor, g_factor, ready, damping, a_old, g_old, trusted, positions, a_layout, g_layout,
                    damping_split, inverse_method, jitter):
    """:meth:`KroneckerBlock.refreshed`'s arithmetic on tensors and constants only, so that layers of one
    shape share one compiled copy (:func:`~mindspore_ngd._graph.per_shape_subgraph`)."""
    a_safe, a_valid, a_trace = inv_ops.sanitized_blocks(a_factor, a_layout)
    g_safe, g_valid, g_trace = inv_ops.sanitized_blocks(g_factor, g_layout)
    a_shift, g_shift = inv_ops.split_damping_traces(a_trace, a_layout.dim, g_trace, g_layout.dim,
                                                    damping, damping_split, positions)
    a_inv, a_ok = inv_ops.damped_inverse(a_safe, a_shift, inverse_method,
                                         inv_ops.jitter_of_trace(a_trace, jitter), a_old, trusted)
    g_inv, g_ok = inv_ops.damped_inverse(ops.depend(g_safe, a_inv), g_shift, inverse_method,
                                         inv_ops.jitter_of_trace(g_trace, jitter), g_old, trusted)
    ok = ops.logical_and(ops.logical_and(a_valid, g_valid), ops.logical_and(a_ok, g_ok))
    take = ops.logical_and(ok, ready)
    new_a = choose(take, a_inv, a_old)
    new_g = choose(take, g_inv, g_old)
    fault = ops.cast(ops.logical_and(ready, ops.logical_not(ok)), ms.int32)
    return new_a, new_g, take, fault


class KroneckerBlock(nn.Cell):
    """Curvature block ``A (x) G`` of one Dense/Conv2d layer (see the module docstring).

    Args:
        spec (LayerSpec): the layer.
        prefix (str): the optimizer's Parameter prefix.
        weight_index, bias_index (int): positions of the layer's weight and bias (-1: none) among the
            optimizer's parameters.
        owned (bool): this rank folds, inverts and preconditions the layer.
        split_dim (Optional[int]): invert factors larger than this as blocks of this size.
        loss_scale (float): fixed loss scale (G is unscaled by its square).
        traces (bool): also probe the batch traces (THOR's trace rule).
        damping_split, inverse_method, jitter: as :class:`mindspore_ngd.Policy`.
        sums_gradient (bool): the capture also records the output-gradient sum that
            :class:`mindspore_ngd.capture.LossScaleProbe` reads.
        stat_fraction, stat_stride, sequence_approx: batch statistics from a subsample, and K-FAC-expand
            or -reduce on sequences, as :class:`mindspore_ngd.Policy` (passed to the
            :class:`~mindspore_ngd.capture.LayerCapture`).
    """

    def __init__(self, spec, prefix, weight_index, bias_index, owned=True, split_dim=None, loss_scale=1.0,
                 traces=False, damping_split="pi", inverse_method="cholesky", jitter=1e-6, sums_gradient=False,
                 stat_fraction=1.0, stat_stride=1, sequence_approx="expand"):
        if inverse_method not in inv_ops.INVERSE_METHODS:       # "auto" is resolved by the optimizer
            raise ValueError(f"inverse_method must be one of {list(inv_ops.INVERSE_METHODS)}, got {inverse_method!r}")
        super().__init__(auto_prefix=False)
        self.spec = spec
        self.damping_split = damping_split
        # only the "positions" split reads T, the output positions the layer's A sums over
        self.reads_positions = damping_split == "positions"
        self.inverse_method = inverse_method
        self.jitter = jitter
        self.weight_index = weight_index
        self.bias_index = bias_index
        self.owned = owned
        base = f"{prefix}.{spec.name}"
        self.a_layout = self._input_layout(spec.a_dim, split_dim)
        self.g_layout = BlockLayout.of(spec.g_dim, split_dim)
        self.a_factor, self.a_inverse = self._input_state(base, owned)
        self.g_factor = _square(spec.g_dim, f"{base}.G", 0.0, owned)
        self.g_inverse = _identity_inverse(self.g_layout, f"{base}.G_inv", owned)
        self.capture = LayerCapture(spec, prefix, loss_scale, traces, sums_gradient, stat_fraction, stat_stride,
                                    sequence_approx, records_positions=self.reads_positions)
        # the fold and the refresh: one compiled copy per distinct shape, called by every layer of it
        self._folded_pair = per_shape_subgraph(folded_pair)
        self._refreshed_pair = per_shape_subgraph(refreshed_pair)

    def _input_layout(self, a_dim, split_dim):
        """How A is inverted: dense, or (THOR's ``split_dim``) as diagonal blocks."""
        return BlockLayout.of(a_dim, split_dim)

    def _input_state(self, base, owned):
        """The Parameters ``{base}.A`` (zeros) and ``{base}.A_inv`` (the identity)."""
        return (_square(self.spec.a_dim, f"{base}.A", 0.0, owned),
                _identity_inverse(self.a_layout, f"{base}.A_inv", owned))

    # ------------------------------------------------------------------ factors
    def factors(self):
        """(A, G) as stored."""
        return self.a_factor, self.g_factor

    def factor(self, which):
        return self.g_factor if which else self.a_factor

    def factor_trace(self, which):
        """The trace of the stored A (``which`` 0) or G (1)."""
        return ops.trace(self.factor(which))

    def batch(self, token):
        """The captured batch (A, G), read after ``token`` (a value computed from every gradient: the
        first layer's G is written by the last hook of the backward pass, and without this data
        dependency the read saw the previous step's G -- measured, MindSpore 2.10 CPU)."""
        return ops.depend(self.capture.a_batch, token), ops.depend(self.capture.g_batch, token)

    def unseen(self, a_batch, g_batch, take_a, take_g):
        """Whether this capture step shows the layer invisible: a statistic captured this step (its
        flag set) whose buffer still holds the initial UNSEEN mark (a bool scalar)."""
        return ops.logical_or(ops.logical_and(take_a, never_captured(a_batch)),
                              ops.logical_and(take_g, never_captured(g_batch)))

    def batch_trace(self, which):
        return self.capture.g_trace if which else self.capture.a_trace

    def fold(self, state, updates, a_batch, g_batch, take_a, take_g, decay, track_changes, damping=None):
        """Fold the batch factors captured this step into the averages ``state`` = (A, G), which have
        taken ``updates`` = (A count, G count) batches so far; ``take_a``/``take_g``: the capture flags.
        Returns ``(new A, new G, outcome)`` with ``outcome`` = (A taken, G taken, A rejected, G rejected,
        A change, G change) as float32 scalars (changes only with ``track_changes``; positions named by
        :class:`~mindspore_ngd.curvature.state.FoldOutcome`). With ``damping``
        each change is measured against the damped factor (``A + pi sqrt(damping) I``, split as the
        inversion splits it), so a factor far smaller than its damping counts as stable."""
        a_factor, g_factor = state
        a_updates, g_updates = updates
        return self._folded_pair(a_factor, g_factor, a_updates, g_updates, a_batch, g_batch, take_a, take_g, decay,
                                 track_changes, damping, self.damping_split, self.positions())

    def write_factors(self, state):
        """Store (A, G); the G write's result, after the A write (to order on)."""
        a_factor, g_factor = state
        written = ops.assign(self.a_factor, a_factor)
        return ops.depend(ops.assign(self.g_factor, g_factor), written)

    def positions(self):
        """T, the output positions the layer's A sums over (a float32 scalar; 1 for a Dense), as the last
        capture of A recorded it; None unless the damping split reads it ("positions")."""
        if not self.reads_positions:
            return None
        return self.capture.positions

    # ------------------------------------------------------------------ inverses
    def inverses(self):
        """(A inverse, G inverse) as stored."""
        return self.a_inverse, self.g_inverse

    def refreshed(self, state, ready, damping, inverses, trusted):
        """``(A inverse, G inverse, taken, fault)``: new damped inverses if ``ready`` and every check
        passes (factors plausibly PSD, results finite with a positive diagonal, the Newton-Schulz
        iteration converged), else the old ones.

        ``state`` is (A, G), ``inverses`` (A inverse, G inverse) as stored. ``inverse_method="newton"``
        may warm-start from them, but only when ``trusted`` (the layer's has-inverse flag) says they
        are real inverses (before the first accepted refresh they are the initial identity) and their
        residual shows convergence."""
        a_factor, g_factor = state
        a_old, g_old = inverses
        return self._refreshed_pair(a_factor, g_factor, ready, damping, a_old, g_old, trusted, self.positions(),
                                    self.a_layout, self.g_layout, self.damping_split, self.inverse_method,
                                    self.jitter)

    def write_inverses(self, state):
        """Store (A inverse, G inverse); the G write's result, after the A write (to order on)."""
        a_inverse, g_inverse = state
        written = ops.assign(self.a_inverse, a_inverse)
        return ops.depend(ops.assign(self.g_inverse, g_inverse), written)

    # ------------------------------------------------------------------ gradient
    def gradient(self, gradients):
        """The layer's gradient as a float32 ``(g_dim, a_dim)`` matrix, bias as the last column."""
        grad = gradients[self.weight_index]
        matrix = ops.cast(grad, ms.float32).reshape(grad.shape[0], -1)
        if self.bias_index >= 0:
            bias = ops.cast(gradients[self.bias_index], ms.float32)
            matrix = ops.concat((matrix, bias.reshape(-1, 1)), 1)
        return matrix

    def precondition(self, inverses, matrix):
        """``G^-1 dW A^-1``. Until the first accepted refresh the inverses are still the identity they
        were initialised to, and ``I dW I == dW`` exactly."""
        a_inverse, g_inverse = inverses
        return apply_right(apply_left(g_inverse, matrix, self.g_layout), a_inverse, self.a_layout)
