"""The attention kind: ``nn.MultiheadAttention`` and :class:`~mindspore_ngd.SelfAttention`, captured
when they are called as self-attention (:class:`AttentionType`, registered here under ``"attention"``).

Its packed input projection is a Dense layer on the rows of the attention's input, so the kind reuses
Dense's fields and formulas; what is its own is which attentions are self-attention (a compiled graph
cannot tell), and the capturing constructs that run the projection as a layer between the capture of
its input and the G hook on its output.
"""
from mindspore import nn, ops
from mindspore.ops.function.nn_func import multi_head_attention_forward

from .._graph import permuted
from .layer_types import DenseType, register_layer_type
from .self_attention import SelfAttention

__all__ = ["AttentionType", "SELF_ATTENTION_ONLY", "ATTENTION"]


_MATMUL_TB = ops.MatMul(transpose_b=True)
_BIAS_ADD = ops.BiasAdd()


class _CapturedMultiheadAttention:
    """construct of a capturing nn.MultiheadAttention with packed projection weights.

    Only the ``self_attn`` of a stock nn.TransformerEncoderLayer / nn.TransformerDecoderLayer is captured
    (:meth:`AttentionType.network_reasons`): their ``_sa_block`` calls it as self-attention,
    ``attn(x, x, x, ...)``, which a compiled graph cannot tell from cross-attention otherwise (the stock
    ``__call__`` that records ``q_is_k`` and ``k_is_v`` does not run for a cell inside a graph). In
    training the packed input projection ``[q k v] = x W_in^T + b_in`` runs here, as one Dense layer on
    the rows of ``x``, between the capture of its input and the G hook on its output;
    the attention itself is MindSpore's ``multi_head_attention_forward`` on the projected q, k and v
    (identity projections in and out, so that every mask, dropout and ``bias_k`` option is the stock
    code's), and the output projection is the ``out_proj`` cell called as a layer, which captures as any
    nn.Dense. In inference it is the stock computation."""

    def construct(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                  average_attn_weights=True):
        if self.training:
            return self._ngd_self_attention(query, key_padding_mask, need_weights, attn_mask, average_attn_weights)
        return self._ngd_stock(query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights)

    def _ngd_outputs(self, output, weights, swap, need_weights):
        if swap:
            output = output.swapaxes(1, 0)
        if need_weights:
            return output, weights
        return (output,)

    def _ngd_stock(self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights):
        swap = self.batch_first and query.ndim == 3
        if swap:
            query, key, value = query.swapaxes(1, 0), key.swapaxes(1, 0), value.swapaxes(1, 0)
        output, weights = multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight, self.in_proj_bias, self.bias_k,
            self.bias_v, self.add_zero_attn, self.dropout, self.out_proj.weight, self.out_proj.bias,
            training=self.training, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
            average_attn_weights=average_attn_weights, k_is_v=self.k_is_v, q_is_k=self.q_is_k, dtype=self.dtype)
        return self._ngd_outputs(output, weights, swap, need_weights)

    def _ngd_in_proj(self, rows):
        """The packed input projection ``[q k v] = rows W_in^T + b_in`` of (N, E) rows."""
        packed = _MATMUL_TB(rows, self.in_proj_weight)
        if self.in_proj_bias is not None:
            packed = _BIAS_ADD(packed, self.in_proj_bias)
        return packed

    def _ngd_self_attention(self, x, key_padding_mask, need_weights, attn_mask, average_attn_weights):
        swap = self.batch_first and x.ndim == 3
        if swap:
            x = x.swapaxes(1, 0)
        shape = x.shape                                   # (L, B, E), or (L, E) unbatched
        if x.ndim == 3 and self._ngd_capture.reduces:
            # K-FAC-reduce: the capture sees the input and the output gradient per sequence, (B, L, n)
            seqs = self._ngd_capture.capture_input(permuted(x, (1, 0, 2)))
            packed = self._ngd_in_proj(seqs.reshape(-1, self.embed_dim)).reshape(shape[1], shape[0], -1)
            packed = permuted(self._ngd_capture.grad_hook(packed), (1, 0, 2))
        else:
            rows = self._ngd_capture.capture_input(x.reshape(-1, self.embed_dim))
            packed = self._ngd_capture.grad_hook(self._ngd_in_proj(rows))
        q, k, v = ops.split(packed, self.embed_dim, axis=-1)
        eye = ops.eye(self.embed_dim, self.embed_dim, packed.dtype)
        output, weights = multi_head_attention_forward(
            q.reshape(shape), k.reshape(shape), v.reshape(shape), self.embed_dim, self.num_heads, None, None,
            self.bias_k, self.bias_v, self.add_zero_attn, self.dropout, eye, None, training=True,
            key_padding_mask=key_padding_mask, attn_mask=attn_mask, use_separate_proj_weight=True,
            q_proj_weight=eye, k_proj_weight=eye, v_proj_weight=eye, average_attn_weights=average_attn_weights,
            dtype=self.dtype)
        return self._ngd_outputs(self.out_proj(output), weights, swap, need_weights)


class _CapturedSelfAttention(_CapturedMultiheadAttention):
    """construct of a capturing :class:`~mindspore_ngd.SelfAttention`: one input, captured in training as a
    stock encoder layer's ``self_attn`` is, the stock computation in inference."""

    def construct(self, x, key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True):
        if self.training:
            return self._ngd_self_attention(x, key_padding_mask, need_weights, attn_mask, average_attn_weights)
        return self._ngd_stock(x, x, x, key_padding_mask, need_weights, attn_mask, average_attn_weights)


SELF_ATTENTION_ONLY = ("not the self_attn of a stock nn.TransformerEncoderLayer or nn.TransformerDecoderLayer "
                       "(a compiled graph cannot tell self- from cross-attention; a self-attention of your own is "
                       "preconditioned as a mindspore_ngd.SelfAttention)")


class AttentionType(DenseType):
    """``nn.MultiheadAttention``'s packed input projection (weight ``in_proj_weight`` (3E, E), bias
    ``in_proj_bias``): a Dense layer on the rows of the attention's input (Dense's fields and formulas),
    captured when the attention is called as self-attention in training: the ``self_attn`` of a stock
    transformer layer (:class:`_CapturedMultiheadAttention`) or a :class:`~mindspore_ngd.SelfAttention`
    (:class:`_CapturedSelfAttention`); its ``out_proj`` is then called as a layer and preconditioned as
    an nn.Dense. ``a_dim`` is E (+1 with the bias), ``g_dim`` 3E. Separate q/k/v weights (``kdim`` or
    ``vdim`` other than E) are not captured. With ``sequence_approx="reduce"`` a batched input is
    captured per sequence, (B, L, E), as a Dense layer's is."""
    kind = "attention"
    classes = (SelfAttention, nn.MultiheadAttention)        # the subclass first: its construct is its own
    constructs = ((SelfAttention, _CapturedSelfAttention), (nn.MultiheadAttention, _CapturedMultiheadAttention))
    probe_rank = 3              # its key bias has no gradient (softmax): a Dense layer probes the loss scale
    weight_attr = "in_proj_weight"

    def bias_of(self, cell):
        return cell.in_proj_bias

    def unsupported_reason(self, cell, base):
        if cell.in_proj_weight is None:
            return "separate q/k/v projection weights (kdim or vdim other than embed_dim)"
        return None

    def network_reasons(self, network):
        """``{id(cell): reason}`` for every nn.MultiheadAttention of ``network`` that is neither the
        ``self_attn`` of a stock nn.TransformerEncoderLayer / nn.TransformerDecoderLayer nor a
        :class:`~mindspore_ngd.SelfAttention` (see :class:`_CapturedMultiheadAttention`)."""
        owners = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
        self_attention = {id(cell.self_attn) for _, cell in network.cells_and_names()
                          if isinstance(cell, owners) and type(cell)._sa_block in [o._sa_block for o in owners]}
        self_attention |= {id(cell) for _, cell in network.cells_and_names() if isinstance(cell, SelfAttention)}
        return {id(cell): SELF_ATTENTION_ONLY for _, cell in network.cells_and_names()
                if isinstance(cell, nn.MultiheadAttention) and id(cell) not in self_attention}


ATTENTION = register_layer_type(AttentionType())
