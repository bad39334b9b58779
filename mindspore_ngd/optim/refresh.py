"""Step 3 of the engine, the refresh: the damped inverses the refresh rule says are due are recomputed
(a mixin of :class:`~mindspore_ngd.optim.engine.NGDOptimizer`).

Every owned layer that is due is re-inverted by its block; with a per-layer rule (SP-NGD) each due
layer in a run-time branch of its own, otherwise all under the caller's one branch. A layer keeps its
last good inverses when a check fails. The new inverses are written back in the main graph by
:meth:`Refresh._store_inverses`."""
import mindspore as ms
from mindspore import ops

from ..curvature.counters import LayerCounters

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
        """(per layer (A inverse, G inverse), has-inverse flags (layers,), inverse fault count[, per-layer
        inversion counts of this step when distributed])."""
        layers = ()
        for block in self.blocks:
            layers += (block.inverses(),)
        if self.exchange.distributed:
            return layers, self.counters.has_inverse, self.inverse_faults, ops.zeros((self.num_layers,), ms.int32)
        return layers, self.counters.has_inverse, self.inverse_faults

    def _inverted(self, state, factors, damping, layers):
        """New inverse state: every owned layer that is ready (and selected by ``layers``) re-inverted.

        With a per-layer rule each layer's inversion is its own run-time branch, so a step that
        refreshed one layer inverts only that layer; the caller runs this under one outer branch,
        taken when any layer is due, so that a step which refreshed nothing dispatches one branch
        instead of one per layer. Otherwise the caller runs this under one branch for all layers."""
        ready = LayerCounters.ready(factors[1])
        if layers is not None:
            ready = ops.logical_and(ready, ops.stack(layers))
        ready, trusted = ops.unstack(ready), ops.unstack(state[1])
        faults, new, taken, counts = state[2], (), (), ()
        after = None
        for k in range(self.num_layers):
            block = self.blocks[k]
            a_inv, g_inv = state[0][k]
            take, inverted = ops.zeros((), ms.bool_), ops.zeros((), ms.int32)
            layer_factors = factors[0][k]
            if after is not None:
                layer_factors = (ops.depend(layer_factors[0], after), ops.depend(layer_factors[1], after))
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
        has = ops.logical_or(state[1], ops.stack(taken))
        if self.exchange.distributed:
            return new, has, faults, ops.stack(counts)
        return new, has, faults

    def _store_inverses(self, state, due):
        for k in range(self.num_layers):
            self.blocks[k].write_inverses(state[0][k])
        self.counters.write_has_inverse(state[1])
        ops.assign(self.inverse_faults, state[2])
        ops.assign_add(self.inverse_refreshes, ops.cast(due, ms.int32))
        if self.exchange.distributed:
            self.exchange.count_inversions(state[3])
