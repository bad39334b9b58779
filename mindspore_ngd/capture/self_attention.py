"""``SelfAttention``: an ``nn.MultiheadAttention`` that is self-attention by construction.

Inside a compiled graph nothing tells whether an attention's query, key and value are one tensor
(MindSpore's ``nn.MultiheadAttention.__call__`` records it with Python's ``is``, which a cell called
from a compiled graph never runs), so the capture takes only attentions whose caller is known: the
``self_attn`` of a stock transformer layer, and this class. Its call takes one input, so the packed
input projection has one input, and the optimizers precondition it and its ``out_proj`` as they do
a stock encoder layer's (:class:`~mindspore_ngd.capture.attention.AttentionType`).
"""
import mindspore as ms
from mindspore import nn

__all__ = ["SelfAttention"]


class SelfAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` called as self-attention: ``attn(x, ...)`` is the stock ``attn(x, x, x, ...)``.

    The constructor's arguments are ``nn.MultiheadAttention``'s; ``kdim`` and ``vdim`` must be left at
    ``embed_dim`` (a self-attention's key and value are its query). The Parameters, and so the
    checkpoint keys, are the stock layer's, so a model that called ``nn.MultiheadAttention(...)(x, x, x)``
    switches by replacing the class and dropping the two repeated arguments, and loads its old checkpoints.

    Inputs: ``x`` and the stock keyword arguments ``key_padding_mask``, ``need_weights``, ``attn_mask`` and
    ``average_attn_weights``, with their stock defaults. Outputs: the stock layer's.

    Raises:
        ValueError: if ``kdim`` or ``vdim`` differs from ``embed_dim``.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, has_bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, dtype=ms.float32):
        for name, dim in (("kdim", kdim), ("vdim", vdim)):
            if dim is not None and dim != embed_dim:
                raise ValueError(f"SelfAttention: {name} must be None or embed_dim={embed_dim} (key and value are "
                                 f"the query), got {dim}")
        super().__init__(embed_dim, num_heads, dropout, has_bias, add_bias_kv, add_zero_attn, None, None,
                         batch_first, dtype)
        # what the stock __call__ records with ``is``, true by construction (read by its construct)
        self.q_is_k = self.k_is_v = True

    def __call__(self, x, *args, **kwargs):
        # the stock __call__ reads three positional inputs; the flags it would set are fixed above
        return nn.Cell.__call__(self, x, *args, **kwargs)

    def construct(self, x, key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True):
        return super().construct(x, x, x, key_padding_mask, need_weights, attn_mask, average_attn_weights)
