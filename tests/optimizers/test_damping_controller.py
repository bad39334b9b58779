"""The damping controller on its own (issue 35): driven step by step from scalars, without a network or
an optimizer, against an independent NumPy replay of the rule as docs/algorithms.md states it
("Adaptive damping"):

with ``s_t = g_t' delta_t`` stored after step t and ``s'_t = g_{t+1}' delta_t`` seen at step t+1, a step
counts when its gradients are finite, ``s'_t`` is finite and ``s_t < 0``; then
``num <- 0.9 num + 0.1 (s_t + s'_t) / 2``, ``den <- 0.9 den + 0.1 s_t``, ``rho = num / den`` (when
``den < 0``), and the multiplier is multiplied by ``max(2 (1 - rho), 1.5)`` when ``rho < 1/4``, divided
by 1.2 when ``rho > 3/4``, and clipped to ``[1, max_boost]``. A non-finite step stores ``s = 0``.
When the multiplier moved by more than 2x since the inverses were computed, they are due again.

The replay is float64, the controller float32: values agree to ``RTOL`` (a few float32 roundings per
step, compounded over the steps), and no step of these sequences lies within that of a threshold.
"""
import numpy as np
import pytest

from mindspore import nn, Tensor

from mindspore_ngd.optim.damping import DampingController

RTOL = 1e-5
ATOL = 1e-9


class Replay:
    """The rule in float64, written from its documentation."""

    def __init__(self, num_params, max_boost, decay=0.9):
        self.max_boost, self.decay = max_boost, decay
        self.boost, self.num, self.den, self.slope = 1.0, 0.0, 0.0, 0.0
        self.rates = np.zeros(num_params)

    def step(self, slope_next, finite, slope, rates):
        usable = finite and self.slope < 0 and np.isfinite(slope_next)
        if usable:
            self.num = self.decay * self.num + (1 - self.decay) * (self.slope + slope_next) / 2
            self.den = self.decay * self.den + (1 - self.decay) * self.slope
            if self.den < 0:
                rho = self.num / self.den
                factor = max(2 * (1 - rho), 1.5) if rho < 0.25 else (1 / 1.2 if rho > 0.75 else 1.0)
                self.boost = min(max(self.boost * factor, 1.0), self.max_boost)
        self.slope = slope if finite else 0.0
        self.rates = np.asarray(rates, np.float64)
        return self.boost


def _sequence(seed, steps, regime):
    """(s'_t, finite, s_{t+1}, rates) per step. ``regime``: "overshoot" (s' > -s/2: rho < 1/4),
    "undershoot" (s' close to s: rho near 1), "mixed" (both, with non-finite steps and gradients)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        slope = -float(rng.uniform(0.5, 2.0))
        if regime == "overshoot":
            ratio = rng.uniform(0.2, 3.0)              # s'/|s|: rho = (1 - ratio) / 2 < 0.4
        elif regime == "undershoot":
            ratio = -rng.uniform(0.7, 1.0)             # rho = (1 + |ratio|) / 2 > 0.85
        else:
            ratio = rng.choice([rng.uniform(0.5, 3.0), -rng.uniform(0.8, 1.0)])
        finite = not (regime == "mixed" and t % 7 == 5)
        slope_next = ratio * 1.0
        if regime == "mixed" and t % 11 == 3:
            slope_next = np.inf if t % 2 else np.nan
        out.append((slope_next, finite, slope, rng.uniform(0.01, 0.5, 3)))
    return out


def _run(controller, replay, sequence):
    for t, (slope_next, finite, slope, rates) in enumerate(sequence):
        expected = replay.step(slope_next, finite, slope, rates)
        got = controller(Tensor(np.float32(slope_next)), Tensor(np.bool_(finite)), Tensor(np.float32(slope)),
                         Tensor(rates.astype(np.float32)))
        what = f"step {t}"
        np.testing.assert_allclose(float(got.asnumpy()), expected, rtol=RTOL, err_msg=what)
        np.testing.assert_allclose(float(controller.boost.asnumpy()), expected, rtol=RTOL, err_msg=what)
        np.testing.assert_allclose(float(controller.ratio_num.asnumpy()), replay.num, rtol=RTOL, atol=ATOL,
                                   err_msg=what)
        np.testing.assert_allclose(float(controller.ratio_den.asnumpy()), replay.den, rtol=RTOL, atol=ATOL,
                                   err_msg=what)
        np.testing.assert_allclose(float(controller.step_slope.asnumpy()), replay.slope, rtol=RTOL, atol=ATOL,
                                   err_msg=what)
        np.testing.assert_allclose(controller.step_lr.asnumpy(), replay.rates, rtol=RTOL, err_msg=what)


@pytest.mark.parametrize("regime, max_boost", [("overshoot", 1e4), ("overshoot", 30.0), ("undershoot", 1e4),
                                               ("mixed", 1e4)])
def test_the_controller_follows_the_numpy_replay_step_by_step(regime, max_boost):
    controller = DampingController("t", 3, max_boost=max_boost)
    replay = Replay(3, max_boost)
    _run(controller, replay, _sequence(7, 24, regime))
    boost = float(controller.boost.asnumpy())
    if regime == "overshoot":
        assert boost == pytest.approx(max_boost, rel=RTOL) if max_boost < 100 else boost > 100
    if regime == "undershoot":
        assert boost == 1.0                     # the floor: the user's damping


def test_a_raised_multiplier_comes_back_down_to_the_floor():
    controller = DampingController("t", 3)
    replay = Replay(3, 1e4)
    _run(controller, replay, _sequence(1, 6, "overshoot"))
    assert float(controller.boost.asnumpy()) > 10.0
    _run(controller, replay, _sequence(2, 120, "undershoot"))
    assert float(controller.boost.asnumpy()) == 1.0


class _Reinvert(nn.Cell):
    def __init__(self, controller):
        super().__init__(auto_prefix=False)
        self.controller = controller

    def construct(self, boost, due):
        redo, inverted = self.controller.reinvert(boost)
        self.controller.inverted_at(due, boost, inverted)
        return redo


def test_the_inverses_are_due_when_the_multiplier_moved_more_than_twice():
    controller = DampingController("t", 1)
    cell = _Reinvert(controller)
    for boost, due, redo, inverted in [(1.9, False, False, 1.0), (2.5, True, True, 2.5), (4.9, False, False, 2.5),
                                       (5.1, False, True, 2.5), (1.2, True, True, 1.2)]:
        got = cell(Tensor(np.float32(boost)), Tensor(np.bool_(due)))
        assert bool(got.asnumpy()) is redo, boost
        assert float(controller.boost_inverted.asnumpy()) == pytest.approx(inverted)


def test_parameter_names_are_the_optimizers():
    controller = DampingController("kfac", 4, moments_size=10)
    names = sorted(p.name for p in controller.get_parameters())
    assert names == ["kfac.damping.boost", "kfac.damping.boost_inverted", "kfac.damping.moments",
                     "kfac.damping.ratio_den", "kfac.damping.ratio_num", "kfac.damping.step_lr",
                     "kfac.damping.step_slope"]
    assert DampingController("kfac", 4).moments is None
