"""The curvature block of one ``nn.Embedding`` layer: a Kronecker block whose A is diagonal.

An embedding looks up row ``v`` of its table ``W`` (vocab, dim) for token ``v``: it is a Dense layer
without bias, ``y = W^T e_v``, whose input is the one-hot token ``e_v``. Every outer product
``e_v e_v^T`` is diagonal, so K-FAC's A is exactly the diagonal of the tokens' frequencies in the
batch (:func:`~mindspore_ngd.curvature.factors.embedding_input_factor`), as MindSpore's THOR kept it
for BERT's word embeddings; G is a Dense layer's over the looked-up rows. The block keeps A and its
inverse as (vocab,) vectors (``{prefix}.{layer}.A``, ``.A_inv``), so a vocabulary of tens of
thousands costs vectors, not vocab x vocab matrices, and A's inversion is entrywise.

Everything else is :class:`~mindspore_ngd.curvature.kronecker.KroneckerBlock`'s: the fold, the change
measure, the damping split and the checks read a (D,) factor as the diagonal of a (D, D) one
(:func:`~mindspore_ngd.curvature.inverse.sanitized_blocks`, :func:`~.inverse.damped_inverse`,
:func:`~.statistics.damped_square_norm`). The layer's gradient keeps the table's orientation (vocab,
dim), so the preconditioned step is ``diag(A^-1) dW G^-1`` (G is symmetric), already shaped like the
table.
"""
import numpy as np

import mindspore as ms
from mindspore import ops, Parameter, Tensor

from .blocks import BlockLayout, apply_right
from .kronecker import KroneckerBlock

__all__ = ["EmbeddingBlock"]


def _vector(dim, name, fill, owned):
    return Parameter(Tensor(np.full((dim if owned else 1,), fill, np.float32)), name=name, requires_grad=False)


class EmbeddingBlock(KroneckerBlock):
    """Curvature block ``diag(a) (x) G`` of one nn.Embedding layer (see the module docstring); the
    arguments are :class:`~mindspore_ngd.curvature.kronecker.KroneckerBlock`'s (``split_dim`` splits G
    only: A is diagonal)."""

    def _input_layout(self, a_dim, split_dim):
        return BlockLayout.of(a_dim, None)

    def _input_state(self, base, owned):
        return _vector(self.spec.a_dim, f"{base}.A", 0.0, owned), _vector(self.spec.a_dim, f"{base}.A_inv", 1.0, owned)

    def factor_trace(self, which):
        if which:
            return ops.trace(self.g_factor)
        return ops.reduce_sum(self.a_factor)

    def gradient(self, gradients):
        """The table's gradient as a float32 (vocab, dim) matrix."""
        return ops.cast(gradients[self.weight_index], ms.float32)

    def precondition(self, inverses, matrix):
        """``diag(A^-1) dW G^-1``: each token's row scaled by its inverse frequency, then G's inverse on
        the right. Until the first accepted refresh both inverses are the initial identity."""
        a_inverse, g_inverse = inverses
        return apply_right(matrix, g_inverse, self.g_layout) * a_inverse.reshape(-1, 1)
