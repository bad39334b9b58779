"""Kronecker factors as a ResNet-style convolution sees them, generated in NumPy at test time.

A small conv stack (3x3 convolutions, batch-statistics BatchNorm, ReLU) runs on scikit-learn's 8x8
digits, upsampled and lifted to three colour channels; the last 3x3 convolution, the layer whose
factors are returned, feeds a ReLU, a global average pool and a linear classifier with softmax
cross-entropy. ``A`` is the im2col covariance of that layer's (post-BatchNorm/ReLU) input and ``G``
the covariance of its per-example output gradients, both as :func:`numpy_kfac.conv_factors` defines
them (A summed over positions, G averaged over them). Nothing is stored: the factors of a
512-channel layer (A of size 4608) take a few seconds to build.
"""
import functools

import numpy as np

__all__ = ["conv_layer_factors"]


def _digits(batch, rng):
    from sklearn.datasets import load_digits
    images = load_digits().images[:batch] / 16.0                       # (B, 8, 8)
    images = np.repeat(np.repeat(images, 2, axis=1), 2, axis=2)        # 16x16, blocky like real pixels
    tint = rng.uniform(0.5, 1.5, size=(batch, 3, 1, 1))                # three colour channels
    x = images[:, None] * tint + 0.05 * rng.standard_normal((batch, 3, 16, 16))
    return (x - x.mean()) / x.std()


def _patches(x):
    """im2col of a 3x3, stride 1, 'same' convolution: (B * H * W, C * 9), patch order (c, i, j)."""
    b, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=2)  # (B, C, 9, H, W)
    return cols.reshape(b, c * 9, h * w).transpose(0, 2, 1).reshape(b * h * w, c * 9)


def _conv_bn_relu(x, cout, rng, pool):
    b, c, h, w = x.shape
    weight = rng.standard_normal((cout, c * 9)) * np.sqrt(2.0 / (c * 9))
    y = (_patches(x) @ weight.T).reshape(b, h, w, cout).transpose(0, 3, 1, 2)
    y = (y - y.mean(axis=(0, 2, 3), keepdims=True)) / np.sqrt(y.var(axis=(0, 2, 3), keepdims=True) + 1e-5)
    y = np.maximum(y, 0.0)
    if pool:
        y = y.reshape(b, cout, h // 2, 2, w // 2, 2).mean(axis=(3, 5))
    return y


@functools.lru_cache(maxsize=4)
def conv_layer_factors(channels, batch=64, seed=0):
    """``(A, G)`` in float64 of a 3x3 conv with ``channels`` inputs and outputs (A: ``9 channels``
    square, G: ``channels`` square) at the end of the stack 3 -> 16 -> 32 -> channels (16x16, 8x8,
    4x4 maps after pooling)."""
    rng = np.random.default_rng(seed)
    x = _digits(batch, rng)
    x = _conv_bn_relu(x, 16, rng, pool=False)
    x = _conv_bn_relu(x, 32, rng, pool=True)
    x = _conv_bn_relu(x, channels, rng, pool=True)                      # (B, channels, 4, 4)
    b, c, h, w = x.shape
    rows = _patches(x)                                                  # (B * 16, 9 c)
    weight = rng.standard_normal((channels, c * 9)) * np.sqrt(2.0 / (c * 9))
    y = rows @ weight.T                                                 # (B * 16, channels)
    head = rng.standard_normal((channels, 10)) / np.sqrt(channels)
    pooled = np.maximum(y, 0.0).reshape(b, h * w, channels).mean(axis=1)
    logits = pooled @ head
    labels = np.arange(b) % 10
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(b), labels] -= 1.0
    d_pooled = (p / b) @ head.T                                         # mean-loss gradients
    dy = np.repeat(d_pooled[:, None, :] / (h * w), h * w, axis=1).reshape(b * h * w, channels) * (y > 0)
    a = rows.T @ rows / b                                               # summed over positions, / B
    per_example = b * dy                                                # per-example output gradients
    g = per_example.T @ per_example / (b * h * w)
    return a, g
