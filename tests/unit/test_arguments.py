"""Bad arguments fail early, in the constructor before any graph is compiled, with messages that name
the argument and what it accepts: the shared K-FAC arguments and networks, SP-NGD's, THOR's, and
the distributed ones of all three."""
import numpy as np
import pytest

from mindspore import nn, Tensor

import mindspore_ngd as ngd
from nets import DenseNet


# ------------------------------------------------------------------ shared (K-FAC) arguments and networks
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(learning_rate=-1e-3), ValueError, r"learning_rate must be a finite number >= 0, got -0.001"),
    (dict(learning_rate=float("inf")), ValueError, r"learning_rate must be a finite number >= 0"),
    (dict(learning_rate=[0.1, -0.1]), ValueError,
     r"every value of learning_rate must be a finite number >= 0, got -0.1 at step 1"),
    (dict(learning_rate=np.array([0.0, np.nan])), ValueError, r"every value of learning_rate must be a finite"),
    (dict(learning_rate=[]), ValueError, r"learning_rate as a sequence must be a non-empty 1-D"),
    (dict(learning_rate=[[0.1, 0.2]]), ValueError, r"learning_rate as a sequence must be a non-empty 1-D"),
    (dict(learning_rate="0.1"), TypeError, r"learning_rate must be a float >= 0, a per-step list"),
    (dict(learning_rate=True), TypeError, r"learning_rate must be a float >= 0"),
    (dict(learning_rate=None), TypeError, r"learning_rate must be a float >= 0"),
    (dict(damping=0.0), ValueError, r"damping must be a finite number > 0"),
    (dict(damping=float("nan")), ValueError, r"damping must be a finite number > 0"),
    (dict(factor_decay=1.0), ValueError, r"factor_decay must be in \[0.0, 1.0\), got 1.0"),
    (dict(factor_decay=-0.1), ValueError, r"factor_decay must be in \[0.0, 1.0\)"),
    (dict(factor_update_interval=0), ValueError, r"factor_update_interval must be an int >= 1, got 0"),
    (dict(inverse_update_interval=2.5), TypeError, r"inverse_update_interval must be an int >= 1"),
    (dict(damping_split="trace"), ValueError, r"damping_split must be one of \['pi', 'positions', 'sqrt'\], got 'trace'"),
    (dict(inverse_method="svd"), ValueError, r"inverse_method must be one of \['auto', 'cholesky', 'eigh', 'lu', 'newton', 'newton_split'\], got 'svd'"),
    (dict(momentum=1.5), ValueError, r"momentum must be in \[0.0, 1.0\]"),
    (dict(weight_decay=-1.0), ValueError, r"weight_decay must be a finite number >= 0"),
    (dict(kl_clip=0.0), ValueError, r"kl_clip must be a finite number > 0"),
    (dict(loss_scale=0.0), ValueError, r"loss_scale must be a finite number > 0"),
    (dict(skip_layers=["nope"]), ValueError, r"skip_layers names no Dense/Conv2d/Embedding cell of the network: \['nope'\]"),
])
def test_bad_arguments_raise_before_compilation(kwargs, error, match):
    args = dict(learning_rate=0.1)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ngd.KFAC(DenseNet(), verbose=False, **args)


def test_bad_networks():
    with pytest.raises(TypeError, match="network must be a mindspore.nn.Cell"):
        ngd.KFAC("net", learning_rate=0.1)

    class NoLayers(nn.Cell):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def construct(self, x):
            return self.bn(x)

    with pytest.raises(ValueError, match="no nn.Dense or nn.Conv2d layer that can be preconditioned"):
        ngd.KFAC(NoLayers(), learning_rate=0.1)
    frozen = DenseNet()
    for p in frozen.get_parameters():
        p.requires_grad = False
    with pytest.raises(ValueError, match="network has no trainable parameters"):
        ngd.KFAC(frozen, learning_rate=0.1)


# ------------------------------------------------------------------ SP-NGD
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(refresh_threshold=0.0), ValueError, "refresh_threshold"),
    (dict(max_interval=0), ValueError, "max_interval"),
    (dict(stale="yes"), TypeError, "stale"),
    (dict(batchnorm_damping=-1.0), ValueError, "batchnorm_damping"),
    (dict(fisher="true"), ValueError, "fisher"),
    (dict(weight_decay=-1.0), ValueError, "weight_decay"),
    (dict(damping=0.0), ValueError, "damping"),
])
def test_bad_spngd_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        ngd.SPNGD(DenseNet(), **{"learning_rate": 0.1, **kwargs})


# ------------------------------------------------------------------ THOR
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(frequency=0), ValueError, r"frequency must be an int >= 1, got 0"),
    (dict(split_dim=0), ValueError, r"split_dim must be an int >= 1, got 0"),
    (dict(trace_threshold=-0.1), ValueError, r"trace_threshold must be a finite number > 0"),
    (dict(frequency_growth=0.5), ValueError, r"frequency_growth must be in \[1.0, inf"),
    (dict(frequency=10, max_frequency=5), ValueError, r"max_frequency must be >= frequency \(10\), got 5"),
    (dict(inverse_method="svd"), ValueError, r"inverse_method must be one of"),
    (dict(damping=Tensor(np.array([0.1, 0.0], np.float32))), ValueError, r"every value of damping"),
    (dict(enable_clip_grad=1), TypeError, r"enable_clip_grad must be a bool"),
])
def test_bad_thor_arguments(kwargs, error, match):
    args = dict(learning_rate=0.1, damping=0.03)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ngd.THOR(DenseNet(), verbose=False, **args)


# ------------------------------------------------------------------ distributed
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(distributed="yes"), ValueError, r"distributed must be 'auto', True or False, got 'yes'"),
    (dict(grad_worker_fraction=0), ValueError, r"grad_worker_fraction must be None or a number in \(0, 1\]"),
    (dict(grad_worker_fraction="half"), TypeError, r"grad_worker_fraction must be None or a number"),
    (dict(balance="speed"), ValueError, r"balance must be one of \['compute', 'memory'\], got 'speed'"),
])
def test_distributed_arguments_are_validated(kwargs, error, match):
    for cls in (ngd.KFAC, ngd.SPNGD):
        with pytest.raises(error, match=match):
            cls(DenseNet(), learning_rate=0.1, verbose=False, **kwargs)
    with pytest.raises(error, match=match):
        ngd.THOR(DenseNet(), 0.1, 1e-2, verbose=False, **kwargs)


# ------------------------------------------------------------------ inverse_method="auto"
def test_auto_inverse_method_resolves_per_device_and_names_stay_explicit():
    from mindspore_ngd.curvature.inverse import DEVICE_INVERSE_METHODS, INVERSE_METHODS, resolve_inverse_method
    assert DEVICE_INVERSE_METHODS == {"CPU": "cholesky", "GPU": "lu", "Ascend": "newton_split"}
    for device, method in DEVICE_INVERSE_METHODS.items():
        assert resolve_inverse_method("auto", device) == method
        assert ngd.Policy().resolved(device).inverse_method == method
    for method in INVERSE_METHODS:
        if method == "newton":      # plain products may round the factor to float16 there: said, not refused
            with pytest.warns(UserWarning, match="newton_split"):
                assert resolve_inverse_method(method, "Ascend") == method
        else:
            assert resolve_inverse_method(method, "Ascend") == method
    with pytest.raises(ValueError, match=r"inverse_method='auto' has no path for device_target 'TPU'"):
        resolve_inverse_method("auto", "TPU")
    assert ngd.Policy().inverse_method == "auto"
    # constructed on this CPU: resolved, exposed, and the policy holds the path actually built
    for cls, kwargs in ((ngd.KFAC, {}), (ngd.SPNGD, {}), (ngd.THOR, {"damping": 0.03})):
        opt = cls(DenseNet(), learning_rate=0.1, verbose=False, **kwargs)
        assert opt.inverse_method == opt.policy.inverse_method == "cholesky"
        assert all(block.inverse_method == "cholesky" for block in opt.blocks)
    opt = ngd.KFAC(DenseNet(), learning_rate=0.1, inverse_method="newton", verbose=False)
    assert opt.inverse_method == "newton" and opt.blocks[0].inverse_method == "newton"


# ------------------------------------------------------------------ nn.Momentum's call forms
@pytest.mark.parametrize("cls", [ngd.KFAC, ngd.SPNGD, ngd.NGDOptimizer])
def test_positional_arguments_mean_what_they_mean_in_nn_momentum(cls):
    # nn.Momentum(params, learning_rate, momentum, weight_decay, loss_scale, use_nesterov)
    opt = cls(DenseNet(), 0.1, 0.5, 1e-4, 2.0, True, verbose=False)
    assert float(opt.momentum.asnumpy()) == 0.5
    assert opt.decayed_parameters() == ["fc1.weight", "fc2.weight"]
    assert {float(v.asnumpy()) for v in opt.weight_decay_values} == {0.0, float(np.float32(1e-4))}
    assert float(opt.loss_scale) == 2.0
    assert opt.apply_momentum.use_nesterov is True
    # the natural-gradient arguments are keyword-only: a seventh positional argument is refused
    with pytest.raises(TypeError, match="positional argument"):
        cls(DenseNet(), 0.1, 0.9, 0.0, 1.0, False, 1e-2, verbose=False)


@pytest.mark.parametrize("cls", [ngd.KFAC, ngd.SPNGD, ngd.THOR])
def test_use_nesterov_is_accepted_by_every_optimizer(cls):
    extra = {"damping": 1e-2} if cls is ngd.THOR else {}
    assert cls(DenseNet(), 0.1, use_nesterov=True, verbose=False, **extra).apply_momentum.use_nesterov is True
    assert cls(DenseNet(), 0.1, verbose=False, **extra).apply_momentum.use_nesterov is False


@pytest.mark.parametrize("cls", [ngd.KFAC, ngd.SPNGD])
def test_the_former_nesterov_spelling_still_works_with_a_deprecation_warning(cls):
    with pytest.warns(DeprecationWarning, match="use_nesterov"):
        assert cls(DenseNet(), 0.1, nesterov=True, verbose=False).apply_momentum.use_nesterov is True
    with pytest.raises(ValueError, match="contradict"):
        cls(DenseNet(), 0.1, use_nesterov=True, nesterov=False, verbose=False)
    with pytest.raises(TypeError, match="use_nesterov must be a bool"):
        cls(DenseNet(), 0.1, use_nesterov="yes", verbose=False)


@pytest.mark.parametrize("cls", [ngd.KFAC, ngd.SPNGD, ngd.THOR])
@pytest.mark.parametrize("params", [lambda net: net.trainable_params(), lambda net: net.get_parameters(),
                                    lambda net: tuple(net.trainable_params())], ids=["list", "generator", "tuple"])
def test_a_parameter_list_in_place_of_the_network_shows_the_fix(cls, params):
    name = cls.__name__
    with pytest.raises(TypeError, match=rf"{name} takes the network itself, not its parameters: write "
                                        rf"{name}\(net, \.\.\.\) instead of {name}\(net\.trainable_params\(\), \.\.\.\)"):
        cls(params(DenseNet()), 0.1, damping=1e-2)
