"""Step 3 of the engine, the refresh: the damped inverses the refresh rule says are due are recomputed
(a mixin of :class:`~mindspore_ngd.optim.engine.NGDOptimizer`).

Every owned layer that is due is re-inverted by its block, each in a run-time branch of its own
(with a per-layer rule, SP-NGD's, only the layers that are ready), and its new inverses are written
back in the main graph as soon as that branch returns (:meth:`Refresh._refreshed`). A layer keeps its
last good inverses when a check fails."""
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

    def _refreshed(self, factors, damping, layers, due):
        """Re-invert every owned layer that is due and ready (and selected by ``layers``), write each
        layer's inverses back at once, and return the inverse state as stored after the writes
        (:meth:`_stored_inverses`).

        Each owned layer's inversion is a run-time branch of its own (taken when ``due``; with a
        per-layer rule also only when that layer is ready), and its result is written to the layer's
        Parameters in the main graph before the next layer's branch starts. A branch's outputs stay
        live until the main graph consumes them, so writing each layer as soon as it is inverted holds
        one layer's new inverses at a time instead of every layer's (measured on eight 2048 x 2048
        inversions: 0.8 against 1.6 copies per layer at the peak). The writes stay in the main graph:
        MindSpore 2.10 disconnects a Parameter assigned inside a run-time branch from its host value.
        A layer that is not refreshed has its stored inverses written back unchanged, as before."""
        ready = LayerCounters.ready(factors[FactorState.COUNTS])
        if layers is not None:
            ready = ops.logical_and(ready, ops.stack(layers))
        ready, trusted = ops.unstack(ready), ops.unstack(self.counters.has_inverse)
        faults, taken, counts = self.inverse_faults, (), ()
        after = None
        stored_factors = factors[FactorState.LAYERS]
        for k in range(self.num_layers):
            block = self.blocks[k]
            take, inverted = ops.zeros((), ms.bool_), ops.zeros((), ms.int32)
            if block.owned:
                a_factor, g_factor = stored_factors[k]
                if after is not None:          # one layer's inversion at a time, after the last write
                    a_factor, g_factor = ops.depend(a_factor, after), ops.depend(g_factor, after)
                go = ops.logical_and(due, ready[k]) if self.refresh_rule.per_layer else due
                a_inv, g_inv = block.inverses()
                fault = ops.zeros((), ms.int32)
                if go:
                    a_inv, g_inv, take, fault = block.refreshed((a_factor, g_factor), ready[k], damping,
                                                                (a_inv, g_inv), trusted[k])
                inverted = ops.cast(go, ms.int32)
                faults = faults + fault
                after = block.write_inverses((a_inv, g_inv))
            taken += (take,)
            counts += (inverted,)
        has = ops.logical_or(self.counters.has_inverse, ops.stack(taken))
        faults = ops.depend(faults, after)
        self.counters.write_has_inverse(has)
        ops.assign(self.inverse_faults, faults)
        ops.assign_add(self.inverse_refreshes, ops.cast(due, ms.int32))
        if self.exchange.distributed:
            self.exchange.count_inversions(ops.stack(counts))
        return self._stored_inverses()

