"""msrun worker: the MCCL (CPU) collectives the distributed engine relies on, and the ones it must avoid.

Launched by tests/distributed/test_mccl_collectives.py through distributed.py:run_msrun.
"""
import numpy as np

from distributed import run_worker, write_result


def _error(fn):
    try:
        fn()
        return None
    except RuntimeError as exc:
        # the message without MindSpore's "----" banners and call stacks
        lines = [line for line in str(exc).splitlines() if line.strip() and not line.startswith("---")]
        return " ".join(lines[:3]) if lines else repr(exc)


def main():
    import mindspore as ms
    from mindspore import nn, ops, Tensor, context
    from mindspore.communication import init, get_rank, get_group_size, create_group

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    init()
    rank, size = get_rank(), get_group_size()

    class Op(nn.Cell):
        def __init__(self, op):
            super().__init__()
            self.op = op

        def construct(self, x):
            return self.op(x)

    create_group("pair", list(range(size)))
    x = Tensor(np.arange(4, dtype=np.float32) + 10 * rank)
    out = {
        "rank": rank, "size": size,
        "device_target": ms.get_context("device_target"),
        "parallel_mode": context.get_auto_parallel_context("parallel_mode"),
        "allreduce": Op(ops.AllReduce())(x).asnumpy(),
        "allgather": Op(ops.AllGather())(x).asnumpy(),
        "subgroup_allreduce": Op(ops.AllReduce(group="pair"))(x).asnumpy(),
        "subgroup_allgather_error": _error(lambda: Op(ops.AllGather(group="pair"))(x).asnumpy()),
        "reducescatter_error": _error(lambda: Op(ops.ReduceScatter())(x).asnumpy()),
        "allreduce_max_error": _error(lambda: Op(ops.AllReduce(ops.ReduceOp.MAX))(x).asnumpy()),
    }
    write_result(out)


if __name__ == "__main__":
    run_worker(main)
