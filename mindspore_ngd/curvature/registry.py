"""The curvature-block families, in one registry keyed by layer kind.

A :class:`BlockType` is one family of curvature blocks: the block class, how one block is built from
its layer's spec, the names of the statistics it keeps, and what one of its blocks costs in FLOPs.
:data:`BLOCK_TYPES` maps every layer kind (``LayerSpec.kind`` / ``NormSpec.kind``) to the type that
serves it:

=============  ==============================  =====================================================
kind           block type                      block
=============  ==============================  =====================================================
``dense``      :class:`KroneckerType`          :class:`~.kronecker.KroneckerBlock`: ``A (x) G``
``conv2d``     :class:`KroneckerType`          :class:`~.kronecker.KroneckerBlock`: ``A (x) G``
``attention``  :class:`KroneckerType`          :class:`~.kronecker.KroneckerBlock`: ``A (x) G``
``embedding``  :class:`EmbeddingType`          :class:`~.embedding.EmbeddingBlock`: ``diag(a) (x) G``
``batchnorm``  :class:`UnitBatchNormType`      :class:`~.unitwise.UnitBatchNormBlock`: 2x2 per unit
``layernorm``  :class:`UnitBatchNormType`      :class:`~.unitwise.UnitBatchNormBlock`: 2x2 per unit
=============  ==============================  =====================================================

:class:`~.estimator.BlockDiagonalCurvature` builds every block through :func:`block_type_of`, and
the benchmarks' cost model reads a layer's FLOPs from it. Each family's blocks run in the group of that
family: the Kronecker blocks layer by layer in :class:`~.kronecker_group.KroneckerGroup` (any block
with two statistics A and G, their capture flags and update counts, and a pair of inverses fits it:
``factors``, ``batch``, ``unseen``, ``fold``, ``write_factors``, ``inverses``, ``refreshed``,
``write_inverses``, ``gradient``, ``precondition``), the unit-wise blocks all at once in
:class:`~.unitwise.UnitWiseGroup` (one statistic per layer, (C, 3) per channel: ``factors``,
``batch``, ``fold``, ``write_factors``). The batch-statistic formulas of the
Kronecker kinds (A, G, their traces) stay with the capture, in the layer-type registry of
:mod:`mindspore_ngd.capture.layer_types`; a new kind of layer is registered in both: its
:class:`~mindspore_ngd.capture.layer_types.LayerType` (what to capture) and here (which block keeps
it).

Building a block through the registry creates exactly the Parameters the estimator created before
(``{prefix}.{layer}.A``, ``.G``, ``.A_inv``, ``.G_inv``, ``.F``), so checkpoints load unchanged.
"""
from dataclasses import dataclass
from typing import Any, Mapping

from ..capture.layer_types import registered
from .blocks import block_layout, inverse_cubes, precondition_flops
from .embedding import EmbeddingBlock
from .kronecker import KroneckerBlock
from .unitwise import UnitBatchNormBlock

__all__ = ["BlockContext", "BlockType", "KroneckerType", "EmbeddingType", "UnitBatchNormType", "BLOCK_TYPES",
           "KRONECKER", "EMBEDDING", "UNIT_BATCHNORM", "register_block_type", "block_type_of", "block_layout", "inverse_flops",
           "precondition_flops", "INVERSE_FLOPS_PER_CUBE"]

# FLOPs of a damped inverse per D^3: the Cholesky-based inverse as LAPACK does it (potrf D^3/3 +
# potri 2D^3/3)
INVERSE_FLOPS_PER_CUBE = 1.0


@dataclass(frozen=True)
class BlockContext:
    """What every block of one optimizer is built with.

    Attributes:
        prefix (str): the optimizer's Parameter prefix.
        index (Mapping[str, int]): parameter name -> position among the optimizer's parameters.
        policy: the optimizer's :class:`~mindspore_ngd.Policy` (split, inversion, damping split ...).
        loss_scale (float): the fixed loss scale of the training cell.
        traces (bool): the blocks also probe their batch traces (THOR's trace rule).
    """
    prefix: str
    index: Mapping[str, int]
    policy: Any
    loss_scale: float
    traces: bool = False


class BlockType:
    """One family of curvature blocks (subclass it, then :func:`register_block_type` an instance).

    Attributes:
        family (str): the family's name.
        kinds (tuple of str): the layer kinds it serves.
        block_class (type): the class of its blocks.
        statistics (tuple of str): the suffixes of the statistics one block keeps, in the order the
            estimator lists them (``{layer}.{suffix}``).
        opt_in (str or None): the :class:`~mindspore_ngd.Policy` field that must be True for its layers
            to be preconditioned (None: always); otherwise they get the plain update, with the reason in
            the WARNING line.
    """
    family = None
    kinds = ()
    block_class = None
    statistics = ()
    opt_in = None

    def build(self, spec, context, owned=True, sums_gradient=False):
        """The block of the layer ``spec``. ``owned``: this rank folds, inverts and preconditions it;
        ``sums_gradient``: its capture also records what the loss-scale probe reads."""
        raise NotImplementedError

    def flops(self, spec, batch, positions, split_dim=None):
        """FLOPs of one layer at batch ``batch`` with ``positions`` output positions per example, by
        phase (see :meth:`KroneckerType.flops`)."""
        raise NotImplementedError(f"block family {self.family!r} has no FLOP model")


def inverse_flops(dim, split_dim=None):
    """The damped inverse of a factor of side ``dim``: ``INVERSE_FLOPS_PER_CUBE * count * size^3``."""
    return INVERSE_FLOPS_PER_CUBE * inverse_cubes(dim, split_dim)


class KroneckerType(BlockType):
    """Dense and Conv2d layers, and the packed input projection of an nn.MultiheadAttention (a Dense layer
    on the attention's input rows): a :class:`~mindspore_ngd.curvature.kronecker.KroneckerBlock` each."""
    family = "kronecker"
    kinds = ("dense", "conv2d", "attention")
    block_class = KroneckerBlock
    statistics = ("A", "G")

    def build(self, spec, context, owned=True, sums_gradient=False):
        policy, index = context.policy, context.index
        return KroneckerBlock(spec, context.prefix, index[spec.weight_name],
                              index[spec.bias_name] if spec.has_bias else -1, owned, policy.split_dim,
                              context.loss_scale, context.traces, policy.damping_split, policy.inverse_method,
                              policy.jitter, sums_gradient, policy.stat_fraction, policy.stat_stride,
                              policy.sequence_approx)

    def flops(self, spec, batch, positions, split_dim=None):
        """``{"forward", "backward"}`` per step, ``{"capture_a", "capture_g"}`` per capture,
        ``{"inverse_a", "inverse_g"}`` per refresh and ``"precondition"`` per step."""
        a, g = spec.a_dim, spec.g_dim
        rows = batch * positions
        forward = 2 * rows * g * (a - int(spec.has_bias))
        return {"forward": forward, "backward": 2 * forward,
                "capture_a": 2 * rows * a * a, "capture_g": 2 * rows * g * g,
                "inverse_a": inverse_flops(a, split_dim), "inverse_g": inverse_flops(g, split_dim),
                "precondition": precondition_flops(g, a, split_dim)}


class EmbeddingType(KroneckerType):
    """nn.Embedding layers: an :class:`~mindspore_ngd.curvature.embedding.EmbeddingBlock` each, a Kronecker
    block whose A is the (vocab,) diagonal of the tokens' frequencies."""
    family = "kronecker"
    kinds = ("embedding",)
    block_class = EmbeddingBlock
    opt_in = "precondition_embeddings"

    def build(self, spec, context, owned=True, sums_gradient=False):
        policy, index = context.policy, context.index
        return EmbeddingBlock(spec, context.prefix, index[spec.weight_name], -1, owned, policy.split_dim,
                              context.loss_scale, context.traces, policy.damping_split, policy.inverse_method,
                              policy.jitter, sums_gradient, policy.stat_fraction, policy.stat_stride,
                              policy.sequence_approx)

    def flops(self, spec, batch, positions, split_dim=None):
        """As :meth:`KroneckerType.flops`, for a lookup (no forward arithmetic; the backward pass scatters
        the rows' gradients) and a diagonal A (counted, inverted and applied entrywise)."""
        v, g = spec.a_dim, spec.g_dim
        rows = batch * positions
        g_count, g_size = block_layout(g, split_dim)
        return {"forward": 0, "backward": rows * g, "capture_a": rows, "capture_g": 2 * rows * g * g,
                "inverse_a": v, "inverse_g": inverse_flops(g, split_dim),
                "precondition": 2 * v * g_count * g_size ** 2 + v * g}


class UnitBatchNormType(BlockType):
    """BatchNorm and LayerNorm layers preconditioned unit-wise (SP-NGD): a
    :class:`~mindspore_ngd.curvature.unitwise.UnitBatchNormBlock` each (the block does not depend on the
    kind: one (C, 3) Fisher per layer; the capture knows which axis holds the units)."""
    family = "unitwise"
    kinds = ("batchnorm", "layernorm")
    block_class = UnitBatchNormBlock
    statistics = ("F",)

    def build(self, spec, context, owned=True, sums_gradient=False):
        index = context.index
        return UnitBatchNormBlock(spec, context.prefix, index[spec.gamma_name], index[spec.beta_name],
                                  context.loss_scale)


BLOCK_TYPES = {}
"""layer kind -> :class:`BlockType`, in registration order."""


def register_block_type(block_type):
    """Register a :class:`BlockType` instance under each of its ``kinds``; returns it. A kind that
    already has a block type is a ValueError naming it (nothing is registered then)."""
    if not block_type.kinds or not all(isinstance(k, str) and k for k in block_type.kinds):
        raise ValueError(f"a block type needs non-empty kind strings, got {block_type.kinds!r}")
    for kind in block_type.kinds:
        if kind in BLOCK_TYPES:
            raise ValueError(f"layer kind {kind!r} already has block type {BLOCK_TYPES[kind].family!r}")
    for kind in block_type.kinds:
        BLOCK_TYPES[kind] = block_type
    return block_type


def block_type_of(spec):
    """The :class:`BlockType` of a LayerSpec / NormSpec (or of a kind string)."""
    return registered(BLOCK_TYPES, spec, "block type")


KRONECKER = register_block_type(KroneckerType())
EMBEDDING = register_block_type(EmbeddingType())
UNIT_BATCHNORM = register_block_type(UnitBatchNormType())
