"""msrun worker: the golden cases of tests/golden_cases.py on this rank's half of every batch, under
DATA_PARALLEL. usage: golden_worker.py CASE [CASE ...]; reports every case's weights after 20 steps."""
import sys

from distributed import run_worker, write_result


def main(names):
    import mindspore as ms
    from mindspore.communication import init, get_rank, get_group_size
    from mindspore.context import ParallelMode
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    import golden_cases as gc
    rank, world = get_rank(), get_group_size()
    cases = {}
    for name in names:
        net, opt, step = gc.build(name)
        gc.train(step, 0, gc.STEPS, rank, world)
        cases[name] = {p.name: p.asnumpy().tolist() for p in net.trainable_params()}
    write_result({"rank": rank, "cases": cases})


if __name__ == "__main__":
    run_worker(main, sys.argv[1:])
