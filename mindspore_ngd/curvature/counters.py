"""The per-layer counts and flags of all curvature blocks, one vector Parameter per family.

Every Kronecker block needs four scalars: how many batches its A and its G have taken, whether it
has a real (accepted) inverse yet, and whether it was demoted to the plain update because it
captured nothing. Every unit-wise BatchNorm block needs one: how many batches its Fisher has taken.
They are stored stacked, in layer order (``NGDOptimizer.layer_specs`` / ``norm_specs``)::

    {prefix}.A_updates    int32 (layers,)     {prefix}.has_inverse  bool (layers,)
    {prefix}.G_updates    int32 (layers,)     {prefix}.demoted      bool (layers,)
    {prefix}.F_updates    int32 (BatchNorm layers,)    -- only with unit-wise BatchNorm

The engine writes its state in the main graph, every step (MindSpore 2.10 disconnects a Parameter
assigned inside a run-time branch from its host value). One Parameter per layer and scalar cost an
``Assign`` and a ``TensorMove`` copy per layer per step even when nothing changed; stacked, a step
writes each family once (profile in ``docs/performance.md``).

Checkpoints written before the counts were stacked hold one scalar per layer
(``{prefix}.{layer}.A_updates`` ...); :meth:`LayerCounters.upgrade` converts them.
"""
import numpy as np

from mindspore import nn, ops, Parameter, Tensor

from .state import LayerCounts

__all__ = ["LayerCounters"]

# (family: the Parameter's name suffix, also the per-layer key suffix of the checkpoints written
# before stacking; attribute; NumPy dtype)
_LAYER_FAMILIES = (("A_updates", "a_updates", np.int32), ("G_updates", "g_updates", np.int32),
                   ("has_inverse", "has_inverse", np.bool_), ("demoted", "demoted", np.bool_))
_NORM_FAMILIES = (("F_updates", "f_updates", np.int32),)


class LayerCounters(nn.Cell):
    """Stacked per-layer counts and flags (see the module docstring).

    Args:
        prefix (str): the optimizer's Parameter prefix.
        layers (sequence of str): names of the preconditioned layers, in layer order.
        norms (sequence of str): names of the unit-wise BatchNorm layers, in order (may be empty).
    """

    def __init__(self, prefix, layers, norms=()):
        super().__init__(auto_prefix=False)
        self.prefix = prefix
        self.layers, self.norms = tuple(layers), tuple(norms)
        if not self.layers:
            raise ValueError("LayerCounters needs at least one layer")

        self.f_updates = None                    # no BatchNorm family without unit-wise BatchNorm layers
        for names, families in ((self.layers, _LAYER_FAMILIES), (self.norms, _NORM_FAMILIES)):
            for family, attr, dtype in families if names else ():
                setattr(self, attr, Parameter(Tensor(np.zeros(len(names), dtype)), name=f"{prefix}.{family}",
                                              requires_grad=False))

    # ------------------------------------------------------------------ graph side
    def factor_counts(self):
        """(A update counts, G update counts, demoted flags) as stored, each a (layers,) vector (positions
        named by :class:`~mindspore_ngd.curvature.state.LayerCounts`)."""
        return self.a_updates, self.g_updates, self.demoted

    def write_factor_counts(self, counts):
        ops.assign(self.a_updates, counts[LayerCounts.A_UPDATES])
        ops.assign(self.g_updates, counts[LayerCounts.G_UPDATES])
        ops.assign(self.demoted, counts[LayerCounts.DEMOTED])

    def write_norm_counts(self, counts):
        ops.assign(self.f_updates, counts)

    def write_has_inverse(self, flags):
        ops.assign(self.has_inverse, flags)

    @staticmethod
    def ready(counts):
        """Per layer: both factors have taken at least one batch (a bool (layers,) vector)."""
        return ops.logical_and(counts[LayerCounts.A_UPDATES] > 0, counts[LayerCounts.G_UPDATES] > 0)

    # ------------------------------------------------------------------ host side
    def per_layer(self):
        """``{layer: {"A_updates": int, "G_updates": int, "has_inverse": bool, "demoted": bool}}`` as
        Python values (``asnumpy`` copies; never called in a graph)."""
        values = {family: getattr(self, attr).asnumpy().copy() for family, attr, _ in _LAYER_FAMILIES}
        return {name: {family: values[family][k].item() for family in values} for k, name in enumerate(self.layers)}

    def upgrade(self, param_dict):
        """A copy of ``param_dict`` (as ``mindspore.load_checkpoint`` returns it) in which the per-layer
        scalars of a checkpoint written before the counts were stacked (``{prefix}.{layer}.A_updates``,
        ``.G_updates``, ``.has_inverse``, ``.demoted``, ``.F_updates``) are replaced by the stacked
        vectors. A dict that already has the stacked keys, or has none of the old ones, is returned
        unchanged (as a copy).

        Raises ValueError when a checkpoint has the old keys of only some layers of a family (it was
        written by an optimizer over other layers). ``demoted`` did not exist in the oldest checkpoints;
        a family missing for every layer is left out, so the optimizer keeps its current value.
        """
        out = dict(param_dict)
        for names, families in ((self.layers, _LAYER_FAMILIES), (self.norms, _NORM_FAMILIES)):
            for family, _, dtype in families:
                keys = [f"{self.prefix}.{name}.{family}" for name in names]
                present = [key in out for key in keys]
                if not any(present) or f"{self.prefix}.{family}" in out:
                    continue
                if not all(present):
                    missing = [key for key, found in zip(keys, present) if not found]
                    raise ValueError(f"checkpoint has per-layer '{family}' entries for some layers but not for "
                                     f"{missing}: it was written by an optimizer over other layers")
                values = np.array([np.asarray(out.pop(key).asnumpy()).reshape(()) for key in keys], dtype)
                name = f"{self.prefix}.{family}"
                out[name] = Parameter(Tensor(values), name=name, requires_grad=False)
        return out

