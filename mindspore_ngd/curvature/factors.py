"""Kronecker-factor statistics of one batch, written with graph-mode MindSpore ops.

Numerical contract (docs/algorithms.md; Martens & Grosse 2015, Grosse & Martens 2016). For a batch of
B examples whose training loss is the MEAN of the per-example losses l_b:

* Dense ``y = W a + b``: ``abar = [a; 1]`` with a bias, ``g_b = d l_b / d y_b = B * dL/dy_b``,
  ``A = (1/B) sum_b abar abar^T``, ``G = (1/B) sum_b g g^T = B * sum_b dy dy^T``.
  Inputs with more than two dimensions are flattened to rows, and every row counts as an example
  (K-FAC-expand, Eschenhagen et al. 2023, with the B R rows as examples). K-FAC-reduce
  (``sequence_approx="reduce"``) counts each of the B examples once, with its R rows averaged on the
  input side and summed on the output side: ``abar_b = [mean_r a_{b,r}; 1]``, ``s_b = sum_r dy_{b,r}``,
  ``A = (1/B) sum_b abar_b abar_b^T``, ``G = B R sum_b s_b s_b^T``. G keeps the expand factor's scale
  (the loss a mean over the B R rows), so that the two are the same when R = 1. For one example
  (B = 1) whose input does not depend on r, reduce is exact: ``A (x) G = R vec(dL/dW) vec(dL/dW)^T``
  (column-major ``vec`` of ``[dW | db]``), which expand is not.
* Conv2d (KFC): the weight (out, in, kh, kw) is flattened row-major to (out, in*kh*kw). For the T
  output positions ``abar_{b,t}`` is the im2col patch (zero padding included, 1 appended with a
  bias): ``A = (1/B) sum_{b,t} abar abar^T``, ``G = (1/(B*T)) sum_{b,t} g g^T = (B/T) sum dy dy^T``.
* Embedding (a Dense layer without bias whose input is the one-hot token ``e_v``, every token of the
  batch an example: N = B R rows): ``A = (1/N) sum_n e_{v_n} e_{v_n}^T = diag(c_v / N)``, the tokens'
  frequencies in the batch, kept as that vector; ``G = N sum_n dy_n dy_n^T`` over the looked-up rows, a
  Dense layer's (K-FAC-expand). Its trace is 1 (an id outside ``[0, vocab)`` looks up zeros and counts
  for nothing).
* ``g_scale`` multiplies G: it is ``1 / loss_scale**2`` so that G is computed from unscaled
  gradients.

Subsampled statistics (``stat_fraction`` f and ``stat_stride`` s of :class:`mindspore_ngd.Policy`).
A and G may be estimated from the first ``m = max(1, ceil(f * B))`` examples S of the batch (rows,
for a Dense input flattened to rows; the training data is shuffled, so they are a random subset)
and, for a Conv2d, from the T' output positions S' in rows 0, s, 2s, ... and columns 0, s, 2s, ...
(``T' = ceil(H_out/s) * ceil(W_out/s)``). Each sum is rescaled to estimate the full one: A sums
over positions per example, G averages over them, and dy is still the gradient of the mean loss
over all B examples (``g = B dy``):

* Dense: ``A = (1/m) sum_{b in S} abar abar^T``, ``G = (1/m) sum_{b in S} g g^T = (B^2/m) sum_S dy dy^T``.
* Conv2d: ``A = (T/T') (1/m) sum_{b in S, t in S'} abar abar^T`` (with a bias the corner entry stays
  T), ``G = (1/(m T')) sum_{S, S'} g g^T = (B^2/(m T')) sum_{S, S'} dy dy^T``.

Over a random subset S of examples the estimates are unbiased for the full-batch A and G. The
position grid S' is fixed, not random: it estimates the full position sum/average as KFC's own
spatial-homogeneity assumption does (exactly when the statistics do not depend on the position).
With f = 1 and s = 1 the formulas, and the graph, are the full ones (no slice, no extra op); m is
``ceil`` of ``f * B`` rounded to 9 decimals, so that float error does not add an example. The trace probes
(:func:`dense_input_trace`, :func:`conv_input_trace`, :func:`output_trace`), the loss-scale probe's
:func:`output_sum` and the unit-wise BatchNorm Fisher always use the whole batch.

All statistics are float32 whatever the network's dtype.
"""
import math

import mindspore as ms
from mindspore import ops

from .._graph import divide, gram as _gram, permuted, transposed

__all__ = ["kept_rows", "kept_examples", "output_sum", "dense_input_factor", "dense_output_factor",
           "conv_input_factor", "conv_output_factor", "conv_patches", "conv_positions", "same_padding", "dense_input_trace",
           "conv_input_trace", "output_trace", "dense_reduce_input_factor", "dense_reduce_output_factor",
           "dense_reduce_input_trace", "dense_reduce_output_trace", "embedding_input_factor", "embedding_input_trace",
           "unit_probe", "spread", "normalized_input", "unit_probe_last",
           "layer_normalized_input", "unit_fisher", "unit_natural_gradient"]


_MATMUL_TB = ops.MatMul(transpose_b=True)
_BATCH_MATMUL_TB = ops.BatchMatMul(transpose_b=True)

# From this many elements of a conv layer's (examples, dim, positions) patches or output gradients on,
# their Gram is summed over per-example products when dim <= positions (below).
BATCHED_GRAM_MIN = 1 << 20


def _position_gram(rows):
    """``sum_n X_n X_n^T`` of a (N, D, T) stack (im2col patches, or a conv layer's output gradients),
    and the (D, 1) column of its sums over N and T.

    Laid out as one (D, N*T) matrix, as small layers are, the stack needs a transposed copy
    (:func:`~mindspore_ngd._graph.permuted`; the Transpose kernel used before held about 2.5 copies of
    it for the process's life). A large stack with ``D <= T`` is multiplied per example instead (one
    batched matmul, then a sum over N: an intermediate no larger than the stack, no copy)."""
    n, d, t = rows.shape
    if d <= t and n * d * t >= BATCHED_GRAM_MIN:
        return _BATCH_MATMUL_TB(rows, rows).sum(0), rows.sum(2).sum(0).reshape(d, 1)
    cols = permuted(rows, (1, 0, 2)).reshape(d, n * t)
    return _MATMUL_TB(cols, cols), cols.sum(1, keepdims=True)


def kept_rows(rows, fraction):
    """``m = max(1, ceil(fraction * rows))``: how many leading rows (examples) the statistics use.

    The product is rounded to 9 decimals first, so that float error does not add a row
    (``0.07 * 100`` is 7.000000000000001 in binary floating point: 7 rows, not 8)."""
    if fraction >= 1.0:
        return rows
    return min(rows, max(1, math.ceil(round(fraction * rows, 9))))


def kept_examples(x, fraction):
    """``(x[:m], m)``: the first ``m`` examples (axis 0) of a batch of static size; ``x`` itself
    (no slice in the graph) when ``m`` is the whole batch."""
    rows = x.shape[0]
    kept = kept_rows(rows, fraction)
    if kept == rows:
        return x, rows
    return x[:kept], kept


def dense_input_factor(x, has_bias, fraction=1.0):
    """A of a Dense layer from its 2-D input (rows, in), from the first ``m`` rows (see the module
    docstring)."""
    x = ops.cast(x, ms.float32)
    x, rows = kept_examples(x, fraction)
    if has_bias:
        x = ops.concat((x, ops.ones((rows, 1), ms.float32)), 1)
    return divide(_gram(x), rows)


def dense_output_factor(dy, g_scale, fraction=1.0):
    """G of a Dense layer from the gradient of the mean loss w.r.t. its 2-D output (rows, out):
    ``(B^2/m) * sum_{first m rows} dy dy^T`` (``B * sum dy dy^T`` when m = B)."""
    dy = ops.cast(dy, ms.float32)
    rows = dy.shape[0]
    dy, kept = kept_examples(dy, fraction)
    return _gram(dy) * (rows * (rows / kept) * g_scale)        # rows / kept is exactly 1.0 when m = B


def embedding_input_factor(ids, vocab, fraction=1.0):
    """A of an Embedding layer from its flat token ids (N,): the diagonal ``c_v / m`` as a (vocab,) vector,
    ``c_v`` the count of token v among the first ``m`` ids (module docstring). Ids outside ``[0, vocab)``
    (which look up zeros) are not counted."""
    ids, kept = kept_examples(ids.reshape(-1), fraction)
    ids = ops.cast(ids, ms.int32)
    inside = ops.logical_and(ids >= 0, ids < vocab)
    ones = ops.cast(inside, ms.float32)
    counts = ops.unsorted_segment_sum(ones, ops.where(inside, ids, ops.zeros_like(ids)), vocab)
    return counts / float(kept)


def embedding_input_trace(ids, vocab):
    """trace(A) of an Embedding layer without forming A: the fraction of ids inside ``[0, vocab)``."""
    ids = ops.cast(ids.reshape(-1), ms.int32)
    inside = ops.logical_and(ids >= 0, ids < vocab)
    return ops.reduce_sum(ops.cast(inside, ms.float32)) / float(ids.shape[0])


def _sequences(x):
    """A Dense input or output of shape (B, ..., features) as (B, R, features), R the positions per
    example."""
    return x.reshape(x.shape[0], -1, x.shape[-1])


def dense_reduce_input_factor(x, has_bias, fraction=1.0):
    """K-FAC-reduce's A of a Dense layer from its (B, ..., in) input (Eschenhagen et al. 2023): each
    example's rows averaged, ``abar_b = mean_r a_{b,r}``, then ``(1/m) sum_b abar_b abar_b^T`` over the
    first ``m`` examples (with a 1 appended when there is a bias)."""
    return dense_input_factor(_sequences(ops.cast(x, ms.float32)).mean(axis=1), has_bias, fraction)


def dense_reduce_output_factor(dy, g_scale, fraction=1.0):
    """K-FAC-reduce's G of a Dense layer from the gradient of the mean loss w.r.t. its (B, ..., out)
    output: each example's rows summed, ``s_b = sum_r dy_{b,r}``, then ``B R (B/m) sum_{first m} s_b
    s_b^T`` -- the scale of :func:`dense_output_factor` over the B R rows, so that the two agree when
    R = 1 (module docstring)."""
    dy = _sequences(ops.cast(dy, ms.float32))
    batch, positions = dy.shape[0], dy.shape[1]
    sums, kept = kept_examples(dy.sum(axis=1), fraction)
    return _gram(sums) * (batch * positions * (batch / kept) * g_scale)


def dense_reduce_input_trace(x, has_bias):
    """trace(A) of K-FAC-reduce's A without forming it."""
    return dense_input_trace(_sequences(ops.cast(x, ms.float32)).mean(axis=1), has_bias)


def dense_reduce_output_trace(dy, g_scale, conv=False):
    """trace(G) of K-FAC-reduce's G without forming it: ``B R sum_b |s_b|^2``."""
    dy = _sequences(ops.cast(dy, ms.float32))
    sums = dy.sum(axis=1)
    return ops.reduce_sum(sums * sums) * (g_scale * dy.shape[0] * dy.shape[1])


def same_padding(size, kernel, stride, dilation):
    """(before, after) zero padding of MindSpore's ``pad_mode='same'`` along one spatial axis."""
    out = (size + stride - 1) // stride
    needed = (out - 1) * stride + (kernel - 1) * dilation + 1 - size
    if needed < 0:
        needed = 0
    return needed // 2, needed - needed // 2


def dense_input_trace(x, has_bias):
    """trace(A) of a Dense layer without forming A: mean squared row norm (+1 with a bias)."""
    x = ops.cast(x, ms.float32)
    trace = ops.reduce_sum(x * x) / x.shape[0]
    return trace + 1.0 if has_bias else trace


def output_sum(dy, conv):
    """Sum of the output gradient over the batch (and positions): the bias gradient the backward pass
    computes, at the loss scale of the step (:class:`mindspore_ngd.capture.LossScaleProbe`). A Dense
    output of more than two dimensions (K-FAC-reduce's hook sees (B, R, out)) sums over every axis
    but the last."""
    dy = ops.cast(dy, ms.float32)
    if conv:
        return dy.sum(axis=(0, 2, 3))
    if dy.ndim > 2:
        dy = dy.reshape(-1, dy.shape[-1])
    return dy.sum(axis=0)


def output_trace(dy, g_scale, conv):
    """trace(G) without forming G: ``rows * sum dy^2`` (Dense) or ``(B / T) * sum dy^2`` (Conv2d)."""
    dy = ops.cast(dy, ms.float32)
    total = ops.reduce_sum(dy * dy) * g_scale
    if conv:
        return total * (dy.shape[0] / (dy.shape[2] * dy.shape[3]))
    return total * dy.shape[0]


def conv_input_trace(x, kernel_size, stride, dilation, pad_mode, padding, has_bias):
    """trace(A) of a Conv2d without im2col: ``(1/B) sum_t |patch_t|^2`` (+T with a bias).

    The sum of squared patch norms is a convolution of ``x^2`` with an all-ones kernel (one output
    channel) over the same geometry: one cheap convolution instead of the patch covariance.
    """
    x = _padded(ops.cast(x, ms.float32), kernel_size, stride, dilation, pad_mode, padding)
    ones = ops.ones((1, x.shape[1], kernel_size[0], kernel_size[1]), ms.float32)
    sums = ops.conv2d(x * x, ones, None, stride, "valid", 0, dilation)
    trace = ops.reduce_sum(sums) / x.shape[0]
    if has_bias:
        trace = trace + sums.shape[2] * sums.shape[3]
    return trace


def _pads(height, width, kernel_size, stride, dilation, pad_mode, padding):
    """(top, bottom, left, right) zero padding of the layer (static, from the input's spatial size)."""
    if pad_mode == "same":
        top, bottom = same_padding(height, kernel_size[0], stride[0], dilation[0])
        left, right = same_padding(width, kernel_size[1], stride[1], dilation[1])
        return top, bottom, left, right
    if pad_mode == "pad":
        top, bottom, left, right = padding
        return top, bottom, left, right
    return 0, 0, 0, 0


def _padded(x, kernel_size, stride, dilation, pad_mode, padding):
    top, bottom, left, right = _pads(x.shape[2], x.shape[3], kernel_size, stride, dilation, pad_mode, padding)
    if top + bottom + left + right > 0:
        x = ops.pad(x, (left, right, top, bottom))
    return x


def _output_size(padded, kernel, stride, dilation):
    return (padded - (kernel - 1) * dilation - 1) // stride + 1


def conv_positions(x, kernel_size, stride, dilation, pad_mode, padding):
    """T, the number of output positions ``H_out * W_out`` of a Conv2d on the NCHW input ``x`` (a
    Python int: static in graph mode)."""
    top, bottom, left, right = _pads(x.shape[2], x.shape[3], kernel_size, stride, dilation, pad_mode, padding)
    return _output_size(x.shape[2] + top + bottom, kernel_size[0], stride[0], dilation[0]) \
        * _output_size(x.shape[3] + left + right, kernel_size[1], stride[1], dilation[1])


def conv_patches(x, kernel_size, stride, dilation, pad_mode, padding, position_stride=1):
    """im2col patches of an NCHW input: (N, C*kh*kw, T), rows ordered like the flattened weight.

    ``padding`` is (top, bottom, left, right) for ``pad_mode='pad'``; it is ignored otherwise. With
    ``position_stride`` s > 1 only the output positions in rows 0, s, 2s, ... and columns 0, s, 2s,
    ... are extracted (``ceil(H_out/s) * ceil(W_out/s)`` of them): the windows of output position
    ``i*s`` start at ``i*s*stride`` in the padded input, so this is im2col of the same padded input
    with stride ``stride * s``.
    """
    x = _padded(ops.cast(x, ms.float32), kernel_size, stride, dilation, pad_mode, padding)
    if position_stride > 1:
        stride = (stride[0] * position_stride, stride[1] * position_stride)
    return ops.unfold(x, kernel_size, dilation, 0, stride)


def conv_input_factor(x, kernel_size, stride, dilation, pad_mode, padding, has_bias, fraction=1.0,
                      position_stride=1):
    """A of a Conv2d layer (groups = 1) from its NCHW input; from the first ``m`` examples and
    every ``position_stride``-th output position per axis, rescaled by ``T/T'`` (module docstring)."""
    full_batch = x.shape[0]
    x, batch = kept_examples(x, fraction)
    patches = conv_patches(x, kernel_size, stride, dilation, pad_mode, padding, position_stride)
    _, dim, positions = patches.shape
    gram, sums = _position_gram(patches)
    if batch == full_batch and position_stride == 1:
        total, divisor = positions, batch
    else:   # subsampled: T = all output positions of the layer, T' = the kept ones; A scaled by T / (m T')
        total = conv_positions(x, kernel_size, stride, dilation, pad_mode, padding)
        divisor = positions * batch / total
    a = divide(gram, divisor)
    if has_bias:
        # the appended 1 contributes a column of patch sums and a corner of T (= sum_t 1 per example)
        col_sum = divide(sums, divisor)
        corner = ops.fill(ms.float32, (1, 1), float(total))
        a = ops.concat((ops.concat((a, col_sum), 1),
                        ops.concat((transposed(col_sum), corner), 1)), 0)
    return a


def conv_output_factor(dy, g_scale, fraction=1.0, position_stride=1):
    """G of a Conv2d layer from the gradient of the mean loss w.r.t. its NCHW output; from the first
    ``m`` examples and ``dy[:, :, ::s, ::s]``: ``(B^2/(m T')) sum dy dy^T`` (module docstring)."""
    dy = ops.cast(dy, ms.float32)
    full_batch = dy.shape[0]
    dy, batch = kept_examples(dy, fraction)
    if position_stride > 1:
        dy = dy[:, :, ::position_stride, ::position_stride]
    channels = dy.shape[1]
    positions = dy.shape[2] * dy.shape[3]
    gram, _ = _position_gram(dy.reshape(batch, channels, positions))
    # B^2 / (m T'); with m = B and every position exactly the full formula's B / T (times g_scale)
    return gram * (g_scale * full_batch * (full_batch / batch) / positions)


# ---------------------------------------------------------------- unit-wise BatchNorm statistics
# SP-NGD (Osawa et al. 2020, sec. 4.3) treats each BatchNorm channel c as a unit with its own 2x2
# Fisher of (gamma_c, beta_c). With y = gamma * xhat + beta and per-example output gradients
# dy_b = d l_b / d y_b, the per-example parameter gradients are (sums over spatial positions)
#     g_gamma = sum_hw xhat * dy_b,   g_beta = sum_hw dy_b,
# and F_c = (1/B) sum_b [g_gamma g_beta]^T [g_gamma g_beta]. The three distinct entries are stored
# per channel as columns (F_gg, F_gb, F_bb) of a (C, 3) matrix.

def unit_probe(gamma, batch, ndim):
    """A zero tensor (2, B, C, 1, ...) whose gradient carries the per-example (g_gamma, g_beta).

    It is tied to ``gamma`` (times 0) only so that autodiff reaches it: MindSpore does not
    differentiate through a pure constant, and a hook on one never runs.
    """
    channels = gamma.shape[0]
    tail = (1,) * (ndim - 2)
    return ops.zeros((2, batch, channels) + tail, ms.float32) + 0.0 * ops.cast(gamma, ms.float32).reshape(
        (1, 1, channels) + tail)


def spread(small, shape):
    """``small`` broadcast to ``shape`` as a tensor of its own, for an elementwise op with a tensor of
    that shape.

    MindSpore 2.10's CPU Add, Sub, Mul and RealDiv (``arithmetic_cpu_kernel``) keep, for each
    operation in a compiled graph whose operands are broadcast (neither the same shape nor one a
    scalar), two ``size_t`` indices per output element, built at its first launch and held for as
    long as the graph lives: 16 bytes per element, four times a float32 output. On activations,
    once per operation in the forward and backward pass, that is what made SP-NGD's unit-wise
    BatchNorm capture grow with the batch and the image (issue 33). With both operands of one shape
    the kernel runs its own elementwise loop and keeps nothing; ``BroadcastTo``'s output is pool
    memory, freed when used, and its gradient is the same ``ReduceSum`` over the broadcast axes that
    the broadcasting op's gradient takes. The values, and their gradients, are the same."""
    return ops.broadcast_to(small, shape)


def normalized_input(x, eps):
    """``xhat`` of a training-mode BatchNorm: batch mean and biased variance over all axes but 1
    (every per-channel value spread to the input's shape first, :func:`spread`)."""
    x = ops.cast(x, ms.float32)
    axes = (0,) + tuple(range(2, x.ndim))
    centred = x - spread(x.mean(axes, keep_dims=True), x.shape)
    return centred * spread(ops.rsqrt((centred * centred).mean(axes, keep_dims=True) + eps), x.shape)


def unit_probe_last(gamma, batch, ndim):
    """As :func:`unit_probe` for a LayerNorm, whose units are the features of the last axis: a zero
    tensor (2, B, 1, ..., D) for an input of ``ndim`` axes (the per-example gradients sum over every
    position of the axes between)."""
    channels = gamma.shape[0]
    middle = (1,) * (ndim - 2)
    return ops.zeros((2, batch) + middle + (channels,), ms.float32) + 0.0 * ops.cast(gamma, ms.float32).reshape(
        (1, 1) + middle + (channels,))


def layer_normalized_input(x, eps):
    """``xhat`` of a LayerNorm over the last axis: each position's mean and biased variance over its
    features (as ``ops.LayerNorm`` with ``begin_norm_axis=-1``; spread as :func:`normalized_input`)."""
    x = ops.cast(x, ms.float32)
    centred = x - spread(x.mean(-1, keep_dims=True), x.shape)
    return centred * spread(ops.rsqrt((centred * centred).mean(-1, keep_dims=True) + eps), x.shape)


def unit_fisher(probe_grad, g_scale):
    """(C, 3) per-channel Fisher entries from the gradient of the mean loss w.r.t. the probe.

    ``probe_grad`` is (2, B, C, 1, ...) (a LayerNorm's: (2, B, 1, ..., C)): d L / d probe = (1/B)
    per-example gradients. ``g_scale`` is ``1 / loss_scale``.
    """
    batch = probe_grad.shape[1]
    grads = ops.cast(probe_grad, ms.float32).reshape(2, batch, -1) * (batch * g_scale)
    gamma, beta = grads[0], grads[1]
    return ops.stack(((gamma * gamma).mean(0), (gamma * beta).mean(0), (beta * beta).mean(0)), 1)


def unit_natural_gradient(fisher, grad_gamma, grad_beta, damping):
    """Closed-form ``(F_c + damping I)^-1 [g_gamma, g_beta]`` per channel; F as (C, 3) entries."""
    a = fisher[:, 0] + damping
    b = fisher[:, 1]
    c = fisher[:, 2] + damping
    det = a * c - b * b
    return (c * grad_gamma - b * grad_beta) / det, (a * grad_beta - b * grad_gamma) / det
