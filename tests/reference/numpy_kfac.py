"""An independent NumPy (float64) reference for K-FAC on small networks.

Nothing here imports mindspore_ngd: convolutions are explicit loops over output positions, gradients
are derived by hand, and factors are built from per-example quantities exactly as the numerical
contract in ARCHITECTURE.md states them.
"""
import numpy as np


# ----------------------------------------------------------------------------- convolution

def same_pads(size, kernel, stride, dilation):
    out = -(-size // stride)
    needed = max(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - size)
    return needed // 2, needed - needed // 2


def conv_geometry(x_shape, kernel, stride, dilation, pad_mode, padding):
    """Padding (top, bottom, left, right) and output size for an NCHW input."""
    _, _, h, w = x_shape
    if pad_mode == "same":
        top, bottom = same_pads(h, kernel[0], stride[0], dilation[0])
        left, right = same_pads(w, kernel[1], stride[1], dilation[1])
    elif pad_mode == "pad":
        top, bottom, left, right = padding
    else:
        top = bottom = left = right = 0
    eff_h = (kernel[0] - 1) * dilation[0] + 1
    eff_w = (kernel[1] - 1) * dilation[1] + 1
    out_h = (h + top + bottom - eff_h) // stride[0] + 1
    out_w = (w + left + right - eff_w) // stride[1] + 1
    return (top, bottom, left, right), (out_h, out_w)


def im2col(x, kernel, stride, dilation, pad_mode, padding):
    """Patches (N, T, C*kh*kw) by explicit loops; patch order (c, i, j) like the flattened weight."""
    (top, bottom, left, right), (out_h, out_w) = conv_geometry(x.shape, kernel, stride, dilation,
                                                               pad_mode, padding)
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c = x.shape[:2]
    patches = np.zeros((n, out_h * out_w, c * kernel[0] * kernel[1]))
    for oh in range(out_h):
        for ow in range(out_w):
            cols = []
            for ch in range(c):
                for i in range(kernel[0]):
                    for j in range(kernel[1]):
                        cols.append(xp[:, ch, oh * stride[0] + i * dilation[0], ow * stride[1] + j * dilation[1]])
            patches[:, oh * out_w + ow, :] = np.stack(cols, axis=1)
    return patches, (out_h, out_w)


def append_one(rows):
    return np.concatenate([rows, np.ones(rows.shape[:-1] + (1,))], axis=-1)


# ----------------------------------------------------------------------------- loss

def softmax_ce(logits, labels):
    """Mean softmax cross-entropy and its gradient w.r.t. the logits."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    b = logits.shape[0]
    loss = -np.log(p[np.arange(b), labels]).mean()
    d = p.copy()
    d[np.arange(b), labels] -= 1
    return loss, d / b


# ----------------------------------------------------------------------------- factors / inverse

def dense_factors(a, dy, has_bias, loss_scale=1.0):
    """A, G of a Dense layer from input rows a (B, in) and mean-loss output gradients dy (B, out)."""
    b = a.shape[0]
    abar = append_one(a) if has_bias else a
    g = b * dy / loss_scale                      # per-example output gradients
    big_a = sum(np.outer(abar[i], abar[i]) for i in range(b)) / b
    big_g = sum(np.outer(g[i], g[i]) for i in range(b)) / b
    return big_a, big_g


def conv_factors(patches, dy, has_bias, loss_scale=1.0):
    """A, G of a Conv2d from patches (B, T, D) and mean-loss output gradients dy (B, out, Ho, Wo)."""
    b, t, _ = patches.shape
    abar = append_one(patches) if has_bias else patches
    g = b * dy.reshape(b, dy.shape[1], t).transpose(0, 2, 1) / loss_scale  # (B, T, out)
    big_a = sum(np.outer(abar[i, k], abar[i, k]) for i in range(b) for k in range(t)) / b
    big_g = sum(np.outer(g[i, k], g[i, k]) for i in range(b) for k in range(t)) / (b * t)
    return big_a, big_g


def damping_shifts(big_a, big_g, damping, split):
    root = np.sqrt(damping)
    if split == "sqrt":
        return root, root
    pi = np.sqrt((np.trace(big_a) / big_a.shape[0]) / (np.trace(big_g) / big_g.shape[0]))
    return pi * root, root / pi


def damped_inv(m, shift, jitter):
    return np.linalg.inv(m + (shift + jitter * np.trace(m)) * np.eye(m.shape[0]))


def preconditioned(big_a, big_g, grad_matrix, damping, split="pi", jitter=0.0):
    """G_d^-1 dW A_d^-1 for a gradient matrix (out, in[+1])."""
    sa, sg = damping_shifts(big_a, big_g, damping, split)
    return damped_inv(big_g, sg, jitter) @ grad_matrix @ damped_inv(big_a, sa, jitter)


def rel_err(actual, expected):
    """Norm-wise relative error max|actual - expected| / max|expected|."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30)
