"""Data-parallel setup when the process was started by a launcher (msrun, a rank table, mpirun)."""
import os

__all__ = ["launched_distributed", "init_data_parallel"]


def launched_distributed():
    """True when a launcher started this process as one of several workers.

    msrun (and MindSpore's dynamic-cluster launch) sets ``MS_ROLE=MS_WORKER`` and ``MS_WORKER_NUM``;
    the Ascend rank-table scripts set ``RANK_SIZE``; OpenMPI's mpirun sets ``OMPI_COMM_WORLD_SIZE``.
    """
    if os.environ.get("MS_ROLE") == "MS_WORKER":
        return True
    for variable in ("MS_WORKER_NUM", "RANK_SIZE", "OMPI_COMM_WORLD_SIZE"):
        value = os.environ.get(variable, "")
        if value.isdigit() and int(value) > 1:
            return True
    return False


def init_data_parallel():
    """``mindspore.communication.init()`` and data-parallel gradient averaging; returns (rank, size)."""
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank, init
    init()
    rank, size = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                 device_num=size)
    return rank, size
