"""Kronecker factors against the exact Fisher on the seed article's 3-4-2 network: block structure,
G (x) A equals the exact Fisher block for one example, and the damped step inverts the damped product."""
import numpy as np

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from nets import SeedNet, set_weights
from reference import numpy_kfac as ref
from training import one_step_update

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
TOL = 1e-5


def single_example(seed=0):
    rng = np.random.default_rng(seed)
    net = SeedNet()
    set_weights(net, rng, scale=0.8)
    x = rng.standard_normal((1, 3)).astype(np.float32)
    y = np.array([1], np.int32)
    return net, x, y


def exact_gradient(net, x, y):
    """Gradient of the loss w.r.t. all 20 weights by MindSpore autograd, flattened row-major."""
    grad_fn = ms.grad(nn.WithLossCell(net, CE), grad_position=None, weights=net.trainable_params())
    grads = grad_fn(Tensor(x), Tensor(y))
    return [g.asnumpy().astype(np.float64) for g in grads]


def test_block_structure_of_the_seed_network():
    net, x, y = single_example()
    factors = ngd.kronecker_factors(net, CE, Tensor(x), Tensor(y))
    # 12 + 8 = 20 weights: a 20x20 Fisher -> 12x12 and 8x8 blocks -> 3x3 (x) 4x4 and 4x4 (x) 2x2
    assert factors["fc1"][0].shape == (3, 3) and factors["fc1"][1].shape == (4, 4)
    assert factors["fc2"][0].shape == (4, 4) and factors["fc2"][1].shape == (2, 2)
    blocks = [np.kron(g, a).shape for a, g in (factors["fc1"], factors["fc2"])]
    assert blocks == [(12, 12), (8, 8)]
    assert sum(b[0] for b in blocks) == 20


def test_kronecker_product_is_the_exact_fisher_block_for_one_example():
    net, x, y = single_example()
    factors = ngd.kronecker_factors(net, CE, Tensor(x), Tensor(y))
    grads = exact_gradient(net, x, y)
    full = np.concatenate([g.reshape(-1) for g in grads])
    fisher = np.outer(full, full)                                   # exact empirical Fisher, B = 1
    offsets = {"fc1": (0, 12), "fc2": (12, 20)}
    for name, (start, stop) in offsets.items():
        a, g = factors[name]
        # W is (out, in) flattened row-major, so vec(dW) = g (x) a and the block is G (x) A
        assert ref.rel_err(np.kron(g, a), fisher[start:stop, start:stop]) < TOL, name


def test_damped_step_is_the_inverse_of_the_damped_kronecker_product():
    net, x, y = single_example(1)
    damping = 1e-2
    factors = ngd.kronecker_factors(net, CE, Tensor(x), Tensor(y))
    grads = exact_gradient(net, x, y)
    delta = one_step_update(net, x, y, "sqrt", damping=damping, jitter=0.0)
    gamma = np.sqrt(damping)
    for (name, (a, g)), grad in zip(factors.items(), grads):
        a, g = a.astype(np.float64), g.astype(np.float64)
        kron_damped = np.kron(g + gamma * np.eye(len(g)), a + gamma * np.eye(len(a)))
        expected = np.linalg.solve(kron_damped, grad.reshape(-1))
        step = -delta[f"{name}.weight"].reshape(-1)
        assert ref.rel_err(step, expected) < TOL, name
        # one example: A = a a^T and G = g g^T are rank one and the gradient lies in their range, so
        # the step is grad / ((|a|^2 + gamma)(|g|^2 + gamma)); the exact damped Fisher gives
        # grad / (|a|^2 |g|^2 + damping). The two coincide up to O(gamma (|a|^2 + |g|^2)).
        na, ng = np.trace(a), np.trace(g)
        assert ref.rel_err(step, grad.reshape(-1) / ((na + gamma) * (ng + gamma))) < TOL
        exact_fisher_step = grad.reshape(-1) / (na * ng + damping)
        bound = gamma * (na + ng) / (na * ng) + 2 * damping / (na * ng)
        assert ref.rel_err(step, exact_fisher_step) <= bound
