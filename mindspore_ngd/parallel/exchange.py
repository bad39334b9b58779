"""The collectives of one training step, in the one order every rank issues them.

The optimizer calls an exchange at four points of its step; on a single device
(:class:`LocalExchange`) each call hands its input back, distributed (:class:`DistributedExchange`)
each is one collective. In step order:

1. :meth:`reduce_statistics` (steps that capture): every rank's batch A and G of every layer, packed
   as upper triangles (an embedding's diagonal A as its entries), summed over the ranks (ReduceScatter
   to the owners, or an AllReduce on CPU), plus the small BatchNorm Fishers that every rank folds;
   divided by the world size (per-rank means over equal local batches give the global mean). Ordered
   after the gradients by its input token.
2. :meth:`agree` (steps that capture): the owners' fold outcome (taken, rejected, relative change)
   summed over the ranks, so that update counts and refresh decisions are identical everywhere; it
   waits for 1 (a rank owning nothing would otherwise issue it first: size mismatch).
3. :meth:`gather` (every step): the owners' preconditioned gradients, so that every rank has every
   layer (AllGather, owner-group AllGather, or an owner-group AllReduce on CPU); it waits for the
   fault count produced by 2.
4. :meth:`share_traces` (THOR's trace rule, on probe steps, after the update): batch traces and the
   owners' factor traces summed, so that every rank recaptures the same statistics.

The ranks' graphs differ (each holds its own layers), so this order is forced by data dependencies,
not left to the scheduler; a rank entering a branch with a collective that another rank skips would
deadlock, which is why every branch condition around a collective is itself agreed.
"""
import numpy as np

from mindspore import nn, ops, Parameter, Tensor

__all__ = ["LocalExchange", "DistributedExchange"]


class LocalExchange(nn.Cell):
    """Single device: every layer is owned here and nothing is communicated."""
    distributed = False
    world_size = 1
    grad_workers = 1

    def __init__(self):
        super().__init__(auto_prefix=False)

    def reduce_statistics(self, a_batches, g_batches, f_batches, token, extra=None):
        return a_batches, g_batches, f_batches, token, extra

    def agree(self, outcomes, token):
        return outcomes

    def gather(self, owned_matrices, token):
        return owned_matrices

    def share_traces(self, vector):
        return vector


class DistributedExchange(nn.Cell):
    """The collectives of :class:`mindspore_ngd.parallel.comm.ParallelOps` in step order, and the
    distributed records (``{prefix}.parallel.*``) that :func:`mindspore_ngd.parallel.check_checkpoint`
    compares before a resume.

    Args:
        comm (Communicator): world, rank, ownership plan and collectives.
        prefix (str): the optimizer's Parameter prefix.
        norm_channels (tuple[int]): channels of every unit-wise BatchNorm layer (their Fishers are
            summed whole and folded by every rank).
        extra_size (int): length of one more small vector every rank needs averaged with the
            statistics (the loss-scale probe, :mod:`mindspore_ngd.capture.loss_scale`); 0 for none.
    """
    distributed = True

    def __init__(self, comm, prefix, norm_channels, extra_size=0):
        super().__init__(auto_prefix=False)
        plan = comm.plan
        self.owned = comm.owned
        self.norm_channels = tuple(norm_channels)
        self.extra_size = int(extra_size)
        self.ops = comm.ops(replicated=sum(3 * c for c in self.norm_channels) + self.extra_size)
        self.world_size = comm.world_size
        self.grad_workers = plan.grad_workers
        self.gathers = comm.gather_collective is not None

        def record(value, name):
            return Parameter(Tensor(np.asarray(value, np.int32)), name=f"{prefix}.parallel.{name}",
                             requires_grad=False)

        self.parallel_world_size = record(plan.world_size, "world_size")
        self.parallel_grad_workers = record(plan.grad_workers, "grad_workers")
        self.parallel_position = record(comm.position, "position")
        self.parallel_owner_positions = record(plan.positions, "owner_positions")
        # how many times this rank computed each layer's inverses (0 for the layers it does not own)
        self.inversions = record(np.zeros(len(self.owned)), "inversions")

    def reduce_statistics(self, a_batches, g_batches, f_batches, token, extra=None):
        """Collective 1: (A batches, G batches, F batches, token for 2, extra), each the mean over all
        ranks for the layers this rank owns (the others keep the local buffers, which nobody folds);
        ``extra`` (a vector of ``extra_size``, or None) rides along with the Fishers."""
        par = self.ops
        flat = par.pack_factors(a_batches, g_batches)
        scale = 1.0 / self.world_size
        norms = ()
        if self.norm_channels or self.extra_size:
            pieces = ()
            for f_batch in f_batches:
                pieces += (f_batch.reshape(-1),)
            if self.extra_size:
                pieces += (extra.reshape(-1),)
            chunk, replicated = par.reduce_factors(flat, ops.concat(pieces))
            replicated = replicated * scale
            start = 0
            for channels in self.norm_channels:
                norms += (replicated[start:start + 3 * channels].reshape(channels, 3),)
                start += 3 * channels
            if self.extra_size:
                extra = replicated[start:start + self.extra_size]
        else:
            chunk = par.reduce_factors(flat, None)
        chunk = chunk * scale
        a_out, g_out = (), ()
        for k in range(len(self.owned)):
            a_out += (par.unpack_factor(chunk, k, 0) if self.owned[k] else a_batches[k],)
            g_out += (par.unpack_factor(chunk, k, 1) if self.owned[k] else g_batches[k],)
        return a_out, g_out, norms, chunk, extra

    def agree(self, outcomes, token):
        """Collective 2: the per-layer fold outcomes (taken A/G, rejected A/G[, changes A/G]; a
        :class:`~mindspore_ngd.curvature.state.FoldOutcome` each) summed over the ranks field by field;
        every statistic has ``grad_workers`` owners computing the same values, and the others contribute
        zeros. Returned in the same per-layer form."""
        fields = len(outcomes[0])
        flat = ()
        for outcome in outcomes:
            flat += outcome
        shared = self.ops.share(ops.depend(ops.stack(flat), token)) / self.grad_workers
        agreed = ()
        for k in range(len(outcomes)):
            values = ()
            for i in range(fields):
                values += (shared[k * fields + i],)
            agreed += (values,)
        return agreed

    def gather(self, owned_matrices, token):
        """Collective 3: every layer's preconditioned matrix from its owners (nothing to gather when
        every rank owns every layer)."""
        if not self.gathers:
            return owned_matrices
        par = self.ops
        chunk = ops.depend(par.pack_preconditioned(owned_matrices), token)
        return par.unpack_preconditioned(par.gather_preconditioned(chunk))

    def share_traces(self, vector):
        """Collective 4: sum of [batch traces, owners' factor traces] over the ranks."""
        return self.ops.share(vector)

    def count_inversions(self, counts):
        """Add this step's per-layer inversion counts (int32 vector) to the record."""
        ops.assign_add(self.inversions, counts)
        return counts
