"""Step 3 of the engine, the refresh: the damped inverses the refresh rule says are due are recomputed
(a mixin of :class:`~mindspore_ngd.optim.engine.NGDOptimizer`).

Every owned layer that is due is re-inverted by its block; with a per-layer rule (SP-NGD) each due
layer in a run-time branch of its own, otherwise all under the caller's one branch. A layer keeps its
last good inverses when a check fails. The new inverses are written back in the main graph by
:meth:`Refresh._store_inverses`."""
import mindspore as ms
from mindspore import ops

from ..curvature.counters import LayerCounters
from ..curvature.state import FactorState, InverseState, inverse_state

__all__ = ["Refresh"]


class Refresh:
    """Graph-mode refresh of :class:`~mindspore_ngd.optim.engine.NGDOptimizer` (see the module docstring)."""

    @staticmethod
    def _all_layers(layers, every):
        out = ()
        for flag in layers:
            out += (ops.logical_or(flag, every),)
        return out

    def _stored_inverses(self):
        """The inverse state as stored (:class:`~mindspore_ngd.curvature.state.InverseState`): per layer
        (A inverse, G inverse), the has-inverse flags, the inverse fault count[, when distributed, the
        per-layer inversion counts of this step, zero]."""
        layers = ()
        for block in self.blocks:
            layers += (block.inverses(),)
        inversions = ops.zeros((self.num_layers,), ms.int32) if self.exchange.distributed else None
        return inverse_state(layers, self.counters.has_inverse, self.inverse_faults, inversions)

    def _inverted(self, state, factors, damping, layers):
        """New inverse state: every owned layer that is ready (and selected by ``layers``) re-inverted.

        With a per-layer rule each layer's inversion is its own run-time branch, so a step that
        refreshed one layer inverts only that layer; the caller runs this under one outer branch,
        taken when any layer is due, so that a step which refreshed nothing dispatches one branch
        instead of one per layer. Otherwise the caller runs this under one branch for all layers."""
        ready = LayerCounters.ready(factors[FactorState.COUNTS])
        if layers is not None:
            ready = ops.logical_and(ready, ops.stack(layers))
        ready, trusted = ops.unstack(ready), ops.unstack(state[InverseState.HAS_INVERSE])
        faults, new, taken, counts = state[InverseState.FAULTS], (), (), ()
        stored, stored_factors = state[InverseState.LAYERS], factors[FactorState.LAYERS]
        after = None
        for k in range(self.num_layers):
            block = self.blocks[k]
            a_inv, g_inv = stored[k]
            take, inverted = ops.zeros((), ms.bool_), ops.zeros((), ms.int32)
            layer_factors = stored_factors[k]
            if after is not None:
                a_factor, g_factor = layer_factors
                layer_factors = (ops.depend(a_factor, after), ops.depend(g_factor, after))
            if block.owned:
                if self.refresh_rule.per_layer:
                    fault = ops.zeros((), ms.int32)
                    if ready[k]:
                        a_inv, g_inv, take, fault = block.refreshed(layer_factors, ready[k], damping, (a_inv, g_inv),
                                                                    trusted[k])
                    inverted = ops.cast(ready[k], ms.int32)
                else:
                    a_inv, g_inv, take, fault = block.refreshed(layer_factors, ready[k], damping, (a_inv, g_inv),
                                                                trusted[k])
                    inverted = ops.ones((), ms.int32)
                faults = faults + fault
                after = g_inv
            new += ((a_inv, g_inv),)
            taken += (take,)
            counts += (inverted,)
        has = ops.logical_or(state[InverseState.HAS_INVERSE], ops.stack(taken))
        return inverse_state(new, has, faults, ops.stack(counts) if self.exchange.distributed else None)

    def _store_inverses(self, state, due):
        layers = state[InverseState.LAYERS]
        for k in range(self.num_layers):
            self.blocks[k].write_inverses(layers[k])
        self.counters.write_has_inverse(state[InverseState.HAS_INVERSE])
        ops.assign(self.inverse_faults, state[InverseState.FAULTS])
        ops.assign_add(self.inverse_refreshes, ops.cast(due, ms.int32))
        if self.exchange.distributed:
            self.exchange.count_inversions(state[InverseState.INVERSIONS])
